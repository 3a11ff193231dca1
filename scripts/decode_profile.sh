#!/bin/bash
# Decode-path check and profile on the GPU machine, one call: build, the CUDA and golden tests,
# kuiper-bench on Qwen3-8B's shape (decode at 512 and 8192 tokens of context with and without
# programmatic dependent launch, prefill at 512 and 4096 tokens, peak memory of a 32768-token
# prompt) and an Nsight Compute per-kernel breakdown of a few eager decode steps. Short table
# last; logs in $OUT (or $BUILD/logs).
#
#   STEPS="test bench ncu memory prefill" scripts/decode_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
STEPS=${STEPS:-test bench ncu}
mkdir -p "$LOGS"
: > "$LOGS/bench.md"
if [ -d .gpu/debs ]; then
  source scripts/deps.sh install .gpu/debs
fi
cmake -S . -B "$BUILD" -G Ninja -DKUIPER_CUDA_ARCHS=90 > "$LOGS/cmake.log" 2>&1 &&
  ninja -C "$BUILD" > "$LOGS/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$LOGS/build.log" | head -60; exit 1; }
bench="./$BUILD/bin/kuiper-bench"
cfg="--config models/qwen3-8b.json --dtype fp16 --attention flash2"
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has test; then
  timeout 150 "./$BUILD/bin/kuiper_tests" --gtest_filter="${GTEST_FILTER:-Cuda*:*Golden*:ModelChunking*}" \
    > "$LOGS/test.log" 2>&1
  grep -E '^\[  FAILED  \]|^\[  PASSED  \]|tests? ran|SKIPPED \] [0-9]' "$LOGS/test.log" | sort -u | tail -25
  grep -B3 -A6 'Failure' "$LOGS/test.log" | head -80
fi
if has bench; then
  timeout 60 $bench $cfg --prompt 512 --gen 128 --cuda-graph --repeat 3 >> "$LOGS/bench.md" 2>&1
  timeout 90 $bench $cfg --cuda-graph --contexts 512,8192 --gen 64 >> "$LOGS/bench.md" 2>&1
fi
if has prefill; then
  timeout 90 $bench $cfg --cuda-graph --prefill-lengths 512,4096 >> "$LOGS/bench.md" 2>&1
fi
if has memory; then
  timeout 120 $bench $cfg --cuda-graph --contexts 32768 --fill-chunk 32768 --gen 8 \
    >> "$LOGS/bench.md" 2>&1
fi
if has ncu; then
  # Eager decode (no graph) so every kernel is its own launch; a 64-token prompt keeps the
  # prefill short. Kernel time only: launch gaps are not in these numbers.
  timeout 150 ncu --csv --metrics gpu__time_duration.sum,launch__grid_size --cache-control none \
    --clock-control none --print-units base -k 'regex:gemv|qk_norm|flash2|embedding|argmax|attention|decode|combine' \
    --launch-skip 200 --launch-count 700 \
    $bench $cfg --no-cuda-graph --prompt 64 --gen 8 --repeat 1 > "$LOGS/ncu.csv" 2> "$LOGS/ncu.err"
  python3 - "$LOGS/ncu.csv" > "$LOGS/ncu_summary.md" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
iname, imetric, ival = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
iid = head.index("ID")
kern = collections.defaultdict(dict)
for r in body:
    kern[r[iid]]["name"] = r[iname][:70]
    kern[r[iid]][r[imetric]] = r[ival].replace(",", "")
agg = collections.defaultdict(lambda: [0, 0.0])
for k in kern.values():
    key = (k["name"], k.get("launch__grid_size", "?"))
    agg[key][0] += 1
    agg[key][1] += float(k.get("gpu__time_duration.sum", 0))
print("| kernel | grid | count | mean us | total us |\n|---|---|---|---|---|")
for (n, g), (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {n} | {g} | {c} | {t / c / 1e3:.2f} | {t / 1e3:.1f} |")
PY
fi
echo
for f in ncu_summary bench; do
  [ -f "$LOGS/$f.md" ] && { echo "== $f"; grep -v '^$' "$LOGS/$f.md" | head -90; }
done
