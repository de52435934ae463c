#!/usr/bin/env bash
# The one-command GPU check (scripts/gpu_check.py): build, every `--ignored`
# GPU test, compute-sanitizer over a training step, CUDA against the CPU
# backend with peak memory against the plan, and the GPU benchmark; one
# Markdown report and one JSON file in OUT, going on past a failing step.
#
#   scripts/gpu-check.sh --out DIR              # everything (about 20 minutes)
#   scripts/gpu-check.sh --out DIR --quick      # the quick steps (under 8 minutes)
#   scripts/gpu-check.sh --out DIR --steps sanitizer,tiny-bert   # a subset, merged into DIR's report
#   scripts/gpu-check.sh --out DIR --dry-run    # no GPU: the commands, the logic on recorded outputs
#   scripts/gpu-check.sh --list                 # the steps
#
# On a lent device (10 minutes a call): `--quick` in one call, or the full
# check as two calls with `--steps` into the same OUT. See docs/gpu-check.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
