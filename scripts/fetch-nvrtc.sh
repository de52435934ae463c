#!/usr/bin/env bash
# Fetch NVRTC 13.0 (libnvrtc.so.13, libnvrtc-builtins.so.13.0), the CUDA 13.0
# headers (cuda_bf16.h, cuda_fp16.h, …) and ptxas 13.0 from NVIDIA's PyPI wheels
# into fixtures/nvrtc/{lib,include,bin} (git-ignored). NVRTC and ptxas are host
# programs: with them, backend-cuda's tests compile every generated kernel to PTX
# and assemble it for sm_90/sm_80 (registers, spills, occupancy) without a GPU.
# Tests that need them say SKIPPED when they are absent.
# 13.0 to match cudarc's `cuda-13000` feature and the CUDA 13.0 driver of the GPU machines.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/fixtures/nvrtc"
if [ -f "$dest/lib/libnvrtc.so.13" ] && [ -f "$dest/include/cuda_bf16.h" ] && [ -x "$dest/bin/ptxas" ]; then
  echo "nvrtc already in $dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
  "nvidia-cuda-nvrtc==13.0.88" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-nvcc==13.0.88"
mkdir -p "$tmp/unpacked"
for wheel in "$tmp"/*.whl; do
  python3 -m zipfile -e "$wheel" "$tmp/unpacked"
done
lib="$tmp/unpacked/nvidia/cu13/lib"
include="$tmp/unpacked/nvidia/cu13/include"
ptxas="$tmp/unpacked/nvidia/cu13/bin/ptxas"
for f in "$lib/libnvrtc.so.13" "$include/cuda_bf16.h" "$include/cuda_fp16.h" "$ptxas"; do
  [ -f "$f" ] || { echo "error: $(basename "$f") not found in the wheels" >&2; exit 1; }
done
rm -rf "$dest.partial"
mkdir -p "$dest.partial/lib"
cp "$lib"/libnvrtc.so.13 "$lib"/libnvrtc-builtins.so.13.* "$dest.partial/lib/"
cp -r "$include" "$dest.partial/include"
mkdir -p "$dest.partial/bin"
cp "$ptxas" "$dest.partial/bin/ptxas"
chmod +x "$dest.partial/bin/ptxas"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "nvrtc fetched into $dest"
