#!/bin/bash
# Makes a runnable model without a download: regenerates a test fixture's checkpoint
# (test/data/fixtures/NAME, random weights from its deterministic recipe, the Qwen tokenizer from
# test/data/tokenizer/qwen3) and converts it to build/NAME.bin. Its answers are gibberish.
#   bash scripts/tiny_model.sh [qwen3-tiny|qwen2-tiny|qwen3-vl-tiny]
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-qwen3-tiny}
fixtures=test/data/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$fixtures/detweights.py" "$fixtures/$name" "$tmp/$name" >/dev/null
build/bin/kuiper-convert --hf "$tmp/$name" --out "build/$name.bin"
