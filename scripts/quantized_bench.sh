#!/bin/bash
# Issue 15's figures in one device command: one random Hugging Face checkpoint of CONFIG (bf16
# shards as the hub publishes them, .gpu/peers/make_random_hf.py), converted by kuiper-convert
# as it is and with --quantize for each of FORMATS, each timed by kuiper-bench (batch 1, CUDA
# graph, a 512-token prompt then 128 greedy tokens: decode tok/s and GB/s, prefill ms), then
# calm (.gpu/peers/calm_bench.sh) on the same checkpoint when CALM_DTYPES is not empty.
#
#   device run tool:  command "export OUT; bash scripts/quantized_bench.sh"   carry [".gpu"]
#
# Knobs: CONFIG (models/qwen2.5-7b.json), FORMATS (plain,fp8,int4,int8; F/L also quantizes lm_head
# in L: int4/int8 is --quantize int4 --quantize_lm_head int8), DTYPE (the activation dtype,
# bf16), CALM_DTYPES (fp16,fp8,gf4; empty skips calm), STEP_TIMEOUT_S (240).
# Writes under $OUT: build.log, hf.log, convert-*.log, bench-*.md, calm.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/quantized}
CONFIG=${CONFIG:-models/qwen2.5-7b.json}
FORMATS=${FORMATS:-plain,fp8,int4,int8}
DTYPE=${DTYPE:-bf16}
CALM_DTYPES=${CALM_DTYPES-fp16,fp8,gf4}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-240}
WORK=${WORK:-/tmp/kuiper-quantized}
mkdir -p "$OUT" "$WORK"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*"; }

if [ -d .gpu/debs ]; then
  source scripts/deps.sh install .gpu/debs
fi
log "build $BUILD"
{ cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release &&
  ninja -C "$BUILD" kuiper-bench kuiper-convert; } > "$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; exit 1; }
log "built"
hf=$WORK/hf
timeout "$STEP_TIMEOUT_S" python3 .gpu/peers/make_random_hf.py "$CONFIG" "$hf" .gpu/tokenizer/qwen3 \
  > "$OUT/hf.log" 2>&1 || { echo "random checkpoint failed"; tail -5 "$OUT/hf.log"; exit 1; }
log "checkpoint $(du -sh "$hf" | cut -f1)"

for f in ${FORMATS//,/ }; do
  model=$WORK/model-${f//\//-}.bin
  quantize=()
  [ "$f" != plain ] && quantize=(--quantize "${f%%/*}")
  [ "$f" != "${f#*/}" ] && quantize+=(--quantize_lm_head "${f#*/}")
  timeout "$STEP_TIMEOUT_S" "./$BUILD/bin/kuiper-convert" --hf "$hf" --out "$model" "${quantize[@]}" \
    > "$OUT/convert-${f//\//-}.log" 2>&1 || { echo "convert $f failed: $(tail -2 "$OUT/convert-${f//\//-}.log")"; continue; }
  log "converted $f: $(du -h "$model" | cut -f1)"
  timeout "$STEP_TIMEOUT_S" "./$BUILD/bin/kuiper-bench" --model "$model" --dtype "$DTYPE" \
    --prompt 512 --gen 128 --repeat 3 --max-context 1024 > "$OUT/bench-${f//\//-}.md" 2>&1 ||
    echo "bench $f failed: $(tail -2 "$OUT/bench-${f//\//-}.md")"
  rm -f "$model"
  log "timed $f"
done
if [ -n "$CALM_DTYPES" ]; then
  CALM_WORK=$WORK/calm timeout $((2 * STEP_TIMEOUT_S)) bash .gpu/peers/calm_bench.sh "$hf" \
    "$CALM_DTYPES" > "$OUT/calm.log" 2>&1
  log "calm"
fi
echo
for f in ${FORMATS//,/ }; do
  echo "== kuiper $f"
  grep -E "^\|" "$OUT/bench-${f//\//-}.md" 2>/dev/null | head -4
done
echo "== calm"
cat "$OUT/calm.log" 2>/dev/null
