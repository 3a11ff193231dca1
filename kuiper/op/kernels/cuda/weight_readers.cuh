// How the CUDA kernels read a weight (kuiper/op/weight.h) 16 bytes at a time: one reader per
// format, each giving a 16-byte chunk of a row as kVec weights and the chunk's scale. The GEMV
// (gemv.cuh) and the dequantize kernel (quantized_matmul.cu) are written once over the reader.
//
// A reader's interface (all __device__ but vectorizable):
//   kVec                      weights in one 16-byte chunk
//   Row row(n)                row n: its chunks and its scales
//   chunk(row, c)             where chunk c of the row is (row-major, or tiled: weight.h)
//   Meta meta(row, c)         what chunk c needs besides its bytes (its scale and zero), loaded
//                             with the chunk
//   piece(raw, meta, p, v)    weights 4p .. 4p + 3 of the chunk before the scale: the value,
//                             the fp8 value, or q - zero, each exact in fp32 (p a constant
//                             once unrolled; the GEMV meets x 16 bytes, 4 weights, at a time)
//   scale(meta)               the chunk's scale (1 for plain weights), so that
//                             w = unscaled * scale, as the CPU reference forms it
//   at(row, k)                column k's weight (for rows that do not split into chunks)
//   vectorizable(view)        whether the chunks apply: 16-byte aligned rows, K and the scale
//                             block's columns multiples of kVec
// so a dot product takes one multiply by the scale per chunk, not per weight. For the
// tensor-core GEMV (gemv_mma.cuh), which feeds mma.sync 16-bit pairs, each reader also gives
//   pair<T16>(raw, meta, p)   weights pair_col(p, 0) (low half) and pair_col(p, 1) of the chunk
//                             as two T16 in one register (fp16 where kHalfPairs, else fp16 or
//                             bf16, the activation type), before the scale and, where
//                             kBiasedPairs, plus pair_offset(p) (which the GEMV takes off once a
//                             super-step, times the sum of x, as it does the zero,
//                             pair_zero(meta)); exact, 0 <= p < kVec / 2 (the quantized readers)
// where the pairing is whichever the format unpacks in the fewest instructions: the product
// sums over a chunk's columns in any order, so x is staged in the same pair order.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/weight.h"

namespace kuiper::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A weight's pointers and layout, as kernels take it by value.
struct WeightView {
  const void* values;
  int64_t row_bytes;  // bytes from one row of values to the next
  const void* scales;
  const void* zeros;
  int64_t scale_cols;
  int64_t block_rows, block_cols;
  int64_t K;
  bool tiled;  // values in the tiled layout (weight.h): the integer readers only
};

inline WeightView weight_view(const op::Weight& w) {
  WeightView v{};
  v.values = w.values.raw();
  v.row_bytes = w.values.dim(1) * static_cast<int64_t>(dtype_size(w.values.dtype()));
  v.scales = w.scales.defined() ? w.scales.raw() : nullptr;
  v.zeros = w.zeros.defined() ? w.zeros.raw() : nullptr;
  v.scale_cols = w.scales.defined() ? w.scales.dim(1) : 0;
  v.block_rows = w.block_rows;
  v.block_cols = w.block_cols;
  v.K = w.cols();
  v.tiled = w.tiled;
  return v;
}

// Where x sits in shared memory. The GEMV stages x as fp32 and lane l reads chunk c = l + 32 u of
// it, kVec floats, as kVec / 4 16-byte pieces. Stored in order, the 8 lanes of one LDS.128 phase
// would meet in the same banks whenever a chunk spans more than 32 bytes: 2-way for 16-bit
// weights, 4-way for 8-bit, 8-way for 4-bit, which capped the FP8 GEMV at 40% of copy bandwidth
// and int4 at 14% (H100, 4096 x 4096). So piece p of chunk c is stored at p ^ swizzle(c) within
// its chunk, which gives the 8 lanes 8 distinct 16-byte bank groups (with chunk_dot2's shared x
// reads: FP8 72%, int4 39%, and the plain bf16 GEMV 9.4 -> 7.9 us, that one timed warm in L2).
template <int kVec>
struct XsLayout {
  static constexpr int kPieces = kVec / 4;
  // Consecutive chunks that begin in distinct bank groups.
  static constexpr int kChunksPerBankRow = kVec >= 32 ? 1 : 32 / kVec;
  static __device__ __forceinline__ int swizzle(int64_t c) {
    return static_cast<int>((c / kChunksPerBankRow) % kPieces);
  }
  // Where piece j (x[4j, 4j + 4)) is stored, in pieces.
  static __device__ __forceinline__ int64_t piece(int64_t j) {
    const int64_t c = j / kPieces;
    return c * kPieces + ((j % kPieces) ^ swizzle(c));
  }
};

// Two floats as a T16 pair (the low half first), rounded to nearest.
template <typename T16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T16, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// (a & mask) | bits in one LOP3 (the compiler splits a mask-and-or with two constants into two).
template <uint32_t kMask, uint32_t kBits>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "n"(kMask), "n"(kBits));
  return d;
}

// a - b on two T16 pairs.
template <typename T16>
__device__ __forceinline__ uint32_t sub_pair(uint32_t a, uint32_t b) {
  if constexpr (std::is_same_v<T16, __half>) {
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&a),
                              *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&d);
  } else {
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                     *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&d);
  }
}

// The chunk's kVec weights before the scale.
template <typename Reader>
__device__ __forceinline__ void unscaled(uint4 raw, typename Reader::Meta m,
                                         float (&out)[Reader::kVec]) {
#pragma unroll
  for (int p = 0; p < Reader::kVec / 4; ++p) {
    float v[4];
    Reader::piece(raw, m, p, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[4 * p + j] = v[j];
  }
}

// Chunk c of two weight rows (a warp's pair) times x (staged per XsLayout<kVec>) into out[0, 1]:
// each 16 bytes of x is read from shared memory once for both rows, and each row's weights are
// widened 4 at a time as they are used.
template <typename Reader>
__device__ __forceinline__ void chunk_dot2(uint4 raw0, typename Reader::Meta m0, uint4 raw1,
                                           typename Reader::Meta m1, const float* xs, int64_t c,
                                           float (&out)[2]) {
  using Layout = XsLayout<Reader::kVec>;
  const float4* pieces = reinterpret_cast<const float4*>(xs) + c * Layout::kPieces;
  const int sw = Layout::swizzle(c);
  float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // two chains a row: fewer dependent adds
#pragma unroll
  for (int p = 0; p < Layout::kPieces; ++p) {
    const float4 x = pieces[p ^ sw];
    float v[2][4];
    Reader::piece(raw0, m0, p, v[0]);
    Reader::piece(raw1, m1, p, v[1]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      s[r][0] += v[r][0] * x.x;
      s[r][1] += v[r][1] * x.y;
      s[r][0] += v[r][2] * x.z;
      s[r][1] += v[r][3] * x.w;
    }
  }
  out[0] = (s[0][0] + s[0][1]) * Reader::scale(m0);
  out[1] = (s[1][0] + s[1][1]) * Reader::scale(m1);
}

// Word i (bytes 4i .. 4i + 3) of a chunk.
__device__ __forceinline__ uint32_t chunk_word(const uint4& raw, int i) {
  return i == 0 ? raw.x : i == 1 ? raw.y : i == 2 ? raw.z : raw.w;
}

// Chunk c's scale index within its row of scales, c / chunks_per_block, as one multiply-high by
// ceil(2^32 / chunks_per_block): exact while c * chunks_per_block < 2^32, which rows of fewer than
// 2^16 chunks (kMaxChunkedColumns) keep. (A run-time choice between a shift and a division
// compiled to both, the division predicated off but still issued: about 25 instructions a chunk.)
constexpr int64_t kMaxChunkedColumns = int64_t{1} << 19;
struct ChunkBlocks {
  uint32_t mul;  // 0 for one chunk a block
  __device__ explicit ChunkBlocks(int64_t chunks_per_block)
      : mul(chunks_per_block == 1
                ? 0u
                : 0xffffffffu / static_cast<uint32_t>(chunks_per_block) + 1u) {}
  __device__ __forceinline__ uint32_t of(int64_t c) const {
    const uint32_t cc = static_cast<uint32_t>(c);
    return mul == 0u ? cc : __umulhi(cc, mul);
  }
};

template <typename TW>
struct PlainReader {
  using Weight = TW;
  static constexpr int kVec = 16 / sizeof(TW);
  struct Meta {};
  struct Row {
    const uint4* chunks;
    const TW* w;
  };
  const WeightView v;
  __device__ explicit PlainReader(const WeightView& view) : v(view) {}
  __device__ Row row(int64_t n) const {
    const char* p = static_cast<const char*>(v.values) + n * v.row_bytes;
    return {reinterpret_cast<const uint4*>(p), reinterpret_cast<const TW*>(p)};
  }
  __device__ Meta meta(const Row&, int64_t) const { return {}; }
  static __device__ __forceinline__ const uint4* chunk(const Row& r, int64_t c) {
    return r.chunks + c;
  }
  static __device__ __forceinline__ void piece(uint4 raw, Meta, int p, float (&v)[4]) {
    const TW* w = reinterpret_cast<const TW*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = to_float(w[4 * p + j]);
  }
  static __device__ __forceinline__ float scale(Meta) { return 1.0f; }
  __device__ float at(const Row& r, int64_t k) const { return to_float(r.w[k]); }
  static bool vectorizable(const WeightView& view) {
    return view.K % kVec == 0 && view.row_bytes % 16 == 0 && aligned16(view.values);
  }
  // The tensor-core product's pairs (gemv_rows_mma.cuh, multiplying TW as itself): word p of the
  // chunk, columns 2p and 2p + 1, as stored.
  static constexpr bool kBiasedPairs = false;
  static constexpr int pair_col(int p, int h) { return 2 * p + h; }
};

// kFp8: 16 E4M3 codes a chunk, widened two at a time by the hardware (cvt e4m3x2 -> f16x2,
// exact), times the block's fp32 scale.
struct Fp8Reader {
  static constexpr int kVec = 16;
  using Meta = float;
  struct Row {
    const uint4* chunks;
    const uint8_t* codes;
    const float* scales;  // the row's block row of scales
  };
  const WeightView v;
  const ChunkBlocks blocks;
  __device__ explicit Fp8Reader(const WeightView& view)
      : v(view), blocks(view.block_cols / kVec) {}
  __device__ Row row(int64_t n) const {
    const uint8_t* p = static_cast<const uint8_t*>(v.values) + n * v.row_bytes;
    return {reinterpret_cast<const uint4*>(p), p, scales_of(n)};
  }
  // r made the row `by` rows further on, row n (the tensor-core GEMV's next tile).
  __device__ void advance(Row& r, int64_t n, int64_t by) const {
    r.chunks += by * v.row_bytes / 16;
    r.codes += by * v.row_bytes;
    r.scales = scales_of(n);
  }
  // Row n's block row of scales (a 32-bit division: a weight has fewer than 2^31 rows).
  __device__ const float* scales_of(int64_t n) const {
    const uint32_t block_row =
        static_cast<uint32_t>(n) / static_cast<uint32_t>(v.block_rows);
    return static_cast<const float*>(v.scales) + block_row * v.scale_cols;
  }
  __device__ Meta meta(const Row& r, int64_t c) const {
    return __ldg(r.scales + blocks.of(c));
  }
  static __device__ __forceinline__ const uint4* chunk(const Row& r, int64_t c) {
    return r.chunks + c;
  }
  static __device__ __forceinline__ void piece(uint4 raw, Meta, int p, float (&v)[4]) {
    const uint32_t w = chunk_word(raw, p);
    const float2 lo = __half22float2(__half2(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3)));
    const float2 hi = __half22float2(__half2(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3)));
    v[0] = lo.x;
    v[1] = lo.y;
    v[2] = hi.x;
    v[3] = hi.y;
  }
  static __device__ __forceinline__ float scale(Meta m) { return m; }
  // Pairs, in fp16 (kHalfPairs): bytes 2p and 2p + 1 by the hardware conversion, one
  // instruction (exact: every E4M3 value is an fp16 one). Moving the bits under bf16's instead
  // took three logic ops a pair.
  static constexpr bool kBiasedPairs = false;
  static constexpr bool kHalfPairs = true;
  static constexpr int pair_col(int p, int h) { return 2 * p + h; }
  template <typename T16>
  static __device__ __forceinline__ uint32_t pair(uint4 raw, Meta, int p) {
    static_assert(std::is_same_v<T16, __half>, "FP8 pairs are fp16");
    const uint32_t w = chunk_word(raw, p / 2) >> (16 * (p % 2));  // the pair in the low half
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  }
  __device__ float at(const Row& r, int64_t k) const {
    const __half h = __half(__nv_cvt_fp8_to_halfraw(r.codes[k], __NV_E4M3));
    return __half2float(h) * r.scales[k / v.block_cols];
  }
  static bool vectorizable(const WeightView& view) {
    return view.K % kVec == 0 && view.block_cols % kVec == 0 && view.row_bytes % 16 == 0 &&
           aligned16(view.values) && view.K < kMaxChunkedColumns;
  }
};

// kInt8 / kInt4: codes with an fp16 scale and a uint8 zero per group of a row. A code q becomes
// the float 2^23 + q by setting it under the exponent bits of 2^23 (one byte permute or mask),
// and q - zero by subtracting 2^23 + zero: exact, with no integer-to-float conversion.
template <int kBits>
struct IntReader {
  static constexpr int kVec = 128 / kBits;
  // The group's scale (fp16 bits) and zero, each as loaded: packing them into one register
  // would wait for both loads where they are issued, a super-step ring ahead of their use (H100,
  // Qwen3-8B int4 gate|up: the packing instruction took 15% of the stall samples).
  struct Meta {
    uint32_t scale;
    uint32_t zero;
  };
  struct Row {
    const uint4* chunks;
    const uint8_t* codes;
    const __half* scales;
    const uint8_t* zeros;
    int64_t step;  // 16-byte units from one 64-byte piece of the row to the next
  };
  const WeightView v;
  const ChunkBlocks groups;
  __device__ explicit IntReader(const WeightView& view)
      : v(view), groups(view.block_cols / kVec) {}
  __device__ Row row(int64_t n) const {
    // op::tiled_offset(n, 0, R) when tiled.
    const int64_t at = v.tiled ? (n >> 3) * 8 * v.row_bytes + (n & 7) * 64 : n * v.row_bytes;
    const uint8_t* p = static_cast<const uint8_t*>(v.values) + at;
    return {reinterpret_cast<const uint4*>(p), p,
            static_cast<const __half*>(v.scales) + n * v.scale_cols,
            static_cast<const uint8_t*>(v.zeros) + n * v.scale_cols, v.tiled ? 32 : 4};
  }
  // r made the row `by` rows further on (by a multiple of 8 where tiled: whole groups of 8
  // rows), row n (the tensor-core GEMV's next tile).
  __device__ void advance(Row& r, int64_t, int64_t by) const {
    r.chunks += by * v.row_bytes / 16;
    r.codes += by * v.row_bytes;
    r.scales += by * v.scale_cols;
    r.zeros += by * v.scale_cols;
  }
  // Chunk c: piece c / 4 of the row (tiled: 512 bytes apart), 16 bytes c % 4 of it.
  static __device__ __forceinline__ const uint4* chunk(const Row& r, int64_t c) {
    return r.chunks + (c >> 2) * r.step + (c & 3);
  }
  __device__ Meta meta(const Row& r, int64_t c) const {
    const uint32_t g = groups.of(c);
    return {__half_as_ushort(__ldg(r.scales + g)), __ldg(r.zeros + g)};
  }
  static __device__ __forceinline__ void piece(uint4 raw, Meta m, int p, float (&v)[4]) {
    const float offset = 8388608.0f + static_cast<float>(m.zero);  // 2^23 + zero
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t bits;
      if constexpr (kBits == 8) {
        bits = __byte_perm(chunk_word(raw, p), 0x4b000000u, 0x7440u + j);  // [byte j, 0, 0, 0x4b]
      } else {
        // Weights 4p .. 4p + 3: the nibbles of half a word, the even column low.
        bits = ((chunk_word(raw, p / 2) >> (16 * (p % 2) + 4 * j)) & 0xfu) | 0x4b000000u;
      }
      v[j] = __uint_as_float(bits) - offset;
    }
  }
  static __device__ __forceinline__ float scale(Meta m) {
    return __half2float(__ushort_as_half(static_cast<uint16_t>(m.scale)));
  }
  // Pairs, in fp16 (kHalfPairs). kInt4: nibbles s and s + 4 of a word (columns 8w + s and
  // 8w + s + 4), left where they are under an fp16 exponent: for even s at bits 0-3 of each half
  // under 1024's, so the pair holds 1024 + q, for odd s at bits 4-7 under 64's, whose mantissa
  // step is 1/16, so it holds 64 + q; s = 2 and 3 after one shift of the word by 8 (five
  // instructions a word, where bf16's 7-bit mantissa took a shift for every s but 0: seven). The
  // GEMV takes the offsets (pair_offset) and the zero off once a super-step, times sums of x.
  // kInt8: bytes 2p and 2p + 1 under 1024's exponent the same way, minus (1024 + zero) at once.
  static constexpr bool kBiasedPairs = kBits == 4;
  static constexpr bool kHalfPairs = true;
  static constexpr int pair_col(int p, int h) {
    return kBits == 4 ? 8 * (p / 4) + p % 4 + 4 * h : 2 * p + h;
  }
  static constexpr float pair_offset(int p) { return p % 2 == 0 ? 1024.0f : 64.0f; }
  static __device__ __forceinline__ float pair_zero(Meta m) { return static_cast<float>(m.zero); }
  template <typename T16>
  static __device__ __forceinline__ uint32_t pair(uint4 raw, Meta m, int p) {
    static_assert(std::is_same_v<T16, __half>, "integer pairs are fp16");
    if constexpr (kBits == 4) {
      const uint32_t w = chunk_word(raw, p / 4) >> (p % 4 >= 2 ? 8 : 0);
      return p % 2 == 0 ? and_or<0x000f000fu, 0x64006400u>(w)
                        : and_or<0x00f000f0u, 0x54005400u>(w);
    } else {
      const uint32_t zero = m.zero;
      const uint32_t w = chunk_word(raw, p / 2) >> (16 * (p % 2));
      const uint32_t biased = __byte_perm(w, 0x64006400u, 0x7150u);  // [q0, 0x64, q1, 0x64]
      return sub_pair<__half>(biased, (0x6400u + zero) * 0x10001u);
    }
  }
  __device__ float at(const Row& r, int64_t k) const {
    const int64_t g = k / v.block_cols;
    const int64_t b = kBits == 8 ? k : k / 2;  // the byte of the row, in its 64-byte piece
    const uint8_t code = r.codes[(b >> 6) * r.step * 16 + (b & 63)];
    const int q = kBits == 8 ? code : (code >> (4 * (k % 2))) & 0xf;
    return static_cast<float>(q - static_cast<int>(r.zeros[g])) * __half2float(r.scales[g]);
  }
  static bool vectorizable(const WeightView& view) {
    return view.K % kVec == 0 && view.block_cols % kVec == 0 && view.row_bytes % 16 == 0 &&
           aligned16(view.values) && view.K < kMaxChunkedColumns;
  }
};

// Calls fn(TypeTag<Reader>{}) with the reader of a plain weight's element type.
template <typename Fn>
Status visit_plain_reader(const op::Weight& w, Fn&& fn) {
  return visit_float(w.values.dtype(), [&](auto tag) {
    using TW = typename decltype(tag)::type;
    return fn(TypeTag<PlainReader<TW>>{});
  });
}

// Calls fn(TypeTag<Reader>{}) with the reader of a quantized weight's format.
template <typename Fn>
Status visit_quantized_reader(const op::Weight& w, Fn&& fn) {
  switch (w.format) {
    case op::WeightFormat::kFp8: return fn(TypeTag<Fp8Reader>{});
    case op::WeightFormat::kInt8: return fn(TypeTag<IntReader<8>>{});
    case op::WeightFormat::kInt4: return fn(TypeTag<IntReader<4>>{});
    default: return Status::Error("no quantized CUDA reader for " + w.describe());
  }
}

}  // namespace kuiper::cuda
