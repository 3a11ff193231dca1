#!/bin/bash
# Before/after speed in one device call: builds kuiper-bench from another source tree (BASE, e.g.
# the previous commit unpacked with `git archive REV | tar -x -C .dev/base`) and from this one,
# then runs the same decode, prefill and attention-alone benchmarks on both, alternating
# (base, this, base, this) so that drift of the GPU's clocks shows as disagreement between the
# two rounds rather than as a difference between the trees. Prints the tables last.
#
#   device run tool:  command "export OUT; bash scripts/bench_compare.sh .dev/base"
#                     carry [".gpu", ".dev/base"]
# NEW_BUILD names an already configured build directory of this tree to reuse (after
# scripts/gpu_test.sh: NEW_BUILD=build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: bench_compare.sh BASE_SOURCE_DIR}
OUT=${OUT:-build-gpu/compare}
mkdir -p "$OUT"
LOG=$OUT/compare.log
: > "$LOG"
if [ -d .gpu/debs ]; then source scripts/deps.sh install .gpu/debs; fi

build() {  # build SOURCE_DIR BUILD_DIR
  cmake -S "$1" -B "$2" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
    ninja -C "$2" kuiper-bench
}
NEW_BUILD=${NEW_BUILD:-build-new}
build "$BASE" build-base >> "$LOG" 2>&1 & base_pid=$!
build . "$NEW_BUILD" >> "$LOG" 2>&1 & new_pid=$!
wait $base_pid || { tail -n 30 "$LOG"; exit 1; }
wait $new_pid || { tail -n 30 "$LOG"; exit 1; }

run() {  # run NAME BUILD_DIR ROUND
  local bench="./$2/bin/kuiper-bench" out="$OUT/$1.$3.md"
  "$bench" --config models/qwen3-8b.json --dtype fp16 --attention flash2 --cuda-graph \
    --contexts 512,8192 --gen 64 --repeat 3 --prefill-lengths 512,4096 > "$out" 2>> "$LOG"
  "$bench" --attention-only --dtype fp16 --attention flash1,flash2 --cuda-graph --heads 32 \
    --kv-heads 8 --head-dim 128 --decode-kv-lens 4096,32768 --causal-lens 2048 >> "$out" 2>> "$LOG"
}
for round in 1 2; do
  run base build-base $round
  run new "$NEW_BUILD" $round
done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for round in 1 2; do
  for name in base new; do
    echo "=== $name, round $round"
    grep -E '^\|' "$OUT/$name.$round.md"
  done
done
