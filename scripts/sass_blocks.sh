#!/bin/bash
# The SASS of one kernel source's sm_90 code, and the basic blocks of one kernel that hold a
# pattern, with their sizes: a static census of a kernel's hot loop without a GPU (ncu's Source
# page gives the executed counts on the device; scripts/gemv_experiments.sh STEPS=ncu).
#
#   scripts/sass_blocks.sh SOURCE KERNEL PATTERN [--show]
#   e.g. scripts/sass_blocks.sh quantized_matmul \
#          'gemv_mma_kernelINS0_9IntReaderILi4EEE13__nv_bfloat16S4_S4_' 'LDG.E.EF.128|HMMA'
#
# SOURCE is a kuiper/op/kernels/cuda/SOURCE.cu of the configured build/ (README's setup). The
# CUDA 13 toolkit here has no disassembler, and its cubins are not readable by older ones, so the
# PTX nvcc 13 writes is assembled again by the ptxas of CUDA 11.8 (PTX version lowered to 7.8)
# and disassembled by its nvdisasm: its register allocation and scheduling differ from CUDA 13's
# (11.8 copies 64-bit pointers into aligned register pairs before loads, for one), so counts
# between two trees compare to within a few instructions a block; measure anything smaller. One-time setup of $CUDA118 (default /tmp/nvt/x/usr/bin), from
# Debian's non-free archive:
#   add "contrib non-free" to Components in /etc/apt/sources.list.d/debian.sources, apt-get
#   update, then in /tmp/nvt: apt-get download nvidia-cuda-toolkit && dpkg-deb -x *.deb x
#   (and take the components out again).
# Registers and spills (ptxas 13 -v) go to /tmp/SOURCE.regs.
set -euo pipefail
src=$1 kernel=$2 pattern=$3 show=${4:-}
cuda118=${CUDA118:-/tmp/nvt/x/usr/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/build"
if [ -d ../.gpu/debs ]; then source ../scripts/deps.sh install ../.gpu/debs > /dev/null 2>&1; fi
obj=$(ninja -t targets all | grep -o "[^ ]*/$src.cu.o" | head -1)
cmd=$(ninja -t commands "$obj" | tail -1)
ptx=/tmp/$src.ptx
eval "$(echo "$cmd" | sed "s/--generate-code=arch=compute_90,code=\[compute_90,sm_90\]/-arch=compute_90/; s/ -c / -ptx /; s#-o [^ ]*\.o#-o $ptx#")"
ptxas -arch=sm_90 -O3 -v "$ptx" -o /tmp/$src.13.cubin > /tmp/$src.regs 2>&1
sed 's/^\.version [0-9.]*/.version 7.8/' "$ptx" > /tmp/$src.78.ptx
"$cuda118/ptxas" -arch=sm_90 -O3 /tmp/$src.78.ptx -o /tmp/$src.78.cubin > /dev/null 2>&1
"$cuda118/nvdisasm" -c /tmp/$src.78.cubin > /tmp/$src.sass
python3 - /tmp/$src.sass "$kernel" "$pattern" "$show" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split('\n')
want, pat, show = sys.argv[2], sys.argv[3], sys.argv[4] == '--show'
start = next(i for i, l in enumerate(lines) if l.startswith('.text.') and want in l)
end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith('.text.')), len(lines))
blocks, cur = [], []
for l in lines[start:end]:
    if re.match(r'^\s*\.L_x_\d+:', l):
        if cur: blocks.append(cur)
        cur = []
        continue
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', l)
    if m:
        cur.append(m.group(2).strip())
        if re.search(r'\bBRA\b|\bEXIT\b', m.group(2)):
            blocks.append(cur)
            cur = []
if cur: blocks.append(cur)
print(lines[start].rstrip(':'))
sizes = []
for b in blocks:
    if any(re.search(pat, x) for x in b):
        sizes.append(len(b))
        if show: print(f'block of {len(b)}:\n' + '\n'.join('    ' + x for x in b))
print('blocks holding the pattern, instructions each:', ' '.join(map(str, sizes)))
PY
grep -B1 -A3 "Function properties for.*$kernel" /tmp/$src.regs | grep -E "Used|spill" | sort | uniq -c
