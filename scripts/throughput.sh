#!/bin/bash
# Issue 13's throughput figures in one device command: builds kuiper-bench for Hopper, runs the
# PyTorch batched decode peer (scripts/peer_bench.py --batched: one CUDA graph over B sequences
# at context 512) and kuiper-bench --throughput (random prompts through the Engine at each
# concurrency) on the same GPU, and prints both tables last.
#
#   device run tool:  command "export OUT; bash scripts/throughput.sh"   carry [".gpu"]
#   locally:          bash scripts/throughput.sh   (results in build-gpu/throughput)
#
# Knobs: CONFIG (models/qwen3-8b.json), CONCURRENCY (1,8,64,256), NUM_PROMPTS (0: 4 x each
# concurrency), INPUT_LEN (512), OUTPUT_LEN (128), BENCH_FLAGS (more kuiper-bench flags, e.g.
# "--shared-prefix 2000 --len-jitter 0.2"), BATCH_SIZES (the peer's, 1,8,32,64,128,256),
# PEER=0 skips the peer. Each step is cut at STEP_TIMEOUT_S (default 280 s).
# Writes under $OUT: build.log, peer_batched.json, peer_batched.md, throughput.json,
# throughput.md, and last prints both side by side (scripts/plot_throughput.py --tables; its
# --png draws the curve from the fetched JSON: docs/throughput.png).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/throughput}
CONFIG=${CONFIG:-models/qwen3-8b.json}
CONCURRENCY=${CONCURRENCY:-1,8,64,256}
NUM_PROMPTS=${NUM_PROMPTS:-0}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-128}
BENCH_FLAGS=${BENCH_FLAGS:-}
BATCH_SIZES=${BATCH_SIZES:-1,8,32,64,128,256}
PEER=${PEER:-1}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-280}
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*"; }

if [ -d .gpu/debs ]; then
  # scripts/deps.sh's package list, as in scripts/gpu_test.sh.
  source scripts/deps.sh install .gpu/debs
fi
log "build $BUILD"
{ cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release &&
  ninja -C "$BUILD" kuiper-bench; } > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
log "built"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader

status=0
if [ "$PEER" != 0 ]; then
  log "peer: batch sizes $BATCH_SIZES"
  timeout "$STEP_TIMEOUT_S" python3 scripts/peer_bench.py --batched --config "$CONFIG" \
    --batch-sizes "$BATCH_SIZES" --context 512 --json "$OUT/peer_batched.json" \
    > "$OUT/peer_batched.md" || status=1
fi
log "kuiper-bench --throughput: concurrency $CONCURRENCY"
# shellcheck disable=SC2086  # BENCH_FLAGS is a list of flags
timeout "$STEP_TIMEOUT_S" "./$BUILD/bin/kuiper-bench" --throughput --config "$CONFIG" \
  --dtype fp16 --cuda-graph --concurrency "$CONCURRENCY" --num-prompts "$NUM_PROMPTS" \
  --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" $BENCH_FLAGS \
  --json "$OUT/throughput.json" > "$OUT/throughput.md" || status=1
log "done"
echo
[ "$PEER" != 0 ] && cat "$OUT/peer_batched.md"
echo
cat "$OUT/throughput.md"
echo
python3 scripts/plot_throughput.py "$OUT" --tables || status=1
exit $status
