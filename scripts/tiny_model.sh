#!/bin/bash
# Makes a runnable model without a download: regenerates a shared test fixture's checkpoint
# (../shared/fixtures/NAME, weights from its deterministic recipe) and converts it to
# build/NAME.bin.   bash scripts/tiny_model.sh [qwen3-tiny|qwen2-tiny]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${KUIPER_SHARED_DIR:-../shared}
name=${1:-qwen3-tiny}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$shared/fixtures/detweights.py" "$shared/fixtures/$name" "$tmp/$name" >/dev/null
build/bin/kuiper-convert --hf "$tmp/$name" --out "build/$name.bin"
