#!/bin/bash
# The attention kernels on the lent GPU in one call: builds only the test and bench binaries,
# runs the CUDA attention tests, then the attention microbenchmarks (Qwen3-8B's attention shape:
# 32 query heads, 8 kv heads, head dim 128, fp16) for every kind, a sweep of the flash2 decode
# split count, and optionally (NCU=1) one Nsight Compute pass over the decode kernel. Logs go to
# $OUT (the device tool's output folder) or build-gpu/logs; the short tables are printed last.
#
#   bash scripts/attention_gpu.sh                       # tests + benchmarks
#   SPLITS="16 33 66" NCU=1 bash scripts/attention_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
if [ -d .gpu/debs ]; then
  source scripts/deps.sh install .gpu/debs
fi
cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 > "$LOGS/cmake.log" 2>&1 &&
  ninja -C "$BUILD" kuiper_tests kuiper-bench > "$LOGS/build.log" 2>&1 ||
  { tail -n 40 "$LOGS/cmake.log" "$LOGS/build.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv,noheader

"./$BUILD/bin/kuiper_tests" --gtest_filter="${GTEST_FILTER:-*Attention*}" > "$LOGS/test.log" 2>&1
tests_rc=$?
grep -E '^\[  FAILED  \]|^\[  PASSED  \]|tests? ran' "$LOGS/test.log" | sort -u | tail -25

bench="./$BUILD/bin/kuiper-bench --attention-only --dtype fp16 --heads 32 --kv-heads 8 --head-dim 128"
for shape in "4096 2048" "32768 8192"; do
  set -- $shape
  $bench --attention mha,flash1,flash2 --cuda-graph --kv-len "$1" --prefill-len "$2" \
    > "$LOGS/attention_$1.md" 2>&1
done
for s in ${SPLITS:-}; do
  $bench --attention flash2 --cuda-graph --decode-grid "$s" --decode-kv-lens 4096,32768 \
    > "$LOGS/splits_$s.md" 2>&1
done
if [ "${NCU:-0}" = 1 ]; then
  timeout 120 ncu --clock-control none -k regex:decode_tc -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    $bench --attention flash2 --cuda-graph --decode-kv-lens 32768 > "$LOGS/ncu_decode.txt" 2>&1
  grep -E "Duration|Throughput|Memory \[%\]|DRAM|Achieved Occupancy|Registers|Waves" \
    "$LOGS/ncu_decode.txt" | head -30
fi
echo
for f in "$LOGS"/attention_*.md "$LOGS"/splits_*.md; do
  [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E '^\|' "$f" | grep -v -- '---'; }
done
exit $tests_rc
