#!/bin/bash
# Every figure of docs/PERFORMANCE.md in one device command: builds kuiper-bench for Hopper, runs
# the attention microbenchmarks, the Qwen3-8B-shape model sweeps (decode tok/s vs context with
# the peak memory, prefill tok/s vs prompt length) for mha, flash1 and flash2, and the PyTorch /
# Hugging Face peers (scripts/peer_bench.py), all on the same GPU in the same call; prints the
# tables last (scripts/plot_perf.py --tables).
#
#   device run tool:  command "export OUT; bash scripts/perf_report.sh"   carry [".gpu"]
#   locally:          bash scripts/perf_report.sh  (results in build-gpu/perf)
#
# Then, on the machine the files came back to:
#   python3 scripts/plot_perf.py DIR --tables          # the doc's tables
#   python3 scripts/plot_perf.py DIR --png docs/perf.png
#
# Writes under $OUT (at most 8 files come back from the device): attention.json,
# model_flash2.json, model_flash1.json, model_mha.json, peer.json, tables.md, report.log.
# Steps run in that order under one time budget (PERF_BUDGET_S, default 540 s from the start,
# build included): a step that would run past it is cut by `timeout` and the report says so; the
# slow baseline (mha) runs last for that reason. Knobs: CONTEXTS, PREFILL_LENGTHS, GEN, REPEAT,
# KINDS.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/perf}
BUDGET=${PERF_BUDGET_S:-540}
CONTEXTS=${CONTEXTS:-512,4096,8192,16384,32768}
PREFILL_LENGTHS=${PREFILL_LENGTHS:-512,1024,2048,4096,8192,16384}
GEN=${GEN:-16}
REPEAT=${REPEAT:-3}
KINDS=${KINDS:-flash2 flash1 mha}
mkdir -p "$OUT"
LOG=$OUT/report.log
: > "$LOG"
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$LOG"; }
# Seconds left for a step, capped at $1 and keeping $2 seconds for the steps after it.
left() {
  local rest=$(( BUDGET - ($(date +%s) - start) - ${2:-0} ))
  [ "$rest" -gt "$1" ] && rest=$1
  [ "$rest" -lt 5 ] && rest=5
  echo "$rest"
}

if [ -d .gpu/debs ]; then
  # scripts/deps.sh's package list, as in scripts/gpu_test.sh (fill .gpu/debs with
  # `bash scripts/deps.sh download .gpu/debs`).
  source scripts/deps.sh install .gpu/debs
fi
log "build $BUILD"
{ cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release &&
  ninja -C "$BUILD" kuiper-bench; } >> "$LOG" 2>&1 || { tail -n 40 "$LOG"; exit 1; }
log "built"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$LOG"

bench="./$BUILD/bin/kuiper-bench"
status=0
step() {  # step NAME CAP RESERVE command... (RESERVE is for a 540 s budget; scaled to BUDGET)
  local name=$1 cap=$2 reserve=$(( $3 * BUDGET / 540 ))
  shift 3
  local t=$(left "$cap" "$reserve")
  log "$name (timeout ${t}s): $*"
  timeout "$t" "$@" >> "$LOG" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    status=1
    [ $rc -eq 124 ] && log "$name: cut at ${t}s (budget)" || log "$name: exit $rc"
  fi
  log "$name done"
}

step attention 90 300 "$bench" --attention-only --dtype fp16 --attention mha,flash1,flash2 --cuda-graph \
  --heads 32 --kv-heads 8 --head-dim 128 --decode-kv-lens 4096,32768 --causal-lens 2048,8192 \
  --json "$OUT/attention.json"

reserve_for() {  # seconds kept for what follows kind $1 (peers after flash2, then the others)
  case $1 in flash2) echo 260 ;; flash1) echo 80 ;; *) echo 0 ;; esac
}
for kind in $KINDS; do
  step "model $kind" 240 "$(reserve_for "$kind")" "$bench" --config models/qwen3-8b.json \
    --dtype fp16 --attention "$kind" --cuda-graph --contexts "$CONTEXTS" --gen "$GEN" \
    --repeat "$REPEAT" --prefill-lengths "$PREFILL_LENGTHS" --max-fill-s 100 --max-prefill-s 25 \
    --json "$OUT/model_$kind.json"
  if [ "$kind" = flash2 ]; then
    step peers 150 160 python3 scripts/peer_bench.py --config models/qwen3-8b.json \
      --json "$OUT/peer.json"
  fi
done

log "total $(( $(date +%s) - start ))s"
python3 scripts/plot_perf.py "$OUT" --tables > "$OUT/tables.md" 2>> "$LOG"
echo
cat "$OUT/tables.md"
exit $status
