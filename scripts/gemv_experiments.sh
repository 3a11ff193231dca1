#!/bin/bash
# The tensor-core GEMVs' experiment patches (docs/experiments/) against the tree, in one device
# call: builds kuiper-bench of this tree, times it, then for each variant applies its patches
# (NAME or NAME+NAME, from docs/experiments/NAME.patch) in place, rebuilds (only the GEMV objects
# change), times it and takes them off again. Figures: batch-1 decode of Qwen2.5-7B int4 (lm_head
# int4) and FP8, of Qwen3-8B int4 (lm_head int4), and full-batch decode of Qwen3-8B fp16 at 4 and
# 8 sequences. Short table last.
#
#   device run tool:  command "export OUT; bash scripts/gemv_experiments.sh two-chains held-x"
#                     carry [".gpu"]
# STEPS adds "peer" (the PyTorch batched peer at 8 sequences, scripts/peer_bench.py) and "ncu"
# (Nsight Compute's warp states of the tree's GEMV launches in two eager decode steps of
# Qwen2.5-7B int4, $OUT/ncu.txt; gate|up's stall reasons and SASS counters, ncu_stalls.txt and
# ncu_source.csv) and "trace" (docs/experiments/step-trace.patch on the tree: the launch timeline
# of one batch-1 int4 decode step inside its CUDA graph, its summary
# in the table; TRACE_MODELS lists the configs traced, default qwen2.5-7b (e.g. "qwen2.5-7b
# qwen3-8b"), each to $OUT/trace_M.txt; TRACE_WITH=NAME[+NAME] traces the tree with those patches applied, e.g.
# chunked-fold) after the variants; AGAIN=1 times the tree again after them (for
# drift). TESTS=FILTER also builds kuiper_tests with each variant applied and runs that gtest
# filter (e.g. 'Matmul*:Linear*:QuantizedMatmul*:TiledWeight*:QuantizedModel*:*QuantizedFixture*:
# CudaModel*:*BatchTest*', the GEMVs' and their models'; about 60 s to build, then the tests),
# its result at the end of the variant's row (qwen3_infer is built too: the fixtures' tests run it). BUILD reuses a configured build directory. About 85 s a variant after the first build
# (H200): three variants a call keep inside the device's 600 s.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-dev}
OUT=${OUT:-$BUILD/experiments}
STEPS=${STEPS:-}
mkdir -p "$OUT"
if [ -d .gpu/debs ]; then source scripts/deps.sh install .gpu/debs; fi
T0=$(date +%s)
# The device copies the checkout with its own times, older than objects a previous call on a warm
# machine built with a variant applied: touch what the patches change so the tree is rebuilt.
touch $(grep -h '^+++ b/' docs/experiments/*.patch | cut -c7- | sort -u | while read -r f; do
  [ -e "$f" ] && echo "$f"; done)
stamp() { echo "[t=$(($(date +%s) - T0))s] $*" >&2; }
cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 ||
  { tail -20 "$OUT/cmake.log"; exit 1; }
bench="./$BUILD/bin/kuiper-bench"
build() {
  ninja -C "$BUILD" kuiper-bench > "$OUT/build.log" 2>&1 || { grep -m5 -A10 error "$OUT/build.log"; return 1; }
}
decode() {  # decode tok/s of one batch-1 run
  "$bench" --config "models/$1.json" --dtype bf16 $2 --prompt 512 --gen 128 --repeat 1 --cuda-graph 2>&1 |
    grep '^| ' | tail -1 | cut -d'|' -f10 | tr -d ' '
}
batched() {  # full-batch decode tok/s at 4 and 8 sequences
  "$bench" --throughput --config models/qwen3-8b.json --dtype fp16 --cuda-graph --concurrency 4,8 \
    --input-len 448 --output-len 128 2>&1 | grep '^| flash2' | cut -d'|' -f9 | tr -d ' ' | paste -sd' '
}
measure() {  # a row of the table
  local i4a i4b f8a f8b q3a q3b
  i4a=$(decode qwen2.5-7b "--quantize int4 --quantize-lm-head int4")
  f8a=$(decode qwen2.5-7b "--quantize fp8")
  q3a=$(decode qwen3-8b "--quantize int4 --quantize-lm-head int4")
  i4b=$(decode qwen2.5-7b "--quantize int4 --quantize-lm-head int4")
  f8b=$(decode qwen2.5-7b "--quantize fp8")
  q3b=$(decode qwen3-8b "--quantize int4 --quantize-lm-head int4")
  echo "| $1 | $i4a, $i4b | $f8a, $f8b | $q3a, $q3b | $(batched) |"
}
patches() { echo "$1" | tr '+' ' '; }

table="| variant | int4 tok/s | FP8 tok/s | Qwen3-8B int4 tok/s | 4 / 8 seqs tok/s |
|---|---|---|---|---|"
build || exit 1
stamp built
table+=$'\n'"$(measure tree)"
echo "$table" > "$OUT/table.md"  # each row as it comes, should the call run out of time
for v in "$@"; do
  ok=1
  for p in $(patches "$v"); do git apply "docs/experiments/$p.patch" || { echo "$p does not apply"; ok=0; }; done
  if [ $ok = 1 ] && build; then
    stamp "built $v"
    row=$(measure "$v")
    if [ -n "${TESTS:-}" ]; then  # the variant's GPU tests of $TESTS (a gtest filter)
      log="$OUT/tests_$(echo "$v" | tr '+' '_').log"
      if ninja -C "$BUILD" kuiper_tests qwen3_infer > "$OUT/build_tests.log" 2>&1; then
        "./$BUILD/bin/kuiper_tests" --gtest_brief=1 --gtest_filter="$TESTS" > "$log" 2>&1 &&
          row+=" tests: $(grep -m1 -o 'PASSED .*' "$log")" || row+=" tests FAILED ($log)"
      else
        row+=" tests: not built"
      fi
      stamp "tested $v"
    fi
    table+=$'\n'"$row"
    echo "$row" >> "$OUT/table.md"
  else
    table+=$'\n'"| $v | (not built) | | | |"
  fi
  for p in $(patches "$v" | tr ' ' '\n' | tac); do  # last applied, first taken off
    git apply -R "docs/experiments/$p.patch" || echo "$p does not come off" >&2
  done
done
build || exit 1
if [ -n "${AGAIN:-}" ]; then table+=$'\n'"$(measure "tree again")"; fi
stamp measured
if [[ " $STEPS " == *" peer "* ]]; then
  python3 scripts/peer_bench.py --batched --config models/qwen3-8b.json --batch-sizes 8 --context 512 \
    > "$OUT/peer.log" 2>&1
  table+=$'\n\n'"peer at 8: $(grep '^| ' "$OUT/peer.log" | tail -1)"
fi
if [[ " $STEPS " == *" ncu "* ]]; then
  ncu --clock-control none --kernel-name regex:gemv_mma_kernel --launch-skip 400 --launch-count 8 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section SpeedOfLight --section SourceCounters "$bench" --config models/qwen2.5-7b.json --dtype bf16 --quantize int4 \
    --quantize-lm-head int4 --prompt 16 --gen 4 --repeat 1 > "$OUT/ncu.txt" 2>&1
  # gate|up's launch of a layer (the second tensor-core GEMV of four): warp stall reasons, per
  # issued instruction, and per SASS instruction (Source page) in ncu_source.csv.
  gate_up=(--kernel-name regex:gemv_mma_kernel --launch-skip 401 --launch-count 1)
  ncu --clock-control none "${gate_up[@]}" \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,dram__bytes_read.sum' \
    "$bench" --config models/qwen2.5-7b.json --dtype bf16 --quantize int4 --quantize-lm-head int4 \
    --prompt 16 --gen 4 --repeat 1 > "$OUT/ncu_stalls.txt" 2>&1
  ncu --clock-control none "${gate_up[@]}" --section SourceCounters --section WarpStateStats \
    --page source --csv --print-source sass \
    "$bench" --config models/qwen2.5-7b.json --dtype bf16 --quantize int4 --quantize-lm-head int4 \
    --prompt 16 --gen 4 --repeat 1 > "$OUT/ncu_source.csv" 2>&1
  table+=$'\n\n'"ncu: $(grep -cE 'gemv_mma_kernel' "$OUT/ncu.txt") kernel sections in ncu.txt"
  table+=$'\n'"$(grep -E 'stalled|inst_executed|duration|dram__bytes' "$OUT/ncu_stalls.txt" | sed 's/smsp__average_warps_issue_stalled_//' | head -30)"
fi
if [[ " $STEPS " == *" trace "* ]]; then
  # TRACE_WITH=NAME[+NAME]: those patches under step-trace (the tree's timeline when unset).
  for p in $(patches "${TRACE_WITH:-}"); do git apply "docs/experiments/$p.patch" || echo "$p does not apply"; done
  if git apply docs/experiments/step-trace.patch; then
    if build; then
      for m in ${TRACE_MODELS:-qwen2.5-7b}; do
        KUIPER_TRACE_FILE="$OUT/trace_$m.csv" "$bench" --config "models/$m.json" --dtype bf16 \
          --quantize int4 --quantize-lm-head int4 --prompt 512 --gen 128 --repeat 1 --cuda-graph \
          > "$OUT/trace_bench_$m.log" 2>&1
        python3 scripts/trace_step.py "$OUT/trace_$m.csv" > "$OUT/trace_$m.txt" 2>&1
        gzip -f "$OUT/trace_$m.csv.blocks"  # every block of every launch: megabytes
        # The step's tables (the attention's every-block table stays in trace_$m.txt).
        table+=$'\n\n'"trace ($m int4, batch 1${TRACE_WITH:+, with $TRACE_WITH}): $(sed -n '/^step:/,/^slot /p' "$OUT/trace_$m.txt" | grep -v '^slot ')"
      done
    else
      table+=$'\n\n'"trace: step-trace did not build"
    fi
    git apply -R docs/experiments/step-trace.patch || echo "step-trace does not come off" >&2
  else
    table+=$'\n\n'"trace: step-trace does not apply"
  fi
  for p in $(patches "${TRACE_WITH:-}" | tr ' ' '\n' | tac); do
    git apply -R "docs/experiments/$p.patch" || echo "$p does not come off" >&2
  done
  stamp traced
fi
echo "$table"
