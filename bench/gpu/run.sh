#!/usr/bin/env bash
# zeroplan against Hugging Face BertForMaskedLM in PyTorch eager (bf16 autocast,
# SDPA) and under torch.compile, MLM training at seq 128 in bf16, on one GPU,
# swept over per-GPU batches; bert-base, bert-large and mosaicbert-base (zeroplan
# only: Hugging Face has no MosaicBERT without the Hub). Appends a dated section
# to bench/RESULTS.md: tokens/s, MFU, peak memory, the ratios, plan fidelity,
# compile time, and the GLU merge against its cost model. See bench/RESULTS.md.
#
#   bench/gpu/run.sh [--out DIR] [--zeroplan BIN] [--nvrtc-dir DIR] [HARNESS OPTIONS]
#   bench/gpu/run.sh --models models/bert-base.ron --batches 32,64   # a subset
#   bench/gpu/run.sh --backend cpu --models models/tiny/tiny-bert.ron --batches 2,4 --seq 16 \
#       --warmup 1 --steps 3                                       # dry run, no GPU, no PyTorch
#   bench/gpu/run.sh --self-test                                   # the table code on recorded JSON
#
# HARNESS OPTIONS: `python3 bench/gpu/harness.py --help` (--models, --batches, --seq,
# --warmup, --steps, --sides, --no-glu, --gpu-profile, --timeout, --results).
#
# Needs: python3 with torch + transformers (the GPU machines' image has them);
# the zeroplan binary: built here by cargo when there is one, else --zeroplan BIN
# (a release build carried over); NVRTC 13 + CUDA headers: --nvrtc-dir, else
# fixtures/nvrtc, else the pip wheels beside torch (nvidia/cu13), else the CUDA
# toolkit, else scripts/fetch-nvrtc.sh (which needs PyPI); cuBLAS on the library
# path (the same wheels' lib/ or the toolkit's lib64 are added).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
command_line="bench/gpu/run.sh $*"

backend=cuda out="" zeroplan="${ZEROPLAN_BIN:-}" nvrtc="${ZEROPLAN_NVRTC_DIR:-}" results="" pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --self-test) exec "$py" -m unittest discover -s bench/gpu -p 'test_*.py' -v ;;
    --backend) backend="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --zeroplan) zeroplan="$2"; shift 2 ;;
    --nvrtc-dir) nvrtc="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exec "$py" bench/gpu/harness.py --help ;;
    *) pass+=("$1"); shift ;;
  esac
done
case "$backend" in
  cuda|cpu) ;;
  *) echo "error: --backend $backend: the benchmark runs on cuda, or cpu for a dry run" >&2; exit 2 ;;
esac
out="${out:-$root/target/gpubench/$(date +%Y%m%d-%H%M%S)}"
# Only a GPU run is a result: a dry run's section goes to OUT/results.md alone.
if [ -z "$results" ] && [ "$backend" = cuda ]; then results="$root/bench/RESULTS.md"; fi

if [ "$backend" = cuda ]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "error: no NVIDIA GPU answers nvidia-smi: run on a GPU machine, or pass --backend cpu for a dry run" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

# The binary: cargo's release build where cargo is, else a given or earlier one.
if [ -z "$zeroplan" ]; then
  zeroplan="${CARGO_TARGET_DIR:-$root/target}/release/zeroplan"
  if command -v cargo >/dev/null; then
    cargo build --release --bin zeroplan
  elif [ ! -x "$zeroplan" ]; then
    echo "error: no cargo here and no $zeroplan: build it where cargo is (cargo build --release)" \
      "and pass --zeroplan PATH (on a lent GPU machine: carry the binary in an ignored folder)" >&2
    exit 1
  fi
fi
[ -x "$zeroplan" ] || { echo "error: --zeroplan $zeroplan is not an executable" >&2; exit 1; }

# The pip wheels' CUDA libraries beside torch (nvidia/cu13/{lib,include}), if any.
wheels="$("$py" - <<'PY' 2>/dev/null || true
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
for base in nvidia.__path__:
    d = os.path.join(base, "cu13")
    if os.path.isfile(os.path.join(d, "lib", "libnvrtc.so.13")):
        print(d)
        break
PY
)"
if [ "$backend" = cuda ]; then
  if [ -z "$nvrtc" ]; then
    if [ -f fixtures/nvrtc/lib/libnvrtc.so.13 ]; then
      nvrtc="$root/fixtures/nvrtc"
    elif [ -n "$wheels" ] && [ -f "$wheels/include/cuda_bf16.h" ]; then
      nvrtc="$wheels"
    elif [ -f /usr/local/cuda/lib64/libnvrtc.so.13 ]; then
      export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
      scripts/fetch-nvrtc.sh
      nvrtc="$root/fixtures/nvrtc"
    fi
  fi
  # cuBLAS (libcublas.so.13, libcublasLt.so.13) for zeroplan's GEMMs.
  for lib in "$wheels/lib" /usr/local/cuda/lib64; do
    if [ -d "$lib" ]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  done
  echo "zeroplan: $zeroplan; NVRTC: ${nvrtc:-the library path}; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  "$zeroplan" devices
fi

args=(--zeroplan "$zeroplan" --backend "$backend" --out "$out" --command "$command_line")
if [ -n "$nvrtc" ]; then args+=(--nvrtc-dir "$nvrtc"); fi
if [ -n "$results" ]; then args+=(--results "$results"); fi
PYTHONUNBUFFERED=1 "$py" bench/gpu/harness.py "${args[@]}" "${pass[@]}"
echo "records: $out/results.jsonl; section: $out/results.md${results:+; appended to $results}" >&2
