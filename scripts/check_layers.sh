#!/bin/bash
# The layering check: kuiper/ is built in layers, each on the ones before it,
#
#   base < tensor < op < model < tokenizer < vision < runtime
#
# and a file under kuiper/<layer>/ (.h .cpp .cu .cuh) may include only its own layer and those
# below. op/kernels/ is op's inside: other layers reach kernels through op's API. Every source
# file lives in a layer folder. Prints one line per violation (file:line and what is wrong) and
# exits 1 when there is any. CI (.ci/run) and ctest run it.
#   bash scripts/check_layers.sh [ROOT]      check ROOT/kuiper (default: this checkout)
#   bash scripts/check_layers.sh --self-test plant violations into copies of kuiper/; each must
#                                            be reported, and nothing else added
set -uo pipefail

layers=(base tensor op model tokenizer vision runtime)
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done

# Prints the violations under $1/kuiper; returns 1 when there are any.
check() {
  local root=$1 found=0 file rel own line text target
  while IFS= read -r -d '' file; do
    rel=${file#"$root"/}
    own=${rel#kuiper/}
    if [[ $own != */* ]]; then
      echo "$rel: not in a layer folder (kuiper/{${layers[*]}}/)"
      found=1
      continue
    fi
    own=${own%%/*}
    if [[ -z ${rank[$own]+x} ]]; then
      echo "$rel: kuiper/$own/ is not a layer (the layers: ${layers[*]})"
      found=1
      continue
    fi
    while IFS=: read -r line text; do
      [[ $text =~ include[[:space:]]*[\"\<]kuiper/([^/\">]*) ]]
      target=${BASH_REMATCH[1]}
      if [[ -z ${rank[$target]+x} ]]; then
        echo "$rel:$line: includes kuiper/$target/, which is not a layer"
        found=1
      elif ((rank[$target] > rank[$own])); then
        echo "$rel:$line: layer $own includes layer $target, which is above it"
        found=1
      elif [[ $own != op && $text =~ kuiper/op/kernels/ ]]; then
        echo "$rel:$line: layer $own includes op/kernels/ (op's inside); use op's API"
        found=1
      fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]kuiper/' "$file")
  done < <(find "$root/kuiper" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
  return $found
}

# Plants `line` at the top of `file` in a fresh copy of kuiper/ (or creates the file), runs the
# check, and requires it to fail with `expected` among the reports, every other report being one
# the pristine tree has too.
self_test_case() {
  local src=$1 file=$2 line=$3 expected=$4 baseline=$5 work out
  work=$(mktemp -d)
  cp -r "$src/kuiper" "$work/kuiper"
  mkdir -p "$(dirname "$work/$file")"
  { echo "$line"; cat "$work/$file" 2>/dev/null; } >"$work/$file.planted"
  mv "$work/$file.planted" "$work/$file"
  out=$(check "$work")
  local status=$?
  rm -rf "$work"
  if ((status == 0)); then
    echo "self-test FAILED: planting '$line' in $file passed the check"
    return 1
  fi
  if ! grep -qxF "$expected" <<<"$out"; then
    echo "self-test FAILED: planting '$line' in $file did not report: $expected"
    echo "$out"
    return 1
  fi
  local extra
  extra=$(grep -vxF "$expected" <<<"$out" | grep -vxF -f <(printf '%s\n' "$baseline") || true)
  if [[ -n $extra ]]; then
    echo "self-test FAILED: planting '$line' in $file also reported:"
    echo "$extra"
    return 1
  fi
  echo "self-test ok: $expected"
}

self_test() {
  local src=$1 baseline failed=0
  # The checkout's own violations (none once the layers are clean) are the baseline.
  baseline=$(check "$src")
  self_test_case "$src" kuiper/base/status.h '#include "kuiper/runtime/generator.h"' \
    'kuiper/base/status.h:1: layer base includes layer runtime, which is above it' "$baseline" || failed=1
  self_test_case "$src" kuiper/op/ops.cpp '#include <kuiper/model/model.h>' \
    'kuiper/op/ops.cpp:1: layer op includes layer model, which is above it' "$baseline" || failed=1
  self_test_case "$src" kuiper/runtime/stats.cpp '#include "kuiper/op/kernels/cpu/cpu_kernels.h"' \
    "kuiper/runtime/stats.cpp:1: layer runtime includes op/kernels/ (op's inside); use op's API" \
    "$baseline" || failed=1
  self_test_case "$src" kuiper/server/http.h '#pragma once' \
    'kuiper/server/http.h: kuiper/server/ is not a layer (the layers: base tensor op model tokenizer vision runtime)' \
    "$baseline" || failed=1
  self_test_case "$src" kuiper/tensor/tensor.h '#include "kuiper/sever/http.h"' \
    'kuiper/tensor/tensor.h:1: includes kuiper/sever/, which is not a layer' "$baseline" || failed=1
  # A same-layer and a downward include are fine.
  local work
  work=$(mktemp -d)
  cp -r "$src/kuiper" "$work/kuiper"
  sed -i '1i #include "kuiper/base/status.h"\n#include "kuiper/op/ops.h"' "$work/kuiper/model/config.h"
  if [[ $(check "$work") != "$baseline" ]]; then
    echo "self-test FAILED: downward includes in kuiper/model/config.h were reported"
    failed=1
  else
    echo "self-test ok: downward includes pass"
  fi
  rm -rf "$work"
  return $failed
}

repo=$(cd "$(dirname "$0")/.." && pwd)
if [[ ${1:-} == --self-test ]]; then
  self_test "$repo"
  exit
fi
check "${1:-$repo}"
