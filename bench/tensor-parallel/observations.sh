#!/usr/bin/env bash
# The planner's answers for the configurations users run (issue 10's "published
# observations"): Megatron-BERT 345M to a BERT with GPT-3 175B's dimensions on
# 8 nodes × 8 A100-40GB, tensor (model) parallel 1–32, ZeRO 0 and 3, micro-batch 1,
# no offload, the recomputation the search picks. Prints a Markdown table: the
# peak per GPU where a plan fits, else OOM with the least any choice needs.
# Usage: bench/tensor-parallel/observations.sh [--seq S]   (release build first)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/release/zeroplan
seq="${2:-512}"
[ -x "$bin" ] || cargo build --release
cell() {
  python3 -c '
import json, re, sys
out, err, code = sys.stdin.read(), sys.argv[1], int(sys.argv[2])
if code == 0:
    p = json.loads(out)
    peak, recompute = p["memory"]["peak_bytes"] / 2**30, p["strategy"]["recompute"]
    print(f"{peak:.1f} GiB ({recompute})")
elif "no strategy fits" in err:
    least = min(float(x) for x in re.findall(r"^  \S.*?\s([0-9.]+) GiB", err, re.M))
    print(f"OOM (≥ {least:.1f} GiB)")
elif "do not split evenly" in err:
    print("— (heads)")
else:
    lines = err.strip().splitlines()
    print("error: " + (lines[-1][:60] if lines else f"exit {code}"))
' "$1" "$2"
}
echo "| model | ZeRO | TP 1 | TP 2 | TP 4 | TP 8 | TP 16 | TP 32 |"
echo "|---|---|---|---|---|---|---|---|"
for model in megatron-bert-345m megatron-bert-3.9b bert-40b bert-175b; do
  for zero in 0 3; do
    row="| $model | $zero |"
    for tp in 1 2 4 8 16 32; do
      set +e
      out=$("$bin" compile "models/$model.ron" --gpus 64 --nodes 8 --gpu a100-40gb --seq "$seq" --global-batch $((64 / tp)) \
        --tp "$tp" --zero "$zero" --offload none --micro-batch 1 --json 2>/tmp/obs.err)
      code=$?
      set -e
      row="$row $(printf '%s' "$out" | cell "$(cat /tmp/obs.err)" "$code") |"
    done
    echo "$row"
  done
done
