#!/bin/bash
# A patch of docs/experiments/ against the tree, the two built side by side in one device call,
# then full-batch decode timed in turns (tree, patch, tree, ...), so that the spread between runs
# of one build shows beside the difference. Short table last.
#
#   device run tool:  command "export OUT; PATCH=prep-groups bash scripts/side_by_side.sh"
#                     carry [".gpu"]
#
# PATCH       the patch's name (docs/experiments/PATCH.patch), required
# ROUNDS      turns of each build (default 2)
# CONCURRENCY the full-batch sequences (default 64,256; Qwen3-8B fp16, 448 + 128 tokens)
# NCU         "REGEX:C:SKIP:TREE_GRID:PATCH_GRID ...": before the turns, the median Nsight Compute
#             time of the kernels matching REGEX whose grid has that many blocks, in eager steps
#             of C sequences after SKIP such launches (e.g. the attention input at 64 sequences:
#             "qk_norm_rope:64:600:768:256")
# BENCH_ARGS  more kuiper-bench flags for the full-batch runs (e.g. "--max-context 4096")
# TESTS       a gtest filter run on the patched build (TEST_TREE=1: on the tree), which then builds
#             every target (the CLI tests run the programs)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${PATCH:?name the patch: PATCH=NAME}"
OUT=${OUT:-/tmp/side_by_side}
mkdir -p "$OUT"
if [ -d .gpu/debs ]; then source scripts/deps.sh install .gpu/debs > /dev/null 2>&1; fi
P_DIR=/tmp/side_by_side_patched
rm -rf "$P_DIR" && mkdir -p "$P_DIR"
cp -r $(ls -A | grep -v '^build\|^\.git$\|^\.gpu$') "$P_DIR"/
(cd "$P_DIR" && git apply "docs/experiments/$PATCH.patch") || { echo "$PATCH does not apply"; exit 1; }
TEST_DIR=$([ "${TEST_TREE:-0}" = 1 ] && echo . || echo "$P_DIR")
for d in . "$P_DIR"; do
  (cd "$d" && cmake -S . -B build-sbs -G Ninja -DKUIPER_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    ninja -C build-sbs $([ "$d" = "$TEST_DIR" ] && [ -n "${TESTS:-}" ] || echo kuiper-bench) \
      > "$OUT/build_$(basename "$d").log" 2>&1 || tail -30 "$OUT/build_$(basename "$d").log") &
done
wait
T=./build-sbs/bin/kuiper-bench
P=$P_DIR/build-sbs/bin/kuiper-bench
ncu_median() {  # bench regex concurrency skip grid
  ncu --csv --print-units base --metrics gpu__time_duration.sum,launch__grid_size --cache-control none \
    --clock-control none --kernel-name "regex:$2" --launch-skip "$4" --launch-count 60 \
    "$1" --throughput --config models/qwen3-8b.json --dtype fp16 --no-cuda-graph --concurrency "$3" \
    --num-prompts "$3" --input-len 448 --output-len 200 --no-warmup 2> /dev/null > "$OUT/ncu.csv"
  python3 - "$5" "$OUT/ncu.csv" << 'PY'
import csv, statistics, sys
want, rows = int(sys.argv[1]), {}
for r in csv.DictReader([l for l in open(sys.argv[2]) if l.startswith('"')]):
    rows.setdefault(r["ID"], {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
t = [v["gpu__time_duration.sum"] / 1e3 for v in rows.values() if int(v.get("launch__grid_size", 0)) == want]
print(f"{statistics.median(t):.2f} us ({len(t)} launches)" if t else f"no launch of {want} blocks")
PY
}
full_batch() {
  "$1" --throughput --config models/qwen3-8b.json --dtype fp16 --cuda-graph \
    --concurrency "${CONCURRENCY:-64,256}" --input-len 448 --output-len 128 ${BENCH_ARGS:-} 2>&1 |
    grep '^| flash2' | cut -d'|' -f9 | tr -d ' ' | paste -sd' '
}
# Each row goes to $OUT/table.md as it comes, should the call run out of time.
row() { echo "$1" | tee -a "$OUT/table.md"; }
printf '| build | measurement | figures |\n|---|---|---|\n' > "$OUT/table.md"
for spec in ${NCU:-}; do
  IFS=: read -r regex c skip tree_grid patch_grid <<< "$spec"
  row "| tree | $regex at $c, Nsight Compute | $(ncu_median "$T" "$regex" "$c" "$skip" "$tree_grid") |"
  row "| $PATCH | $regex at $c, Nsight Compute | $(ncu_median "$P" "$regex" "$c" "$skip" "$patch_grid") |"
done
for r in $(seq "${ROUNDS:-2}"); do
  row "| tree | full-batch tok/s at ${CONCURRENCY:-64,256} ${BENCH_ARGS:-}| $(full_batch "$T") |"
  row "| $PATCH | full-batch tok/s at ${CONCURRENCY:-64,256} ${BENCH_ARGS:-}| $(full_batch "$P") |"
done
if [ -n "${TESTS:-}" ]; then
  (cd "$TEST_DIR" && ./build-sbs/bin/kuiper_tests --gtest_brief=1 --gtest_filter="$TESTS" > "$OUT/tests.log" 2>&1)
  row "$([ "$TEST_DIR" = . ] && echo tree || echo "$PATCH") tests: $(grep -m1 -o 'PASSED .*' "$OUT/tests.log" || echo "FAILED ($OUT/tests.log)")"
fi
