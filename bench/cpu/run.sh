#!/usr/bin/env bash
# zeroplan's host runtime against JAX on this CPU, same workload, same run:
# all-MiniLM-L6-v2's shape (6 layers, width 384), batch 32 x seq 128, f32,
# the encoder's forward and one MLM training step (forward, backward, AdamW).
# Installs jax[cpu] from PyPI into target/bench-py (once). Prints a Markdown
# table row per measurement to paste into bench/cpu/RESULTS.md.
#
#   bench/cpu/run.sh [RUNS]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
runs="${1:-5}"
py="$root/target/bench-py"
if ! PYTHONPATH="$py" python3 -c "import jax" 2>/dev/null; then
  python3 -m pip install --quiet --target "$py" "jax[cpu]"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cargo bench -q -p zeroplan-runtime --bench host -- "$runs" | grep '^{' > "$out/zeroplan.jsonl"
PYTHONPATH="$py" python3 bench/cpu/jax_bert.py "$runs" > "$out/jax.jsonl"
python3 - "$out" <<'PY'
import json, subprocess, sys, datetime
out = sys.argv[1]
z = {r["what"]: r for r in map(json.loads, open(f"{out}/zeroplan.jsonl"))}
j = {r["what"]: r for r in map(json.loads, open(f"{out}/jax.jsonl"))}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
for what in ["forward", "train_step"]:
    a, b = z[what], j[what]
    print(f"| {datetime.date.today()} | {commit} | {cpu}, {a['threads']} threads | {what} | "
          f"{a['seconds']*1e3:.1f} ms | {b['seconds']*1e3:.1f} ms (JAX {b['jax']}) | "
          f"{a['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | {b['seconds']/a['seconds']:.2f} |")
PY
