#!/usr/bin/env python3
"""Quantized Hugging Face checkpoints from a 16-bit one, in the layouts the releases publish.

Usage: python3 scripts/make_quantized_fixtures.py SRC_DIR OUT_DIR [FORMAT ...]
  FORMAT: awq, gptq-int4, gptq-int8, fp8 (default: all four). SRC_DIR is a Hugging Face
  checkpoint (config.json, tokenizer files, one model.safetensors of BF16 / F16 / F32 tensors,
  e.g. a tiny fixture written by test/data/fixtures/detweights.py); each format goes to
  OUT_DIR/FORMAT as a complete checkpoint for kuiper-convert. Plain python3, no numpy: meant for
  the tiny fixtures (the projections are quantized element by element; other tensors are copied
  as bytes).

The decoder's projections (q/k/v/o, gate/up/down of every layer) are quantized by round to
nearest, with no calibration, and written as each format's tools write them:

  awq        AutoAWQ GEMM: 4 bits, groups of 128, zero point. qweight int32 [K, N/8]: columns
             8j + ORDER[i] of row k in bits 4i of word [k, j], ORDER = 0 2 4 6 1 3 5 7;
             qzeros int32 [K/128, N/8] packed alike; scales fp16 [K/128, N]; w = (q - z) * s.
  gptq-intB  AutoGPTQ, checkpoint_format gptq (v1), sym=True, desc_act false, groups of 128:
             qweight int32 [K/p, N] (p = 32/B codes a word, row k in bits B*(k % p) of word
             [k/p, n]); qzeros int32 [K/128, N/p] packed along N holding z - 1 (z = 2^(B-1):
             7 or 127 stored); scales fp16 [K/128, N]; g_idx int32 [K] = k // 128.
  fp8        FineGrainedFP8 (transformers, Qwen3-*-FP8): weight F8_E4M3 [N, K] and
             weight_scale_inv F32 [ceil(N/128), ceil(K/128)], scale = amax / 448 per block.

Other tensors (embeddings, norms, biases, lm_head, a vision tower) are copied unchanged, and
config.json gets the format's quantization_config.
"""
import bisect
import json
import math
import os
import shutil
import struct
import sys

GROUP = 128
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        tensors[name] = (e["dtype"], e["shape"], data[base + begin:base + end])
    return tensors


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for raw in blobs:
            f.write(raw)


def floats(dtype, raw):
    if dtype == "F32":
        return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % (len(raw) // 2), raw))
    if dtype == "BF16":
        bits = struct.unpack("<%dH" % (len(raw) // 2), raw)
        return list(struct.unpack("<%df" % len(bits), struct.pack("<%dI" % len(bits),
                                                                  *(b << 16 for b in bits))))
    raise ValueError("not a 16- or 32-bit float tensor: " + dtype)


def fp16(x):
    """x rounded to fp16 (nearest, ties to even), as a float."""
    return struct.unpack("<e", struct.pack("<e", x))[0]


def pack_words(codes, bits):
    """32 // bits codes per little-endian int32 word, the first in the low bits."""
    per = 32 // bits
    words = []
    for i in range(0, len(codes), per):
        w = 0
        for j, c in enumerate(codes[i:i + per]):
            w |= c << (bits * j)
        words.append(w)
    return struct.pack("<%dI" % len(words), *words)


def quantize_groups(w, N, K, qmax, symmetric):
    """Round to nearest per row group of GROUP columns: codes q[n][k], zeros z[n][g] and fp16
    scales s[n][g], w ~ (q - z) * s. Symmetric (AutoGPTQ's sym): z = (qmax + 1) / 2 and
    s = 2 max|w| / qmax. Else (AWQ): lo = min(0, min w), hi = max(0, max w),
    s = (hi - lo) / qmax, z = round(-lo / s). Ties round to even (python's round)."""
    G = K // GROUP
    q = [[0] * K for _ in range(N)]
    z = [[0] * G for _ in range(N)]
    s = [[0.0] * G for _ in range(N)]
    for n in range(N):
        for g in range(G):
            x = w[n * K + g * GROUP:n * K + (g + 1) * GROUP]
            if symmetric:
                zero = (qmax + 1) // 2
                scale = fp16(2 * max(abs(v) for v in x) / qmax) or 1.0
            else:
                lo, hi = min(0.0, min(x)), max(0.0, max(x))
                scale = fp16((hi - lo) / qmax) or 1.0
                zero = min(max(round(-lo / scale), 0), qmax)
            z[n][g], s[n][g] = zero, scale
            for i, v in enumerate(x):
                q[n][g * GROUP + i] = min(max(round(v / scale) + zero, 0), qmax)
    return q, z, s


def awq(w, N, K):
    q, z, s = quantize_groups(w, N, K, 15, symmetric=False)
    G = K // GROUP
    qweight = [q[8 * j + AWQ_ORDER[i]][k] for k in range(K) for j in range(N // 8)
               for i in range(8)]
    qzeros = [z[8 * j + AWQ_ORDER[i]][g] for g in range(G) for j in range(N // 8)
              for i in range(8)]
    scales = [s[n][g] for g in range(G) for n in range(N)]
    return {"qweight": ("I32", [K, N // 8], pack_words(qweight, 4)),
            "qzeros": ("I32", [G, N // 8], pack_words(qzeros, 4)),
            "scales": ("F16", [G, N], struct.pack("<%de" % len(scales), *scales))}


def gptq(w, N, K, bits):
    qmax = (1 << bits) - 1
    per = 32 // bits
    q, z, s = quantize_groups(w, N, K, qmax, symmetric=True)
    G = K // GROUP
    # qweight packs along K: word [k / per, n] holds rows k..k+per-1 of column n.
    qweight = [q[n][kb * per + i] for kb in range(K // per) for n in range(N) for i in range(per)]
    qzeros = [(z[n][g] - 1) & qmax for g in range(G) for n in range(N)]  # v1: z - 1
    scales = [s[n][g] for g in range(G) for n in range(N)]
    g_idx = [k // GROUP for k in range(K)]
    return {"qweight": ("I32", [K // per, N], pack_words(qweight, bits)),
            "qzeros": ("I32", [G, N // per], pack_words(qzeros, bits)),
            "scales": ("F16", [G, N], struct.pack("<%de" % len(scales), *scales)),
            "g_idx": ("I32", [K], struct.pack("<%di" % K, *g_idx))}


def e4m3_table():
    """(value, code) of the non-negative finite E4M3 codes, ascending."""
    table = []
    for code in range(0x7f):  # 0x7f is NaN
        e, m = code >> 3, code & 7
        value = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        table.append((value, code))
    return table


E4M3 = e4m3_table()
E4M3_VALUES = [v for v, _ in E4M3]


def to_e4m3(x):
    """The nearest E4M3 code (ties to the even code), saturating at 448."""
    sign = 0x80 if x < 0 or (x == 0 and math.copysign(1, x) < 0) else 0
    a = min(abs(x), 448.0)
    i = bisect.bisect_left(E4M3_VALUES, a)
    if i == len(E4M3_VALUES):
        i -= 1
    elif i > 0:
        lo, hi = E4M3[i - 1], E4M3[i]
        if a - lo[0] < hi[0] - a or (a - lo[0] == hi[0] - a and lo[1] % 2 == 0):
            i -= 1
    return sign | E4M3[i][1]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fp8(w, N, K):
    B = GROUP
    rows, cols = -(-N // B), -(-K // B)
    scales = [1.0] * (rows * cols)
    codes = bytearray(N * K)
    for br in range(rows):
        for bc in range(cols):
            block = [(n, k) for n in range(br * B, min(N, br * B + B))
                     for k in range(bc * B, min(K, bc * B + B))]
            amax = max(abs(w[n * K + k]) for n, k in block)
            scale = f32(amax / 448.0) if amax > 0 else 1.0
            scales[br * cols + bc] = scale
            for n, k in block:
                codes[n * K + k] = to_e4m3(f32(w[n * K + k] / scale))
    return {"weight": ("F8_E4M3", [N, K], bytes(codes)),
            "weight_scale_inv": ("F32", [rows, cols], struct.pack("<%df" % len(scales), *scales))}


CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None},
    "gptq-int4": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                  "sym": True, "damp_percent": 0.01, "static_groups": False,
                  "true_sequential": True, "checkpoint_format": "gptq"},
    "gptq-int8": {"quant_method": "gptq", "bits": 8, "group_size": GROUP, "desc_act": False,
                  "sym": True, "damp_percent": 0.01, "static_groups": False,
                  "true_sequential": True, "checkpoint_format": "gptq"},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [GROUP, GROUP]},
}


def is_projection(name):
    return ".layers." in name and "visual" not in name and \
        any(name.endswith(p + ".weight") for p in PROJECTIONS)


def convert(src, out, fmt):
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    result = {}
    for name, (dtype, shape, raw) in tensors.items():
        if not is_projection(name):
            result[name] = (dtype, shape, raw)
            continue
        N, K = shape
        w = floats(dtype, raw)
        module = name[:-len(".weight")]
        if fmt == "awq":
            parts = awq(w, N, K)
        elif fmt.startswith("gptq"):
            parts = gptq(w, N, K, 4 if fmt == "gptq-int4" else 8)
        else:
            parts = fp8(w, N, K)
        for suffix, tensor in parts.items():
            result[module + "." + suffix] = tensor
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors" and f != "config.json" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = CONFIGS[fmt]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(out, "model.safetensors"), result)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    formats = sys.argv[3:] or list(CONFIGS)
    for fmt in formats:
        if fmt not in CONFIGS:
            sys.exit("unknown format %s (awq, gptq-int4, gptq-int8, fp8)" % fmt)
        convert(src, os.path.join(out, fmt), fmt)
        print("wrote", os.path.join(out, fmt))


if __name__ == "__main__":
    main()
