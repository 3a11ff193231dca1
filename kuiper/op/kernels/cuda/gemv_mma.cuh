// The tensor-core GEMV of quantized weights: out[T, N] = x[T, K] w^T for 1 <= T <= 8 rows of x
// (decode, one sequence or a small batch), w FP8, int8 or int4 (kuiper/op/weight.h), in every
// fused form of op::linear (RMSNorm of x, SwiGLU over stacked gate/up rows, bias, residual add).
//
// Why tensor cores for a product that reads each weight once: a 4-bit weight must be unpacked,
// offset by its zero and multiplied, and at copy bandwidth an H100 SM receives about 27 of them a
// cycle; the one-row GEMV (gemv.cuh), which widens every weight to fp32 and multiplies it there,
// spends about five instructions a weight and tops out near 40% of copy bandwidth on int4. Here a
// lane turns two weights into one 16-bit pair register in one or two instructions (the readers'
// pair<T16>, weight_readers.cuh) and mma.sync m16n8k16 multiplies 256 weights by up to 8 rows of
// x at once, accumulating in fp32. The same pass serves T rows of x: the weights are read once
// for the whole small batch. (Plain 16-bit weights keep the one-row GEMV, the two-row GEMV and,
// for 3 to 8 rows, gemv_rows_mma.cuh, which streams them through shared memory: on this kernel's
// loads they measured no faster than cuBLAS.)
//
// How the work maps onto mma.sync. A tile is 16 weight rows (8 gate and the matching 8 up rows
// for SwiGLU); the 8 warps of a block split K. Lane (g, c) = (lane / 4, lane % 4) streams, 16
// bytes at a time, chunks of rows g and g + 8 of the tile (its rows of the A fragment and of C):
// in super-step s it reads chunk q = 4 s + c of both rows, kVec weights each, which feed kVec / 4
// mma steps. The A fragment wants, per step, 4 weights of each of the lane's rows in k-slots
// (2c, 2c + 1, 2c + 8, 2c + 9); the B fragment wants x at the same slots for column g. Which
// columns of w fill the slots is free, as long as A and B agree: slot pair (2c, 2c + 1) of step j
// takes the chunk's pair 2j and slots (2c + 8, 2c + 9) its pair 2j + 1, in the reader's pair
// order, and x is staged in shared memory in that same order (MmaXs), so the B fragment is two
// registers read as they lie. The scale group must hold a whole super-step (4 kVec columns: 128
// for int4, 64 for FP8 and int8): the mma sums a super-step's columns before the lane applies its
// rows' scales (and, for int4, takes off the zeros) in fp32.
//
// T > 1: columns g < T of B hold x's rows; the result for a row of x does not depend on how many
// others share the launch (every sum is formed in the same order).
//
// FP8 activations (W8A8, weight.h): x is staged as its E4M3 codes, whose values 16-bit pairs hold
// exactly, and a super-step's products are multiplied by their x group's scale beside the
// weight's (a group of 128 columns is two FP8 super-steps).
//
// The quantized weights multiply in fp16 whatever the activation type (the readers' kHalfPairs):
// the hardware turns a pair of E4M3 codes into fp16 in one instruction, where bf16 took three
// logic ops (first on the FP8-activation path, H100, Qwen2.5-7B FP8 decode with bf16
// activations: 251.9 -> 269.5 tok/s; for every FP8 product, H200, batch-1 Qwen2.5-7B FP8
// 310 -> 335 tok/s), int8 bytes sit under fp16's exponent exactly, and int4 nibbles in place
// under two fp16 exponents take five instructions a word of eight, where bf16 took seven
// (weight_readers.cuh). Where the activations are
// not fp16 (bf16 models), a row of x whose largest |x| lies in [2^-4, 2^15) (nearly every row)
// is staged in fp16 as it is, and any other times a power of two, 2^s with its largest in
// [2^13, 2^14), its results multiplied by 2^-s when stored (stage_x_pairs).
//
// Measured on the H100 (kuiper-bench --matmul-only --config models/qwen3-8b.json --dtype bf16
// --quantize F, one row, % of copy bandwidth; the one-row GEMV's figures from docs/PERFORMANCE.md
// in brackets): int4 gate+up 81% (about 40%), down 58% (about 40%), q 42% (39%); FP8 gate+up 89%
// (78% for gate alone), down 75% (55%), q 63% (72%: for FP8 the one-row GEMV is still the faster
// on the 4096 x 4096 matrices). What took int4 gate+up there, in order: a persistent grid with
// the loads running ahead across tiles (44%), the zero taken off once a super-step and one LOP3
// a pair (61%), staging x 8 columns a thread (68%), the scale index by a multiply-high instead
// of a predicated division (73%), the scale and zero waited for where they are used rather than
// where they are loaded (about 81%; weight_readers.cuh's IntReader::Meta). A ring of 8
// super-steps in shared memory by cp.async instead of 4 in registers was slower (Qwen2.5-7B int4
// decode 268 against 327 tok/s); so were shorter rings at 3 or 4 blocks an SM, no barrier at a
// tile's end, and groups of 4 warps a tile (docs/PERFORMANCE.md). Dealing the super-steps of a
// block's tiles to its warps as one stream, each tile's sums handed over by named barriers
// (leave_tile_sums) instead of a block barrier a tile, was faster (H200, batch-1 decode,
// Qwen2.5-7B int4 393 -> 409 tok/s, FP8 272 -> 282, Qwen3-8B int4 339 -> 344).
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "kuiper/op/kernels/cuda/fp8_activations.cuh"
#include "kuiper/op/kernels/cuda/gemv.cuh"
#include "kuiper/op/kernels/cuda/gemv_partition.h"
#include "kuiper/op/kernels/cuda/tensor_core.cuh"

namespace kuiper::cuda {

constexpr int kMmaGemvWarps = 8;
constexpr int kMmaGemvThreads = 32 * kMmaGemvWarps;
constexpr int kMmaGemvMaxRows = 8;    // rows of x a launch takes: the mma's 8 columns
// Rows of x one product takes, in launches of kMmaGemvMaxRows where those fit the block's shared
// memory (gemv_mma): two passes over the packed weights beat dequantizing them for the GEMM, which
// moves 2.5 to 4.5 bytes a weight (H100, Qwen2.5-7B FP8 gate|up: 57 us for 8 rows, 257 us
// dequantized for 16; q_proj 12 and 25).
constexpr int kMmaGemvMaxBatch = 16;
constexpr int kMmaGemvRing = 4;       // super-steps in flight per warp (2 x 16 bytes a lane each)
constexpr int kMmaGemvPadPairs = 16;  // 64 bytes after each staged row of x (MmaXs)
// Tiles of a block whose warps' sums may wait for their epilogue at once (leave_tile_sums), each
// slot with a pair of named barriers.
constexpr int kMmaGemvSlots = 4;
// The one-row GEMV's block: kMmaGemvTeams teams of kMmaGemvWarps warps, one block an SM. Each team
// is what a block of kMmaGemvWarps was (its own tiles, sums and named barriers); x is staged once
// for the block, where two blocks an SM each staged all of it (the staging is instruction-bound:
// docs/PERFORMANCE.md, issue 15's section). A team's slots: kMmaGemvTeamSlots, so that both teams'
// "full" and "free" barriers fit ids 1 to 15.
constexpr int kMmaGemvTeams = 2;
constexpr int kMmaGemvBlockThreads = kMmaGemvTeams * kMmaGemvThreads;
constexpr int kMmaGemvTeamSlots = 3;
static_assert(1 + kMmaGemvTeams * 2 * kMmaGemvTeamSlots <= 16, "named barrier ids 1 to 15");

// Named barriers (ids 1 to 15; 0 is __syncthreads): bar.sync waits until `threads` threads have
// arrived or synced on `id`, bar.arrive counts this warp without waiting. Both order the warp's
// earlier shared-memory accesses before those of the threads the barrier releases.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The hand-over of a block's (or team's) tile i from the `workers` warps that multiply (warps 0
// to workers - 1, each with a share of the tile's K) to warp i % workers (`adds` is true for it
// alone; the callers count it rather than divide), which adds their sums up and stores the
// outputs, without stopping the others: a warp leaving tile i writes its sums (acc, then zeroed)
// to slot i % kSlots of sums and arrives at the slot's "full" barrier (id bar0 + slot); the
// adding warp syncs on it instead, and returns true. Once it has read the slot it calls
// release_tile_sums, arriving at the slot's "free" barrier (id bar0 + kSlots + slot), on which
// every warp syncs before it writes the slot again, for tile i + kSlots. Every working warp calls
// this once a tile, in tile order.
template <int kSlots>
__device__ __forceinline__ bool leave_tile_sums(float (*sums)[kMmaGemvWarps][32][4],
                                                float (&acc)[4], int i, int workers, bool adds,
                                                int warp, int lane, int bar0) {
  const int slot = i % kSlots;
  if (i >= kSlots) named_sync(bar0 + kSlots + slot, 32 * workers + 32);
  *reinterpret_cast<float4*>(sums[slot][warp][lane]) = make_float4(acc[0], acc[1], acc[2], acc[3]);
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = 0.0f;
  if (!adds) {
    named_arrive(bar0 + slot, 32 * workers);
    return false;
  }
  named_sync(bar0 + slot, 32 * workers);
  return true;
}
// The adding warp of tile i has read its slot (leave_tile_sums), of a block of `tiles` tiles.
template <int kSlots>
__device__ __forceinline__ void release_tile_sums(int i, int tiles, int workers, int bar0) {
  if (i + kSlots < tiles) named_arrive(bar0 + kSlots + i % kSlots, 32 * workers + 32);
}

// The activation type, for x of type TX and out of type TO: x's own, or out's when x is the fp32
// residual stream (the norm forms); the unfused ops would store x in it.
template <typename TX, typename TO>
using ActivationType = std::conditional_t<std::is_same_v<TX, float>, TO, TX>;

// The 16-bit type the mma multiplies in: fp16 for the readers whose pairs come cheaper in it
// (kHalfPairs), else the activation type.
template <typename Reader, typename TX, typename TO>
using MmaType = std::conditional_t<Reader::kHalfPairs, __half, ActivationType<TX, TO>>;

// x in shared memory: row n (n < T) holds the K / 2 pairs of x's row, then kMmaGemvPadPairs.
// Chunk q of a row (columns [q kVec, (q + 1) kVec), the chunk of w that lanes with c = q % 4
// read) holds its kVec / 2 pairs in the reader's pair order, as kUnits 16-byte units of two mma
// steps each. Unit j of chunk q in row n is stored at unit j ^ swizzle(q, n): with the padding,
// the 8 lanes of one 16-byte shared load phase (rows g = 2i, 2i + 1 and c = 0..3, at one unit)
// meet 8 distinct bank groups for each unit count (1, 2 or 4) when K is a multiple of 64.
template <int kVec>
struct MmaXs {
  static constexpr int kUnits = kVec / 8;
  static __device__ __forceinline__ int row_pairs(int K) { return K / 2 + kMmaGemvPadPairs; }
  // The unit swizzle of chunks q = c (mod 4) in row n: a lane's constant.
  static __device__ __forceinline__ int swizzle(int c, int n) {
    const int odd = n & 1;
    if constexpr (kUnits == 4) return (c >> 1) | (odd << 1);
    if constexpr (kUnits == 2) return odd;
    return 0;
  }
  // Where unit j of chunk q of row n begins, in pairs from the start of the row (sw =
  // swizzle(q % 4, n)).
  static __device__ __forceinline__ int at(int q, int j, int sw) {
    return q * (kVec / 2) + 4 * (j ^ sw);
  }
};

// Dynamic shared memory: the staged rows of x, then `extra` floats a super-step of each row:
// (biased pairs, 2) the sums of each super-step's staged x [T][steps][2], or (FP8 activations,
// 1) the scale of each group of x [T][K / 128], fewer.
inline int64_t gemv_mma_smem(int64_t T, int64_t K, int kVec, int extra) {
  const int64_t x_bytes = T * (K / 2 + kMmaGemvPadPairs) * 4;
  return x_bytes + T * (K / (4 * kVec)) * extra * 4;
}
template <typename Reader>
int gemv_mma_extra(const GemvArgs& a) {
  return Reader::kBiasedPairs ? 2 : a.fp8_activations ? 1 : 0;
}

// The power s of two that brings a row's largest |x| (big) to [2^13, 2^14) times 2^s: fp16 holds
// the row times 2^s with room to spare (its largest value is 65504). 0 where big is 0 or not
// finite, at most 100 either way.
__device__ __forceinline__ int row_shift(float big) {
  if (!(big > 0.0f) || !isfinite(big)) return 0;
  const int e = static_cast<int>((__float_as_uint(big) >> 23) & 0xffu) - 126;  // big < 2^e
  return max(-100, min(100, 14 - e));
}
// 2^s as a float, exactly (|s| <= 126).
__device__ __forceinline__ float pow2(int s) {
  return __uint_as_float(static_cast<uint32_t>(127 + s) << 23);
}

// x[k0, k0 + 8) as floats: one or two 16-byte loads where x is vectorized.
template <typename TX>
__device__ __forceinline__ void load8(const TX* src, bool vectorized, float (&f)[8]) {
  if (vectorized) {
    constexpr int kPerLoad = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
    for (int l = 0; l < 8 / kPerLoad; ++l) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[l];
      const TX* v = reinterpret_cast<const TX*>(&raw);
#pragma unroll
      for (int e = 0; e < kPerLoad; ++e) f[l * kPerLoad + e] = to_float(v[e]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = to_float(src[e]);
  }
}

// f rounded to TA and back, as the unfused ops would store it: two values a conversion
// instruction (pack_pair), where each value took one of its own (a conversion to a 16-bit type
// runs at a fraction of the FP32 rate). The same rounding (to nearest even).
template <typename TA>
__device__ __forceinline__ void round_through(float (&f)[8]) {
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const uint32_t p = pack_pair<TA>(f[e], f[e + 1]);
    const TA* h = reinterpret_cast<const TA*>(&p);
    f[e] = to_float(h[0]);
    f[e + 1] = to_float(h[1]);
  }
}

// The norm's weights [k0, k0 + 8) of run-time
// type t as floats, the type switched once and loaded 16 bytes at a time (gemv_mma_applies asks
// for an aligned norm), where the staging had 8 loads each behind its own switch.
__device__ __forceinline__ void load8_as_float(const void* p, DataType t, int64_t k0,
                                               float (&f)[8]) {
  switch (t) {
    case DataType::kFp16: return load8(static_cast<const __half*>(p) + k0, true, f);
    case DataType::kBf16: return load8(static_cast<const __nv_bfloat16*>(p) + k0, true, f);
    default: return load8(static_cast<const float*>(p) + k0, true, f);
  }
}

// Stages rows [0, T) of x into xs (MmaXs) as T16 pairs: with a norm, as the unfused rmsnorm
// stores it (weight * (x / rms), rounded to TA, the activation type), else x (TA already, the
// launcher's precondition); for biased pairs, also each super-step's sums of the staged values,
// each pair's times its pair_offset and plain (xsum[n][step][2]); with FP8 activations, the codes of the rounded x and each group's scale
// (xsum[n][group]; the 16 lanes holding a group's 128 columns find its largest by shuffles).
// Where T16 is fp16 and TA is not (checked), a row goes into fp16 as it is when its largest
// |value| lies in [2^-4, 2^15) (kept: found while staging, by one shared atomic a thread and
// row): fp16 holds every bf16 value below 2^15, exactly down to 2^-14 and within 2^-25 below
// that, 2^-21 of the row's largest. A row outside (rare: a first pass over x for every row cost
// more than the fp16 pairs saved on int4) is staged again times 2^s, its largest in
// [2^13, 2^14) (row_shift), with 2^-s in unscale[n] (else 1).
// A thread takes 8 columns at a time, one 16-byte unit of xs: every reader's pairs 4j .. 4j + 3
// of a chunk are its columns 8j + pair_col(e, h) for e < 4, whatever j. A super-step's sum is
// added up by the 16 lanes holding its 128 columns, by shuffles in a fixed order (the same sum
// whatever else runs). Ends with a barrier.
template <typename Reader, typename T16, typename TX, typename TA>
__device__ void stage_x_pairs(const GemvArgs& a, uint32_t* xs, float* xsum, float* unscale) {
  constexpr int kVec = Reader::kVec;
  using Layout = MmaXs<kVec>;
  constexpr int kThreads = kMmaGemvBlockThreads, kWarps = kThreads / 32;
  __shared__ float sumsq[kWarps][kMmaGemvMaxRows];
  __shared__ uint32_t largest[kMmaGemvMaxRows];  // each row's largest |value|, as float bits
  const TX* x = static_cast<const TX*>(a.x);
  const int K = static_cast<int>(a.K), T = static_cast<int>(a.T);
  const int units = K / 8, pairs = Layout::row_pairs(K), steps = K / (4 * kVec);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool norm = a.norm != nullptr;
  const bool fp8_codes = std::is_same_v<Reader, Fp8Reader> && a.fp8_activations;
  const bool checked =
      std::is_same_v<T16, __half> && !std::is_same_v<TA, __half> && !fp8_codes;
  if (threadIdx.x < kMmaGemvMaxRows) {
    largest[threadIdx.x] = 0u;
    unscale[threadIdx.x] = 1.0f;
  }
  if (norm) {
    for (int n = 0; n < T; ++n) {
      float local = 0.0f;
      for (int u = threadIdx.x; u < units; u += kThreads) {
        float f[8];
        load8(x + static_cast<int64_t>(n) * K + 8 * u, true, f);  // x_vectorized (applies)
#pragma unroll
        for (int e = 0; e < 8; ++e) local += f[e] * f[e];
      }
      local = warp_sum(local);
      if (lane == 0) sumsq[warp][n] = local;
    }
  }
  if (norm || checked) __syncthreads();
  // 1 / rms found once for each row a thread stages (once for a
  // row of x), a row of x without a division.
  float inv = 0.0f;
  int inv_row = -1;
  // Stages unit u of row n times up (a power of two; 1 but where a checked row is staged again),
  // by whole warps (the biased sums' shuffles; units is a multiple of 16 then), storing where
  // active; returns the largest |value| of the unit before up where checked.
  auto stage_unit = [&](int n, int u, bool active, float up) {
    float f[8];
    // x in 16-byte loads alone (gemv_mma_applies asks for them):
    // with the run-time choice both ways were issued, one of them predicated off.
    load8(x + static_cast<int64_t>(n) * K + 8 * u, true, f);
    if (norm) {
      if (n != inv_row) {
        float total_sq = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total_sq += sumsq[w][n];
        inv = rms_inverse(total_sq, K, a.eps);
        inv_row = n;
      }
      float weight[8];
      load8_as_float(a.norm, a.norm_dtype, 8 * u, weight);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = weight[e] * (f[e] * inv);
    }
    if (fp8_codes) {
      // Whole half-warps hold a group: units is a multiple of 16.
      float amax = 0.0f;
      round_through<TA>(f);  // x as the unfused ops would store it
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
#pragma unroll
      for (int o = 8; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float inv = fp8_group_inverse(amax);
      if (active && (lane & 15) == 0) xsum[n * (K / kFp8Group) + u / 16] = fp8_group_scale(amax);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // the reader's pairs are columns (2e, 2e + 1)
        const __half2_raw h =
            __nv_cvt_fp8x2_to_halfraw2(fp8x2_code(f[2 * e], f[2 * e + 1], inv), __NV_E4M3);
        const float2 v = __half22float2(__half2(h));
        f[2 * e] = v.x;
        f[2 * e + 1] = v.y;
      }
    }
    float big = 0.0f;
    if (checked) {
      // x as the unfused ops would store it: the norm's result rounded to TA. Without a norm x
      // is TA already (the launcher's precondition) and the round trip is left out.
      if (norm || !std::is_same_v<TX, TA>) round_through<TA>(f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        big = fmaxf(big, fabsf(f[e]));
        f[e] *= up;  // exact
      }
    }
    uint32_t unit[4];
    float sum = 0.0f, offsets = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // pair e of the unit is pair 4j + e of its chunk
      unit[e] = pack_pair<T16>(f[Reader::pair_col(e, 0)], f[Reader::pair_col(e, 1)]);
      if constexpr (Reader::kBiasedPairs) {
        const T16* h = reinterpret_cast<const T16*>(&unit[e]);
        const float pair_sum = to_float(h[0]) + to_float(h[1]);
        sum += pair_sum;
        offsets += Reader::pair_offset(e) * pair_sum;
      }
    }
    const int q = u / (kVec / 8), j = u % (kVec / 8);
    if (active) {
      const int at = Layout::at(q, j, Layout::swizzle(q & 3, n));
      *reinterpret_cast<uint4*>(xs + n * pairs + at) =
          make_uint4(unit[0], unit[1], unit[2], unit[3]);
    }
    if constexpr (Reader::kBiasedPairs) {
      static_assert(4 * Reader::kVec == 128, "a biased super-step is 16 units of 8 columns");
#pragma unroll
      for (int o = 8; o >= 1; o /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        offsets += __shfl_xor_sync(0xffffffffu, offsets, o);
      }
      if (active && (lane & 15) == 0) {
        *reinterpret_cast<float2*>(xsum + 2 * (n * steps + u / 16)) = make_float2(offsets, sum);
      }
    }
    return big;
  };
  const int total = T * units;
  float big = 0.0f;  // the largest |value| this thread staged of row big_row
  int big_row = 0;
  for (int base = 0; base < total; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const bool active = i < total;
    const int n = active && T > 1 ? i / units : 0, u = active ? i - n * units : 0;
    const float unit_big = stage_unit(n, u, active, 1.0f);
    if (checked) {
      if (n != big_row) {  // non-negative floats order as their bits
        atomicMax(&largest[big_row], __float_as_uint(big));
        big = 0.0f;
        big_row = n;
      }
      big = fmaxf(big, unit_big);
    }
  }
  if (checked) atomicMax(&largest[big_row], __float_as_uint(big));
  __syncthreads();
  if (checked) {
    bool again = false;  // the same for every thread: read after the barrier
    for (int n = 0; n < T; ++n) {
      const float row_big = __uint_as_float(largest[n]);
      const int shift = row_big >= 0x1p-4f && row_big < 0x1p15f ? 0 : row_shift(row_big);
      if (shift == 0) continue;
      again = true;
      for (int base = 0; base < units; base += kThreads) {
        const int u = base + static_cast<int>(threadIdx.x);
        stage_unit(n, u < units ? u : 0, u < units, pow2(shift));
      }
      if (threadIdx.x == 0) unscale[n] = pow2(-shift);
    }
    if (again) __syncthreads();
  }
}

// 16 bytes of shared memory at a 32-bit shared address.
__device__ __forceinline__ uint4 ld_shared16(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}

__device__ __forceinline__ float2 ld_shared8(uint32_t address) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(address));
  return v;
}

// A tile's 16 weight rows: the lane's two (A and C rows g and g + 8 of the tile) and whether
// each exists. SwiGLU tiles are 8 gate rows and the 8 up rows up_offset further.
struct MmaTileRows {
  int64_t row[2];
  bool valid[2];
  __device__ MmaTileRows(const GemvArgs& a, int tile, int g) {
    if (a.swiglu) {
      row[0] = static_cast<int64_t>(tile) * 8 + g;
      row[1] = row[0] + a.up_offset;
      valid[0] = valid[1] = row[0] < a.N;
    } else {
      row[0] = static_cast<int64_t>(tile) * 16 + g;
      row[1] = row[0] + 8;
      valid[0] = row[0] < a.N;
      valid[1] = row[1] < a.N;
    }
  }
};

// The lane's C fragment of a tile from the warps' partial sums (sums[warp][lane][4], `workers`
// warps, added in warp order): v[h] is (row[0], x row 2c + h), v[2 + h] is (row[1], x row 2c + h).
__device__ __forceinline__ void mma_gemv_sum(const float (*sums)[32][4], int workers, int lane,
                                             float (&v)[4]) {
  // One 16-byte load a warp, the sums added in warp order (H200, Qwen2.5-7B int4 batch-1
  // decode 427 -> 432 tok/s against four 4-byte loads).
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = 0.0f;
#pragma unroll
  for (int w = 0; w < kMmaGemvWarps; ++w) {  // unrolled: the loads all in flight at once
    if (w < workers) {
      const float4 p = *reinterpret_cast<const float4*>(sums[w][lane]);
      v[0] += p.x;
      v[1] += p.y;
      v[2] += p.z;
      v[3] += p.w;
    }
  }
}

// Stores one tile's outputs from the lane's C fragment v (mma_gemv_sum): rows 2 (lane % 4) and
// 2 (lane % 4) + 1 of x, each for the tile's pair of w's rows.
template <typename TO>
__device__ void mma_gemv_store(const GemvArgs& a, const MmaTileRows& t, const float (&v)[4],
                               int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = 2 * (lane % 4) + h;
    if (n >= a.T) continue;
    gemv_store_pair(a, static_cast<TO*>(a.out) + n * a.N, t.row, t.valid, v[h], v[2 + h]);
  }
}

// A persistent grid of teams (kMmaGemvTeams a block, x staged once for the block): team b of
// the grid (block b % gridDim.x) takes tiles b, b + teams, ... The team's
// tiles' super-steps form one stream, sigma = tile * steps + s (s < steps = K / (4 kVec)), dealt
// to its `workers` warps (all 8, or one a super-step where K has fewer): warp w takes sigma = w,
// w + workers, ..., so every warp does the same number of super-steps within one over the whole
// block (Qwen2.5-7B int4's K = 3584 is 28 a tile: dealt a tile at a time that was 4 for half the
// warps and 3 for the rest, every tile, H200: 409 against 393 tok/s). A warp's 16-byte loads run
// kMmaGemvRing super-steps ahead of its mma through a ring of registers that carries on across
// tiles, and no block barrier stops them: a warp leaving a tile hands its sums over
// (leave_tile_sums) and goes on. Rows past N (a partial last tile) read row 0 and x rows past T
// read row T - 1: the mma keeps every row and column of its product apart, and those are never
// stored.
template <typename Reader, typename TX, typename TO>
__global__ void __launch_bounds__(kMmaGemvBlockThreads, 1)
    gemv_mma_kernel(const GemvArgs a, int tiles) {
  // 128-byte aligned, so that a staged row of x (a
  // multiple of 64 bytes long) starts on 64 bytes, as the unit addresses below ask.
  extern __shared__ __align__(128) float xs_storage[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(xs_storage);
  __shared__ __align__(16) float team_sums[kMmaGemvTeams][kMmaGemvTeamSlots][kMmaGemvWarps][32][4];
  __shared__ float unscale[kMmaGemvMaxRows];  // 2^-s of each row of x (stage_x_pairs)
  using T16 = MmaType<Reader, TX, TO>;
  constexpr int kVec = Reader::kVec;
  constexpr int kRing = kMmaGemvRing;
  using Layout = MmaXs<kVec>;
  using Meta = typename Reader::Meta;
  const Reader reader(a.w);
  // The team's warp, the team, and the team as a block of kMmaGemvWarps was: team_id of teams,
  // the blocks' first teams before their second ones (where the tiles do not fill the teams, a
  // second team idles, not a whole block).
  const int warp = (threadIdx.x / 32) % kMmaGemvWarps, lane = threadIdx.x % 32;
  const int team = static_cast<int>(threadIdx.x) / kMmaGemvThreads;
  const int team_id = team * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
  const int teams = static_cast<int>(gridDim.x) * kMmaGemvTeams;
  float(*sums)[kMmaGemvWarps][32][4] = team_sums[team];
  const int bar0 = 1 + team * 2 * kMmaGemvTeamSlots;  // the team's named barriers
  const int g = lane / 4, c = lane % 4;
  const int K = static_cast<int>(a.K), T = static_cast<int>(a.T);
  const int steps = K / (4 * kVec);  // super-steps a tile: a chunk for each c (at least one)
  const int workers = steps < kMmaGemvWarps ? steps : kMmaGemvWarps;
  const int my_tiles = (tiles - team_id + teams - 1) / teams;
  const bool working = warp < workers;
  float* xsum = xs_storage + T * Layout::row_pairs(K);

  // How far a warp's chunks of a row are from one of its super-steps to the next in a tile, in
  // bytes. 32 bits (the 64-bit stride was found again at every
  // step, the registers short).
  const int load_stride = [&] {
    const typename Reader::Row r0 = reader.row(0);
    return static_cast<int>(Reader::chunk(r0, 4) - Reader::chunk(r0, 0)) * 16 * workers;
  }();
  // The ring: slot j holds a super-step's chunks of the lane's two rows and their scales.
  uint4 raw[2][kRing];
  Meta meta[2][kRing];
  // The next super-step to load: super-step load_s of the block's tile load_tile (workers <=
  // steps: a step of the stream crosses at most one tile's end). Its chunks' addresses advance
  // by a constant within a tile (the readers' chunk q + 4 is a fixed distance past chunk q),
  // computed afresh at each tile.
  int load_tile = 0, load_s = warp;
  typename Reader::Row load_rows[2];
  const uint4* load_at[2];
  // A whole tile's rows are the previous tile's moved on by tile_rows (the reader's advance), not
  // found afresh; only a block's first tile and the grid's partial last one (rows past N read
  // row 0) are.
  const int tile_height = a.swiglu ? 8 : 16;
  const int64_t tile_rows = static_cast<int64_t>(tile_height) * teams;
  auto set_load_rows = [&](bool first) {
    const int tile = team_id + load_tile * teams;
    if (first || static_cast<int64_t>(tile + 1) * tile_height > a.N) {
      const MmaTileRows t(a, tile, g);
#pragma unroll
      for (int r = 0; r < 2; ++r) load_rows[r] = reader.row(t.valid[r] ? t.row[r] : 0);
    } else {
      const MmaTileRows t(a, tile, g);  // row numbers: only where the reader's advance uses them
#pragma unroll
      for (int r = 0; r < 2; ++r) reader.advance(load_rows[r], t.row[r], tile_rows);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) load_at[r] = Reader::chunk(load_rows[r], 4 * load_s + c);
  };
  auto issue = [&](int j) {
    if (load_tile >= my_tiles) return;
    const int q = 4 * load_s + c;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      raw[r][j] = __ldcs(load_at[r]);
      meta[r][j] = reader.meta(load_rows[r], q);
    }
    load_s += workers;
    if (load_s >= steps) {
      load_s -= steps;
      if (++load_tile < my_tiles) set_load_rows(false);
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        load_at[r] = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(load_at[r]) +
                                                    load_stride);
      }
    }
  };
  if (working && my_tiles > 0) {
    set_load_rows(true);
#pragma unroll
    for (int j = 0; j < kRing; ++j) issue(j);  // weights only: safe before the previous kernel ends
  }
  grid_dependency_wait();
  grid_launch_dependents();
  stage_x_pairs<Reader, T16, TX, ActivationType<TX, TO>>(a, xs, xsum, unscale);
  if (!working) return;  // K has fewer super-steps than the block has warps

  const int x_n = g < T ? g : T - 1;  // this lane's column of B
  const uint32_t* x_row = xs + x_n * Layout::row_pairs(K);
  // The C columns of this lane (x rows 2c and 2c + 1, clamped as x_n) for the biased pairs' sums.
  const int n_lo = 2 * c < T ? 2 * c : T - 1, n_hi = 2 * c + 1 < T ? 2 * c + 1 : T - 1;
  // the sums' rows by 32-bit shared addresses too.
  const uint32_t xsum_lo =
      static_cast<uint32_t>(__cvta_generic_to_shared(xsum + 2 * n_lo * steps));
  const uint32_t xsum_hi =
      static_cast<uint32_t>(__cvta_generic_to_shared(xsum + 2 * n_hi * steps));
  // unit jj of chunk q, x_units[q kUnits + (jj ^ sw)], by its 32-bit
  // shared address: the row starts on 64 bytes (xs_storage's alignment, rows a multiple of 64
  // bytes long), so that address is (row ^ 16 sw) + 16 kUnits q, xor 16 jj: one instruction a
  // unit where the index took two.
  const uint32_t x_row_sw =
      static_cast<uint32_t>(__cvta_generic_to_shared(x_row)) ^ (16u * Layout::swizzle(c, x_n));
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int tile = 0, s = warp;  // the super-step the mma is at: super-step s of the block's tile
  int adder = 0;           // tile % workers: the warp that adds the tile up
  while (tile < my_tiles) {
#pragma unroll
    for (int j = 0; j < kRing; ++j) {
      if (tile >= my_tiles) break;  // warp-uniform, as is everything the mma depends on
      const int q = 4 * s + c;
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t x_q = x_row_sw + 16u * Layout::kUnits * static_cast<uint32_t>(q);
#pragma unroll
      for (int jj = 0; jj < Layout::kUnits; ++jj) {
        const uint4 b = ld_shared16(x_q ^ (16u * jj));  // Layout::at in 16 bytes
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int step = 2 * jj + h;  // the mma step: the chunk's pairs 2 step, 2 step + 1
          const uint32_t frag[4] = {
              Reader::template pair<T16>(raw[0][j], meta[0][j], 2 * step),
              Reader::template pair<T16>(raw[1][j], meta[1][j], 2 * step),
              Reader::template pair<T16>(raw[0][j], meta[0][j], 2 * step + 1),
              Reader::template pair<T16>(raw[1][j], meta[1][j], 2 * step + 1)};
          TensorCore<T16>::mma(part, frag, h ? b.z : b.x, h ? b.w : b.y);
        }
      }
      if constexpr (Reader::kBiasedPairs) {
        // {the offsets' sum, x's sum}: the pairs' offsets and the zero taken off.
        const float2 sum_lo = ld_shared8(xsum_lo + 8u * static_cast<uint32_t>(s));
        const float2 sum_hi = ld_shared8(xsum_hi + 8u * static_cast<uint32_t>(s));
        const float z0 = Reader::pair_zero(meta[0][j]), z1 = Reader::pair_zero(meta[1][j]);
        part[0] -= fmaf(z0, sum_lo.y, sum_lo.x);
        part[1] -= fmaf(z0, sum_hi.y, sum_hi.x);
        part[2] -= fmaf(z1, sum_lo.y, sum_lo.x);
        part[3] -= fmaf(z1, sum_hi.y, sum_hi.x);
      }
      if constexpr (std::is_same_v<Reader, Fp8Reader>) {
        if (a.fp8_activations) {  // the x groups' scales (a group: 128 / (4 kVec) super-steps)
          const int group = s / (kFp8Group / (4 * kVec));
          const float x_lo = xsum[n_lo * (K / kFp8Group) + group];
          const float x_hi = xsum[n_hi * (K / kFp8Group) + group];
          part[0] *= x_lo;
          part[1] *= x_hi;
          part[2] *= x_lo;
          part[3] *= x_hi;
        }
      }
      const float s_lo = Reader::scale(meta[0][j]);
      const float s_hi = Reader::scale(meta[1][j]);
      acc[0] += part[0] * s_lo;
      acc[1] += part[1] * s_lo;
      acc[2] += part[2] * s_hi;
      acc[3] += part[3] * s_hi;
      issue(j);  // the slot is free: the super-step kRing ahead
      s += workers;
      if (s >= steps) {  // the warp's last super-step of the tile
        s -= steps;
        if (leave_tile_sums<kMmaGemvTeamSlots>(sums, acc, tile, workers, adder == warp, warp,
                                               lane, bar0)) {
          float v[4];
          mma_gemv_sum(sums[tile % kMmaGemvTeamSlots], workers, lane, v);
          v[0] *= unscale[n_lo];  // x's rows back from their 2^s
          v[1] *= unscale[n_hi];
          v[2] *= unscale[n_lo];
          v[3] *= unscale[n_hi];
          release_tile_sums<kMmaGemvTeamSlots>(tile, my_tiles, workers, bar0);
          mma_gemv_store<TO>(a, MmaTileRows(a, team_id + tile * teams, g), v, lane);
        }
        ++tile;
        adder = adder + 1 == workers ? 0 : adder + 1;
      }
    }
  }
}

// The most dynamic shared memory a block may ask for on the current device.
inline Result<int64_t> max_dynamic_shared_memory() {
  static PerDevice<int64_t> limit;
  return limit.get([]() -> Result<int64_t> {
    int device = 0, bytes = 0;
    KUIPER_CUDA_CHECK(cudaGetDevice(&device));
    KUIPER_CUDA_CHECK(
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<int64_t>(bytes);
  });
}

// Whether gemv_mma takes this product: T16 multiplies (x or out 16-bit, an fp32 x only when
// normalised), the reader's chunks apply, K holds whole super-steps (at least one) and a
// quantized weight's scale groups whole super-steps, T <= kMmaGemvMaxRows (one launch), and one
// staged row of x fits.
template <typename Reader, typename TX, typename TO>
bool gemv_mma_applies(const GemvArgs& a, int64_t smem_limit) {
  if constexpr (std::is_same_v<TX, float> && std::is_same_v<TO, float>) {
    return false;
  } else {
    constexpr int64_t kStep = 4 * Reader::kVec;
    if (std::is_same_v<TX, float> && a.norm == nullptr) return false;
    if (a.T < 1 || a.T > kMmaGemvMaxRows || a.K < kStep || a.K % kStep != 0) return false;
    if (a.w.block_cols % kStep != 0) return false;
    if (!Reader::vectorizable(a.w)) return false;
    // x and the norm's weights in 16-byte loads.
    if (!a.x_vectorized || (a.norm != nullptr && !aligned16(a.norm))) return false;
    if (a.fp8_activations && !std::is_same_v<Reader, Fp8Reader>) return false;
    return gemv_mma_smem(1, a.K, Reader::kVec, gemv_mma_extra<Reader>(a)) <=
               smem_limit &&
           a.N < (int64_t{1} << 30);
  }
}

// The static shared memory of gemv_mma_kernel (the tiles' sums, the staging's per-row values).
template <typename Reader, typename TX, typename TO>
Result<int64_t> gemv_mma_static_smem() {
  static PerDevice<int64_t> bytes;
  return bytes.get([]() -> Result<int64_t> {
    cudaFuncAttributes attributes{};
    KUIPER_CUDA_CHECK(cudaFuncGetAttributes(&attributes, gemv_mma_kernel<Reader, TX, TO>));
    return static_cast<int64_t>(attributes.sharedSizeBytes);
  });
}

// Teams of gemv_mma_kernel that fit on the current GPU at once with `smem` bytes of x.
template <typename Reader, typename TX, typename TO>
Result<int64_t> gemv_mma_fit(int64_t smem) {
  KUIPER_ASSIGN_OR_RETURN(const int64_t blocks,
                          (resident_blocks<gemv_mma_kernel<Reader, TX, TO>>(
                              kMmaGemvBlockThreads, static_cast<size_t>(smem))));
  return blocks * kMmaGemvTeams;
}

// Rows of x a launch takes: all T where the block (both teams, one a multiprocessor) still fits
// in smem_limit bytes of dynamic shared memory, else as many as do, at least one. (The occupancy
// query cannot say: it counts a block an SM even where none fits.)
template <typename Reader>
int64_t gemv_mma_rows_per_launch(int64_t T, int64_t K, int extra, int64_t smem_limit) {
  for (int64_t rows = T; rows > 1; --rows) {
    if (gemv_mma_smem(rows, K, Reader::kVec, extra) <= smem_limit) return rows;
  }
  return int64_t{1};
}

// The tiles of a product: 16 weight rows, or 8 gate and 8 up rows for SwiGLU.
inline int64_t gemv_mma_tiles(const GemvArgs& a) {
  return a.swiglu ? (a.N + 7) / 8 : (a.N + 15) / 16;
}

// Launches gemv_mma_kernel over x's rows, `per_launch` at a time (each launch reads the weights
// once), on a persistent grid: at most as many blocks as fit at once (one an SM), each team
// taking the same number of tiles (give or take one for the last).
template <typename Reader, typename TX, typename TO>
Status launch_gemv_mma(GemvArgs a, int64_t per_launch) {
  const int64_t tiles = gemv_mma_tiles(a);
  const int64_t T = a.T;
  for (int64_t t0 = 0; t0 < T; t0 += per_launch) {
    GemvArgs b = a;
    b.T = std::min(per_launch, T - t0);
    b.x = static_cast<const TX*>(a.x) + t0 * a.K;
    b.out = static_cast<TO*>(a.out) + t0 * a.N;
    const int64_t smem =
        gemv_mma_smem(b.T, a.K, Reader::kVec, gemv_mma_extra<Reader>(a));
    KUIPER_ASSIGN_OR_RETURN(const int64_t fit, (gemv_mma_fit<Reader, TX, TO>(smem)));
    // The fewest teams that keep a team's most tiles (gemv_partition.h), in as few blocks.
    const int64_t teams = gemv_mma_teams(tiles, fit);
    const int64_t blocks = (teams + kMmaGemvTeams - 1) / kMmaGemvTeams;
    KUIPER_RETURN_IF_ERROR(launch_pdl(gemv_mma_kernel<Reader, TX, TO>,
                                      dim3(static_cast<unsigned>(blocks)),
                                      dim3(kMmaGemvBlockThreads),
                                      static_cast<size_t>(smem), "tensor-core gemv kernel launch",
                                      b, static_cast<int>(tiles)));
  }
  return Status::Ok();
}

// The product through gemv_mma when it applies: true when it ran, false when the caller's other
// path must. visit_reader as in gemv() (gemv.cuh).
template <typename VisitReader>
Result<bool> gemv_mma(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                      Tensor& out, VisitReader&& visit_reader) {
  GemvArgs a = gemv_args(x, w, o, out);
  if (a.T < 1 || a.T > kMmaGemvMaxBatch) return false;
  KUIPER_ASSIGN_OR_RETURN(const int64_t optin, max_dynamic_shared_memory());
  bool ran = false;
  KUIPER_RETURN_IF_ERROR(
      visit_activation_pair(x.dtype(), out.dtype(), [&](auto x_tag, auto out_tag) {
        using TX = typename decltype(x_tag)::type;
        using TO = typename decltype(out_tag)::type;
        return visit_reader(w, [&](auto reader_tag) -> Status {
          using Reader = typename decltype(reader_tag)::type;
          if constexpr (std::is_same_v<TX, float> && std::is_same_v<TO, float>) {
            return Status::Ok();
          } else {
            a.x_vectorized = a.K % (16 / sizeof(TX)) == 0 && aligned16(x.raw());
            // What the kernel's static shared memory leaves of the block's limit.
            KUIPER_ASSIGN_OR_RETURN(const int64_t static_smem,
                                    (gemv_mma_static_smem<Reader, TX, TO>()));
            const int64_t smem_limit = optin - static_smem;
            GemvArgs launch = a;  // what one launch takes
            launch.T = std::min<int64_t>(a.T, kMmaGemvMaxRows);
            if (!gemv_mma_applies<Reader, TX, TO>(launch, smem_limit)) return Status::Ok();
            KUIPER_RETURN_IF_ERROR((allow_shared_memory<gemv_mma_kernel<Reader, TX, TO>>(
                static_cast<size_t>(smem_limit))));
            const int64_t per_launch = gemv_mma_rows_per_launch<Reader>(
                launch.T, a.K, gemv_mma_extra<Reader>(a), smem_limit);
            // Past kMmaGemvMaxRows rows, only where each launch takes that many (a long row of
            // x, down_proj's, leaves room for fewer, and more passes over the weights cost
            // more).
            if (a.T > kMmaGemvMaxRows && per_launch < kMmaGemvMaxRows) return Status::Ok();
            ran = true;
            return launch_gemv_mma<Reader, TX, TO>(a, per_launch);
          }
        });
      }));
  return ran;
}

}  // namespace kuiper::cuda
