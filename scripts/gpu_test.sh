#!/bin/bash
# Builds Kuiper for Hopper, runs the tests, then a short benchmark; prints a short table last.
#
#   scripts/gpu_test.sh              # all tests
#   GTEST_FILTER='Cuda*' scripts/gpu_test.sh
#   SANITIZE=memcheck GTEST_FILTER='Cuda*:Matmul*' scripts/gpu_test.sh
#   SANITIZE=racecheck GTEST_FILTER='CudaAttention*' scripts/gpu_test.sh
#
# SANITIZE=memcheck|racecheck|initcheck|synccheck runs the tests under that compute-sanitizer tool
# instead (no benchmark; the child programs of the CLI tests are checked too); any error it
# reports fails the script. The tools slow kernels 10-100x (racecheck most), so narrow the run
# with GTEST_FILTER. memcheck cannot see an overrun into the slack of a caching allocator's block
# (kuiper/base/cuda_allocator.cu rounds sizes up), only past the block.
#
# On the lent GPU machine (no package registry) the build dependencies travel as .deb files in
# .gpu/debs, picked up when present; the test data is the repository's own (test/data). Logs go
# to $OUT (the device tool's output folder) or build-gpu/logs.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
if [ -d .gpu/debs ]; then
  # scripts/deps.sh's package list (libedit and libjpeg-turbo included); fill .gpu/debs with
  # `bash scripts/deps.sh download .gpu/debs`.
  source scripts/deps.sh install .gpu/debs
fi

cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 > "$LOGS/cmake.log" 2>&1 &&
  ninja -C "$BUILD" > "$LOGS/build.log" 2>&1 || { tail -n 40 "$LOGS/cmake.log" "$LOGS/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

tests=("./$BUILD/bin/kuiper_tests" "--gtest_filter=${GTEST_FILTER:-*}")
if [ -n "${SANITIZE:-}" ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  log="$LOGS/$SANITIZE.log"
  # --error-exitcode: an error fails the run even where the test itself passes; a child program
  # that never touches CUDA (a CLI test on the CPU) is no error.
  "$sanitizer" --tool "$SANITIZE" --error-exitcode 1 --target-processes all \
    --require-cuda-init no --print-limit 100 "${tests[@]}" > "$log" 2>&1
  rc=$?
  grep -E '^\[  FAILED  \]|^\[  PASSED  \]|tests? ran|SKIPPED \] [0-9]|ERROR SUMMARY|RACECHECK SUMMARY' \
    "$log" | sort | uniq -c | tail -25
  exit $rc
fi

"${tests[@]}" > "$LOGS/test.log" 2>&1
tests_rc=$?
grep -E '^\[  FAILED  \]|^\[  PASSED  \]|tests? ran|SKIPPED \] [0-9]' "$LOGS/test.log" | sort -u | tail -25

bench="./$BUILD/bin/kuiper-bench"
"$bench" --config models/qwen3-8b.json --dtype fp16 --prompt 512 --gen 128 \
  --attention mha,flash1,flash2 --cuda-graph --repeat 3 > "$LOGS/bench.md" 2>&1
"$bench" --attention-only --attention mha,flash1,flash2 --heads 32 --kv-heads 8 --head-dim 128 \
  --kv-len 4096 --prefill-len 512 > "$LOGS/attention.md" 2>&1
echo
cat "$LOGS/attention.md"
echo
cat "$LOGS/bench.md"
exit $tests_rc
