#!/bin/bash
# The flash2 decode attention's experiment patches (docs/experiments/) against the tree, in one
# device call: builds kuiper-bench of this tree and times it, then for each variant applies its
# patches (NAME or NAME+NAME, docs/experiments/NAME.patch) in place, rebuilds, times it once for
# each setting SWEEP lists (environment assignments, e.g. "KUIPER_X_UNIT_RUN=0
# KUIPER_X_UNIT_RUN=5"; unset: once) and takes them off again. Short table last.
#
#   device run tool:  command "export OUT; bash scripts/attention_experiments.sh unit-run"
#                     carry [".gpu"]
#
# Figures (us for the attention alone, tok/s otherwise):
# - the paged decode alone at 1, 8, 64 and 256 sequences of 512 keys (32 q / 8 kv heads, d 128);
# - the same bytes and units as 64 sequences, laid out with one kv head a cache row (512
#   sequences, 4 q / 1 kv head): each unit's keys are then contiguous in the pool, and the gap to
#   the first figure is what the row layout (a unit's 256 bytes every kv_heads * 256) costs;
# - one sequence of 32768 keys (the contiguous form);
# - Qwen3-8B fp16 full-batch decode at 8, 64 and 256 sequences of 448 + 128 tokens;
# - Qwen3-8B int4 (int4 lm_head) batch-1 decode at 512 + 128.
# TESTS=FILTER also builds kuiper_tests with each variant applied and runs that gtest filter under
# TEST_ENV (environment assignments), e.g. TESTS='*Attention*:Fixtures/*:*Paged*:*BatchTest*'.
# About 60 s a measurement and 40 s a rebuild (H200).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-dev}
OUT=${OUT:-$BUILD/experiments}
mkdir -p "$OUT"
if [ -d .gpu/debs ]; then source scripts/deps.sh install .gpu/debs; fi
T0=$(date +%s)
stamp() { echo "[t=$(($(date +%s) - T0))s] $*" >&2; }
# Objects a previous call on a warm machine built with a variant applied are newer than the
# device's copy of the checkout: touch what the patches change so the tree is rebuilt.
touch $(grep -h '^+++ b/' docs/experiments/*.patch | cut -c7- | sort -u | while read -r f; do
  [ -e "$f" ] && echo "$f"; done)
cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 ||
  { tail -20 "$OUT/cmake.log"; exit 1; }
bench="./$BUILD/bin/kuiper-bench"
build() {
  ninja -C "$BUILD" kuiper-bench > "$OUT/build.log" 2>&1 || { grep -m5 -A10 error "$OUT/build.log"; return 1; }
}
alone() {  # us of each case of one --attention-only call
  "$bench" --attention-only --attention flash2 --dtype fp16 --head-dim 128 "$@" 2>&1 |
    grep '^| flash2' | awk -F'|' '{printf "%s ", $10}'
}
measure() {  # a row of the table
  local paged rows long batched b1
  paged=$(alone --heads 32 --kv-heads 8 --decode-batch 1,8,64,256 --kv-len 512)
  rows=$(alone --heads 4 --kv-heads 1 --decode-batch 512 --kv-len 512)
  long=$(alone --heads 32 --kv-heads 8 --decode-kv-lens 32768)
  batched=$("$bench" --throughput --config models/qwen3-8b.json --dtype fp16 --cuda-graph \
    --concurrency 8,64,256 --input-len 448 --output-len 128 2>&1 | grep '^| flash2' |
    cut -d'|' -f9 | tr -d ' ' | paste -sd' ')
  b1=$("$bench" --config models/qwen3-8b.json --dtype bf16 --quantize int4 --quantize-lm-head int4 \
    --prompt 512 --gen 128 --repeat 1 --cuda-graph 2>&1 | grep '^| ' | tail -1 | cut -d'|' -f10 | tr -d ' ')
  echo "| $1 | $paged | $rows | $long | $batched | $b1 |"
}
patches() { echo "$1" | tr '+' ' '; }

table="| variant | paged decode us, 1 / 8 / 64 / 256 seqs | 512 seqs x 1 kv head us | 32768 keys us | full-batch tok/s 8 / 64 / 256 | Qwen3-8B int4 batch 1 |
|---|---|---|---|---|---|"
build || exit 1
stamp built
table+=$'\n'"$(measure tree)"
echo "$table" > "$OUT/table.md"  # each row as it comes, should the call run out of time
for v in "$@"; do
  ok=1
  for p in $(patches "$v"); do git apply "docs/experiments/$p.patch" || { echo "$p does not apply"; ok=0; }; done
  if [ $ok = 1 ] && build; then
    stamp "built $v"
    for setting in ${SWEEP:-NONE}; do
      if [ "$setting" = NONE ]; then
        row=$(measure "$v")
      else
        row=$(export "$setting"; measure "$v $setting")  # a subshell: the setting ends with it
      fi
      table+=$'\n'"$row"
      echo "$row" >> "$OUT/table.md"
      stamp "measured $v $setting"
    done
    if [ -n "${TESTS:-}" ]; then
      log="$OUT/tests_$(echo "$v" | tr '+' '_').log"
      if ninja -C "$BUILD" kuiper_tests qwen3_infer > "$OUT/build_tests.log" 2>&1; then
        env ${TEST_ENV:-} "./$BUILD/bin/kuiper_tests" --gtest_brief=1 --gtest_filter="$TESTS" > "$log" 2>&1 &&
          table+=$'\n'"$v tests (${TEST_ENV:-}): $(grep -m1 -o 'PASSED .*' "$log")" ||
          table+=$'\n'"$v tests (${TEST_ENV:-}) FAILED ($log)"
      else
        table+=$'\n'"$v tests: not built"
      fi
      stamp "tested $v"
    fi
  else
    table+=$'\n'"| $v | (not built) | | | | |"
  fi
  for p in $(patches "$v" | tr ' ' '\n' | tac); do  # last applied, first taken off
    git apply -R "docs/experiments/$p.patch" || echo "$p does not come off" >&2
  done
done
echo "$table"
