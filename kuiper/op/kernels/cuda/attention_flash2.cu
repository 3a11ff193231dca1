// FlashAttention-2 style kernels.
//
// Prefill (flash2_prefill, fp32 SIMT; flash2_prefill_tc, fp16 tensor cores): a block owns a tile
// of rows ((query, head) pairs of one kv head, packed as in flash1) and each warp owns its rows
// outright (8 in the SIMT kernel, 16 in the tensor-core one), so the softmax needs warp shuffles
// only and a KV tile costs at most two block barriers. Tiles are small (32 / 64 keys; the
// tensor-core kernel double-buffers them with cp.async), the row sum stays per lane until the
// very end and the output is normalised once (delayed normalisation), and exponentials
// negligible against the row maximum are flushed to zero.
//
// Decode (flash-decoding): one query cannot fill the GPU from a single KV pass, so the context
// is split over the KV length. fp16 (flash2_decode_tc): a fixed grid (the largest multiple of
// the (kv head, group of up to 16 query heads) count that fits the SMs) over which the
// flattened (unit, key) work is spread evenly on the device from the position
// (decode_partition.h); a block whose range crosses into the next unit writes a partial for
// each. K/V stream through a cp.async ring, both products run on tensor cores, and the last
// block touching a unit to finish combines its partials (no second launch). The kernel is
// launched with PDL: it starts loading its first tiles before it waits for the kernel before,
// and keeps them only if the position it reads after the wait is the one it guessed. fp32
// (flash2_decode_split, SIMT): fixed chunks of kChunk keys, one block per (chunk, kv head,
// group of <= 8 query heads), then combine_splits. Either way each split writes an
// unnormalised partial output with its maximum and sum, partial buffers are sized for the
// whole cache and graph-safe grids for the capacity (blocks past the position's work exit at
// once), so nothing about a decode step depends on the
// position except what the kernels read from the device.
#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention_common.cuh"
#include "kuiper/op/kernels/cuda/decode_partition.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::op::cuda_attention {
namespace {

// ---------------------------------------------------------------------------------------------
// Prefill, SIMT.

template <int D>
struct PrefillTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 8;
  static constexpr int kRows = kWarps * kRowsPerWarp;
  static constexpr int kKeys = 32;           // one key per lane in the score step
  static constexpr int kPerLane = D / 32;    // output dims per lane in the P·V step
  // Lane j reads K row j as float4: a stride of D + 4 words keeps a quarter-warp's reads in
  // distinct bank quads. Q and V are read broadcast or contiguously and need no padding.
  static constexpr int kKStride = D + 4;
  static constexpr size_t kSharedBytes =
      sizeof(float) * (static_cast<size_t>(kRows) * D + kKeys * kKStride + kKeys * D +
                       kWarps * kKeys * kRowsPerWarp);
};

template <typename T, int D>
__global__ void __launch_bounds__(PrefillTraits<D>::kThreads)
    flash2_prefill(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   T* __restrict__ out, Geometry g) {
  using Tr = PrefillTraits<D>;
  constexpr int R = Tr::kRowsPerWarp;
  extern __shared__ float4 shared4[];
  float* qs = reinterpret_cast<float*>(shared4);
  float* ks = qs + Tr::kRows * D;
  float* vs = ks + Tr::kKeys * Tr::kKStride;
  float* ps_all = vs + Tr::kKeys * D;

  const int kvh = blockIdx.y;
  const int total_rows = g.T * g.group;
  const int row_block = gridDim.x - 1 - blockIdx.x;  // longest rows first: a shorter tail
  const int r0 = row_block * Tr::kRows;
  const int pos0 = first_position(g);
  const int kv_end = pos0 + (min(r0 + Tr::kRows, total_rows) - 1) / g.group + 1;

  stage_q_tile<T, D, Tr::kRows, Tr::kThreads>(q, g, kvh, r0, total_rows, qs, D);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* qw = qs + warp * R * D;
  float* ps = ps_all + warp * Tr::kKeys * R;  // [key][row]: the P·V step reads a row of 8 at once
  int pos[R];
#pragma unroll
  for (int r = 0; r < R; ++r) pos[r] = pos0 + min(r0 + warp * R + r, total_rows - 1) / g.group;
  const int warp_last_pos = pos[R - 1];

  float m[R], l[R], o[R][Tr::kPerLane];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < Tr::kPerLane; ++i) o[r][i] = 0.0f;
  }

  for (int key0 = 0; key0 < kv_end; key0 += Tr::kKeys) {
    __syncthreads();  // every warp is done with the previous tile
    load_kv_tile<T, D, Tr::kKeys, Tr::kKStride, Tr::kThreads>(k, g.kv_heads, kvh, key0, kv_end, ks);
    load_kv_tile<T, D, Tr::kKeys, D, Tr::kThreads>(v, g.kv_heads, kvh, key0, kv_end, vs);
    __syncthreads();
    if (key0 > warp_last_pos) continue;  // the tile is in the future of all this warp's rows

    float s[R] = {};
    for (int d = 0; d < D; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(ks + lane * Tr::kKStride + d);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(qw + r * D + d);
        s[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    const int key = key0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Key 0 is in every row's past, so after the first tile m[r] is finite and a fully
      // masked later tile leaves it unchanged (alpha = 1).
      const float sr = key > pos[r] ? -INFINITY : s[r];
      const float m_new = fmaxf(m[r], group_max<32>(sr));
      const float alpha = fast_exp2(m[r] - m_new);
      const float p = exp2_ftz(sr - m_new);
      l[r] = l[r] * alpha + p;  // per-lane partial sum: reduced once, after the last tile
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) o[r][i] *= alpha;
      m[r] = m_new;
      ps[lane * R + r] = p;
    }
    __syncwarp();
    for (int j = 0; j < Tr::kKeys; ++j) {
      const float4 p_lo = *reinterpret_cast<const float4*>(ps + j * R);
      const float4 p_hi = *reinterpret_cast<const float4*>(ps + j * R + 4);
      const float p[R] = {p_lo.x, p_lo.y, p_lo.z, p_lo.w, p_hi.x, p_hi.y, p_hi.z, p_hi.w};
      float vv[Tr::kPerLane];
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) vv[i] = vs[j * D + lane * Tr::kPerLane + i];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < Tr::kPerLane; ++i) o[r][i] += p[r] * vv[i];
      }
    }
    __syncwarp();  // P is rewritten by the next tile
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = r0 + warp * R + r;
    const float inv = 1.0f / group_sum<32>(l[r]);
    if (row < total_rows) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      float res[Tr::kPerLane];
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) res[i] = o[r][i] * inv;
      store_vec<T, Tr::kPerLane>(out + (static_cast<size_t>(t) * g.heads + h) * D +
                                     lane * Tr::kPerLane,
                                 res);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill, fp16 on tensor cores: the same FA2 schedule with the two matrix products on
// mma.sync m16n8k16 (fp16 in, fp32 accumulate). A block owns 128 rows, each warp 16 of them (one
// mma row tile); KV tiles of 64 keys are double-buffered in shared memory by cp.async so the
// next tile loads while this one is computed. S stays in registers: its accumulator layout is
// exactly the A-operand layout of the P·V product, so P never touches shared memory.

template <int D>
struct TensorCoreTraits {
  // 8 warps (128 rows) share each KV tile: measured 200 vs 184 TFLOP/s with 4 warps at T = 8192
  // (176 vs 165 at T = 2048) on the H100, Qwen3-8B's attention shape.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;
  static constexpr int kKeys = 64;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  // Q, then two stages of K, then two of V.
  static constexpr size_t kSharedBytes = sizeof(half) * (static_cast<size_t>(kRows) + 4 * kKeys) * D;
};

template <int D>
__global__ void __launch_bounds__(TensorCoreTraits<D>::kThreads)
    flash2_prefill_tc(const half* __restrict__ q, const half* __restrict__ k,
                      const half* __restrict__ v, half* __restrict__ out, Geometry g) {
  using Tr = TensorCoreTraits<D>;
  extern __shared__ uint4 shared16[];
  half* qs = reinterpret_cast<half*>(shared16);
  half* ks = qs + Tr::kRows * D;
  half* vs = ks + 2 * Tr::kKeys * D;

  const int kvh = blockIdx.y;
  const int total_rows = g.T * g.group;
  const int row_block = gridDim.x - 1 - blockIdx.x;  // longest rows first
  const int r0 = row_block * Tr::kRows;
  const int pos0 = first_position(g);
  const int kv_end = pos0 + (min(r0 + Tr::kRows, total_rows) - 1) / g.group + 1;
  const int n_tiles = (kv_end + Tr::kKeys - 1) / Tr::kKeys;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  for (int c = threadIdx.x; c < Tr::kRows * Tr::kChunks; c += Tr::kThreads) {
    const int r = c / Tr::kChunks, ch = c % Tr::kChunks, row = r0 + r;
    const bool valid = row < total_rows;
    const half* src = q;
    if (valid) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      src = q + (static_cast<size_t>(t) * g.heads + h) * D + ch * 8;
    }
    cp_async16(swizzled<D>(qs, r, ch), src, valid);
  }
  auto load_kv = [&](int tile, int stage) {
    cp_async_kv_tiles<D, Tr::kKeys, Tr::kThreads>(k, v, g.kv_heads, kvh, tile * Tr::kKeys, kv_end,
                                                  ks + stage * Tr::kKeys * D,
                                                  vs + stage * Tr::kKeys * D);
  };
  load_kv(0, 0);
  cp_async_commit();

  // This thread's two rows in the mma accumulator layout: lane / 4 and lane / 4 + 8.
  const int quad_row = lane / 4, quad_col = (lane % 4) * 2;
  const int warp_row0 = r0 + warp * 16;
  const int pos_a = pos0 + min(warp_row0 + quad_row, total_rows - 1) / g.group;
  const int pos_b = pos0 + min(warp_row0 + quad_row + 8, total_rows - 1) / g.group;
  const int warp_first_pos = pos0 + min(warp_row0, total_rows - 1) / g.group;
  const int warp_last_pos = pos0 + min(warp_row0 + 15, total_rows - 1) / g.group;

  uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();  // everything but the prefetch just issued has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4(qf[kk], swizzled<D>(qs, warp * 16 + lane % 16, kk * 2 + lane / 16));
      }
    }
    const int key0 = tile * Tr::kKeys;
    if (key0 <= warp_last_pos) {
      const half* kt = ks + (tile & 1) * Tr::kKeys * D;
      const half* vt = vs + (tile & 1) * Tr::kKeys * D;

      float s[Tr::kKeys / 8][4] = {};
      mma_qk<D, Tr::kKeys>(s, qf, kt, 0);

      const bool diagonal = key0 + Tr::kKeys - 1 > warp_first_pos;
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int j = 0; j < Tr::kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + j * 8 + quad_col + (e & 1);
          float x = s[j][e] * g.scale_log2;
          if (diagonal && key > (e < 2 ? pos_a : pos_b)) x = -INFINITY;
          s[j][e] = x;
        }
        mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
      }
      // A row lives in the 4 lanes of a quad. Key 0 is in every row's past, so the maxima are
      // finite from the first tile on.
      const float m_new_a = fmaxf(m_a, group_max<4>(mx_a));
      const float m_new_b = fmaxf(m_b, group_max<4>(mx_b));
      const float alpha_a = fast_exp2(m_a - m_new_a), alpha_b = fast_exp2(m_b - m_new_b);
      m_a = m_new_a;
      m_b = m_new_b;
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int j = 0; j < Tr::kKeys / 8; ++j) {
        s[j][0] = exp2_ftz(s[j][0] - m_a);
        s[j][1] = exp2_ftz(s[j][1] - m_a);
        s[j][2] = exp2_ftz(s[j][2] - m_b);
        s[j][3] = exp2_ftz(s[j][3] - m_b);
        sum_a += s[j][0] + s[j][1];
        sum_b += s[j][2] + s[j][3];
      }
      l_a = l_a * alpha_a + sum_a;  // per-lane partial sums, reduced across the quad at the end
      l_b = l_b * alpha_b + sum_b;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= alpha_a;
        o[n][1] *= alpha_a;
        o[n][2] *= alpha_b;
        o[n][3] *= alpha_b;
      }

      mma_pv<D, Tr::kKeys>(o, s, vt, 0);
    }
    __syncthreads();  // the stage just read is the next prefetch's target
  }

  const float inv_a = 1.0f / group_sum<4>(l_a), inv_b = 1.0f / group_sum<4>(l_b);
  const int row_a = warp_row0 + quad_row, row_b = row_a + 8;
#pragma unroll
  for (int half_row = 0; half_row < 2; ++half_row) {
    const int row = half_row == 0 ? row_a : row_b;
    if (row >= total_rows) continue;
    const float inv = half_row == 0 ? inv_a : inv_b;
    const int t = row / g.group, h = kvh * g.group + row % g.group;
    half* dst = out + (static_cast<size_t>(t) * g.heads + h) * D + quad_col;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) =
          pack_half2(o[n][2 * half_row] * inv, o[n][2 * half_row + 1] * inv);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decode: split-KV partials, then the combine.

constexpr int kChunk = 128;            // keys per split block
constexpr int kSplitThreads = 128;     // 4 warps, 32 keys each
constexpr int kMaxGroupPerBlock = 8;   // query heads of one kv head handled by one block

template <typename T, int D>
struct DecodeTraits {
  static constexpr int kElems = 8;                  // one row slice per lane: a 16 B fp16 load
  static constexpr int kLanesPerKey = D / kElems;   // lanes that together hold one K/V row
  static constexpr int kKeysPerStep = 32 / kLanesPerKey;
  static constexpr int kSteps = 32 / kKeysPerStep;  // steps to cover a warp's 32 keys
  static constexpr int kWords = kElems * static_cast<int>(sizeof(T)) / 16;  // uint4 per slice
  // Row slices a lane keeps in flight: all of its warp's keys for fp16 (64 registers), half for
  // fp32. Issuing every load before the first use turns the block's life into about two memory
  // latencies (K, then V, which is prefetched while the softmax runs) instead of one per batch.
  static constexpr int kBatch = sizeof(T) == 2 ? kSteps : kSteps / 2;
};

template <typename T, int N>
__device__ __forceinline__ void unpack_slice(const uint4 (&raw)[N], float* out) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) Word<T>::unpack(w[i], out + (c * 4 + i) * Word<T>::kElems);
  }
}

// Loads a lane's slices of kBatch consecutive steps' rows, raw; rows past the context are
// zeros (their score is masked, and 0 * NaN from an unwritten row would poison P·V).
template <typename T, int D>
__device__ __forceinline__ void load_slices(const T* cache, const Geometry& g, int kvh, int first_key,
                                            int len, int part,
                                            uint4 (&raw)[DecodeTraits<T, D>::kBatch]
                                                        [DecodeTraits<T, D>::kWords]) {
  using Tr = DecodeTraits<T, D>;
#pragma unroll
  for (int i = 0; i < Tr::kBatch; ++i) {
    const int key = first_key + i * Tr::kKeysPerStep;
    const uint4* src = reinterpret_cast<const uint4*>(
        cache + (static_cast<size_t>(key) * g.kv_heads + kvh) * D + part * Tr::kElems);
#pragma unroll
    for (int c = 0; c < Tr::kWords; ++c) raw[i][c] = key < len ? src[c] : make_uint4(0, 0, 0, 0);
  }
}

// G: query heads per block, the GQA group rounded up to a power of two (at most 8), so a lane
// holds q and output slices for exactly the heads it serves.
template <typename T, int D, int G>
__global__ void __launch_bounds__(kSplitThreads)
    flash2_decode_split(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        float* __restrict__ o_part, float2* __restrict__ ml_part, Geometry g,
                        int max_chunks) {
  using Tr = DecodeTraits<T, D>;
  __shared__ float scores[G][kChunk];
  __shared__ float partial[kSplitThreads / 32][G][D];

  const int chunk = blockIdx.x, kvh = blockIdx.y;
  const int g0 = blockIdx.z * G, ng = min(G, g.group - g0);
  const int len = first_position(g) + 1;
  const int key0 = chunk * kChunk;
  if (key0 >= len) return;  // graph-safe grids cover the whole cache

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / Tr::kLanesPerKey;   // which key of a step this lane works on
  const int part = lane % Tr::kLanesPerKey;  // which slice of the row
  const int head0 = kvh * g.group + g0;
  const int lane_key0 = key0 + warp * 32 + sub;  // this lane's key in step 0

  uint4 raw[Tr::kBatch][Tr::kWords];
  load_slices<T, D>(k, g, kvh, lane_key0, len, part, raw);
  float qv[G][Tr::kElems];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    if (gi < ng) {
      load_vec<T, Tr::kElems>(q + static_cast<size_t>(head0 + gi) * D + part * Tr::kElems, qv[gi]);
#pragma unroll
      for (int e = 0; e < Tr::kElems; ++e) qv[gi][e] *= g.scale_log2;
    }
  }

  // Scores.
#pragma unroll
  for (int b = 0; b < Tr::kSteps; b += Tr::kBatch) {
    if (b > 0) load_slices<T, D>(k, g, kvh, lane_key0 + b * Tr::kKeysPerStep, len, part, raw);
#pragma unroll
    for (int i = 0; i < Tr::kBatch; ++i) {
      const int key = lane_key0 + (b + i) * Tr::kKeysPerStep;
      float kv[Tr::kElems];
      unpack_slice<T>(raw[i], kv);
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        if (gi < ng) {  // block-uniform: every lane joins the shuffles
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < Tr::kElems; ++e) s += qv[gi][e] * kv[e];
          s = group_sum<Tr::kLanesPerKey>(s);
          if (part == 0) scores[gi][key - key0] = key < len ? s : -INFINITY;
        }
      }
    }
  }
  load_slices<T, D>(v, g, kvh, lane_key0, len, part, raw);  // V in flight during the softmax
  __syncthreads();

  // Per head: the chunk's maximum, exponentials (flushed when negligible) and their sum.
  for (int gi = warp; gi < ng; gi += kSplitThreads / 32) {
    float x[kChunk / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kChunk / 32; ++i) {
      x[i] = scores[gi][lane + 32 * i];
      mx = fmaxf(mx, x[i]);
    }
    mx = group_max<32>(mx);  // finite: key0 < len, so the chunk has a valid key
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk / 32; ++i) {
      x[i] = exp2_ftz(x[i] - mx);
      scores[gi][lane + 32 * i] = x[i];
      sum += x[i];
    }
    sum = group_sum<32>(sum);
    if (lane == 0) ml_part[static_cast<size_t>(head0 + gi) * max_chunks + chunk] = make_float2(mx, sum);
  }
  __syncthreads();

  // P·V with the same lane layout; each lane accumulates its row slice for every head.
  float o[G][Tr::kElems] = {};
#pragma unroll
  for (int b = 0; b < Tr::kSteps; b += Tr::kBatch) {
    if (b > 0) load_slices<T, D>(v, g, kvh, lane_key0 + b * Tr::kKeysPerStep, len, part, raw);
#pragma unroll
    for (int i = 0; i < Tr::kBatch; ++i) {
      const int key = lane_key0 + (b + i) * Tr::kKeysPerStep;
      float vv[Tr::kElems];
      unpack_slice<T>(raw[i], vv);
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        if (gi < ng) {
          const float p = scores[gi][key - key0];
#pragma unroll
          for (int e = 0; e < Tr::kElems; ++e) o[gi][e] += p * vv[e];
        }
      }
    }
  }
  // Lanes holding the same slice of different keys: fold them, then fold the warps.
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    if (gi < ng) {
#pragma unroll
      for (int e = 0; e < Tr::kElems; ++e) {
#pragma unroll
        for (int off = Tr::kLanesPerKey; off < 32; off *= 2) {
          o[gi][e] += __shfl_xor_sync(0xffffffffu, o[gi][e], off);
        }
        if (sub == 0) partial[warp][gi][part * Tr::kElems + e] = o[gi][e];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ng * D; idx += kSplitThreads) {
    const int gi = idx / D, d = idx % D;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kSplitThreads / 32; ++w) acc += partial[w][gi][d];
    o_part[(static_cast<size_t>(head0 + gi) * max_chunks + chunk) * D + d] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// Decode, fp16 on tensor cores (flash-decoding). One block per (split, kv head, group of up to 16
// query heads): every query head that shares the kv head is a row of one mma tile, so K and V are
// read once per GQA group. The split's keys stream through a kStages-deep cp.async ring of 64-key
// tiles (one barrier per tile), the first tiles requested before the PDL wait; each warp takes 16
// keys of a tile and keeps its own online softmax (S = Q K^T and P V on mma.sync m16n8k16, S kept
// in registers as P), and at the end the four warps are merged through shared memory into the
// split's unnormalised partial. The last block of a unit to arrive combines the partials in one
// pass.

// Most blocks of a decode grid (each holds a partial slot per head it touches).
constexpr int kMaxDecodeSplits = 512;

template <int D>
struct DecodeTcTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHeads = 16;  // mma rows: query heads per block
  static constexpr int kKeys = kWarps * 16;
  // Ring depth: measured on the H100 (32 q / 8 kv heads, d 128, graph replay), 3 stages take
  // 9.3 us at 4096 keys and 50.7 at 32768, 4 stages 9.6 and 49.9, 2 stages are much slower.
  static constexpr int kStages = 3;
  static constexpr int kStageHalves = 2 * kKeys * D;  // K tile then V tile
  static constexpr size_t kRingBytes = sizeof(half) * kStages * kStageHalves;
  // After the ring, the merge area: the warps' partials (kWarps x kHeads rows of D floats, then
  // their m and l). Separate from the ring so that the next segment's tiles load while a segment
  // is merged.
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * kHeads * (D + 2);
  static constexpr size_t kSharedBytes = kRingBytes + kMergeBytes;
  // One block an SM (the ring is 96 KB for D = 128): measured on the H100 (32 q / 8 kv heads,
  // d 128, fp16), one long range per SM streams as fast or faster than two shorter ones (264
  // blocks: 23.3 us at 4096 keys, 71.7 at 32768, vs 14.3 and 54.9 for 128), and any grid that
  // leaves some SMs with two blocks and others with one is much slower (160 blocks: 70 us).
  // The default grid is the largest multiple of the (kv head, head group) count that fits the
  // SMs (decode_partition.h says why not all of them).
};

__device__ __forceinline__ uint32_t load_half2_word(const half* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// atomicAdd with acquire-release semantics at GPU scope; returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Keys in the cache at this decode step (the position + 1), read past L1: a decode kernel reads
// it twice, before and after its dependency wait, and the second read must see a new value.
__device__ __forceinline__ int device_context(const Geometry& g) {
  if (g.device_position == nullptr) return g.start + 1;
  return min(max(__ldcg(g.device_position), 0), g.max_ctx - 1) + 1;
}

template <int D>
__global__ void __launch_bounds__(DecodeTcTraits<D>::kThreads)
    flash2_decode_tc(const half* __restrict__ q, const half* __restrict__ k,
                     const half* __restrict__ v, float* __restrict__ o_part,
                     float2* __restrict__ ml_part, int* __restrict__ arrivals,
                     half* __restrict__ out, Geometry g, int head_groups) {
  using Tr = DecodeTcTraits<D>;
  extern __shared__ uint4 shared16[];
  half* ring = reinterpret_cast<half*>(shared16);
  float* merge = reinterpret_cast<float*>(ring + Tr::kStages * Tr::kStageHalves);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const int b = blockIdx.x;
  const int units = g.kv_heads * head_groups;

  // The partition for context `len`: the blocks that hold keys and this block's flat range.
  int len = 0, blocks = 0;
  int64_t work = 0, end = 0, at = 0;  // at: flat key where the current segment starts
  auto partition = [&](int context) {
    len = context;
    work = static_cast<int64_t>(units) * len;
    blocks = decode_blocks(work, gridDim.x, units);
    at = decode_block_begin(work, blocks, b);
    end = decode_block_begin(work, blocks, b + 1);
  };

  // The block's range as segments, one per unit (kv head, head group) it touches.
  struct Segment {
    int unit, kvh, h0, ng, kbeg, kend, n_tiles;
  };
  auto segment_at = [&](int64_t flat) {
    Segment s;
    s.unit = static_cast<int>(flat / len);
    s.kvh = s.unit / head_groups;
    s.h0 = (s.unit % head_groups) * Tr::kHeads;
    s.ng = min(Tr::kHeads, g.group - s.h0);
    const int64_t unit0 = static_cast<int64_t>(s.unit) * len;
    s.kbeg = static_cast<int>(flat - unit0);
    s.kend = static_cast<int>(min(end - unit0, static_cast<int64_t>(len)));
    s.n_tiles = (s.kend - s.kbeg + Tr::kKeys - 1) / Tr::kKeys;
    return s;
  };
  auto load = [&](const Segment& s, int tile) {
    half* kt = ring + (tile % Tr::kStages) * Tr::kStageHalves;
    cp_async_kv_tiles<D, Tr::kKeys, Tr::kThreads>(k, v, g.kv_heads, s.kvh,
                                                  s.kbeg + tile * Tr::kKeys, s.kend, kt,
                                                  kt + Tr::kKeys * D);
  };
  auto prologue = [&](const Segment& s) {
#pragma unroll
    for (int t = 0; t < Tr::kStages - 1; ++t) {
      if (t < s.n_tiles) load(s, t);
      cp_async_commit();  // empty groups keep the wait counts uniform
    }
  };

  // Launched with PDL. Every kernel of a step waits before it lets its dependents start, so when
  // this block runs, every kernel but the one just before has finished; that one (qk-norm, RoPE
  // and the cache write) may still be writing q, the newest K/V row (key len - 1) and, for all
  // this kernel can assume, the position. So before the wait the block reads the position as a
  // guess and starts loading the first tiles of its range under it, which hides the first
  // tiles' latency behind the kernel before; after the wait it reads the position again and
  // keeps those tiles only when the position is unchanged and they do not hold the newest row.
  // The next kernel (the o-projection) may start right away: it only prefetches weights before
  // its own wait.
  const int guess = device_context(g);
  partition(guess);
  Segment seg = segment_at(at);
  const bool early = b < blocks && (seg.kend < len || seg.n_tiles > Tr::kStages - 1);
  if (early) prologue(seg);
  cuda::grid_dependency_wait();
  cuda::grid_launch_dependents();

  const int context = device_context(g);
  if (!early || context != guess) {
    cp_async_wait<0>();  // the early copies land before the ring is reused
    partition(context);
    if (b >= blocks) return;  // graph-safe grids are sized for the capacity
    seg = segment_at(at);
    prologue(seg);
  }

  // Q as A fragments straight from global memory: row r of the tile is head h0 + r of the group
  // (zeros past the group); registers [0], [2] hold row lane / 4, [1], [3] row lane / 4 + 8.
  uint32_t qf[D / 16][4];
  auto load_q = [&](const Segment& s) {
    const half* qa = q + static_cast<size_t>(s.kvh * g.group + s.h0 + qr) * D + qc;
    const half* qb = qa + 8 * D;
    const bool row_a = qr < s.ng, row_b = qr + 8 < s.ng;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][0] = row_a ? load_half2_word(qa + kk * 16) : 0u;
      qf[kk][1] = row_b ? load_half2_word(qb + kk * 16) : 0u;
      qf[kk][2] = row_a ? load_half2_word(qa + kk * 16 + 8) : 0u;
      qf[kk][3] = row_b ? load_half2_word(qb + kk * 16 + 8) : 0u;
    }
  };

  load_q(seg);

  for (;;) {
    float o[D / 8][4] = {};
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    for (int it = 0; it < seg.n_tiles; ++it) {
      cp_async_wait<Tr::kStages - 2>();  // tile `it` has landed (for this thread's copies)
      __syncthreads();                   // ... for everyone's, and tile it - 1 is no longer read
      if (it + Tr::kStages - 1 < seg.n_tiles) load(seg, it + Tr::kStages - 1);
      cp_async_commit();

      const int key0 = seg.kbeg + it * Tr::kKeys + warp * 16;
      if (key0 < seg.kend) {  // warp-uniform; key0 itself is valid, so the maxima are finite
        const half* kt = ring + (it % Tr::kStages) * Tr::kStageHalves;
        float s[2][4] = {};
        mma_qk<D, 16>(s, qf, kt, warp * 16);
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + j * 8 + qc + (e & 1);
            s[j][e] = key < seg.kend ? s[j][e] * g.scale_log2 : -INFINITY;
          }
          mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
          mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
        }
        const float m_new_a = fmaxf(m_a, group_max<4>(mx_a));
        const float m_new_b = fmaxf(m_b, group_max<4>(mx_b));
        const float alpha_a = fast_exp2(m_a - m_new_a), alpha_b = fast_exp2(m_b - m_new_b);
        m_a = m_new_a;
        m_b = m_new_b;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          s[j][0] = exp2_ftz(s[j][0] - m_a);
          s[j][1] = exp2_ftz(s[j][1] - m_a);
          s[j][2] = exp2_ftz(s[j][2] - m_b);
          s[j][3] = exp2_ftz(s[j][3] - m_b);
        }
        l_a = l_a * alpha_a + (s[0][0] + s[0][1] + s[1][0] + s[1][1]);
        l_b = l_b * alpha_b + (s[0][2] + s[0][3] + s[1][2] + s[1][3]);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[n][0] *= alpha_a;
          o[n][1] *= alpha_a;
          o[n][2] *= alpha_b;
          o[n][3] *= alpha_b;
        }
        mma_pv<D, 16>(o, s, kt + Tr::kKeys * D, warp * 16);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free, and the merge area from the last segment

    // The next segment's first tiles load while this one is merged and written (and combined).
    const Segment cur = seg;
    const int64_t next = static_cast<int64_t>(cur.unit + 1) * len;
    const bool more = next < end;
    if (more) {
      seg = segment_at(next);
      prologue(seg);
    }

    // Merge the warps through shared memory. A warp that saw no key (a segment shorter than its
    // offset) has m = -inf and weight 0 below.
    float* mo = merge;                             // [warp][row][D]
    float* mm = mo + Tr::kWarps * Tr::kHeads * D;  // [warp][row] maxima
    float* ml = mm + Tr::kWarps * Tr::kHeads;      // [warp][row] sums
    l_a = group_sum<4>(l_a);
    l_b = group_sum<4>(l_b);
    float* wo = mo + warp * Tr::kHeads * D;
    const bool keep_a = qr < cur.ng, keep_b = qr + 8 < cur.ng;  // rows past the group are zeros
    if (lane % 4 == 0) {
      if (keep_a) mm[warp * Tr::kHeads + qr] = m_a;
      if (keep_b) mm[warp * Tr::kHeads + qr + 8] = m_b;
      if (keep_a) ml[warp * Tr::kHeads + qr] = l_a;
      if (keep_b) ml[warp * Tr::kHeads + qr + 8] = l_b;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if (keep_a) *reinterpret_cast<float2*>(wo + qr * D + n * 8 + qc) = make_float2(o[n][0], o[n][1]);
      if (keep_b) {
        *reinterpret_cast<float2*>(wo + (qr + 8) * D + n * 8 + qc) = make_float2(o[n][2], o[n][3]);
      }
    }
    if (more) load_q(seg);  // its latency overlaps the merge
    __syncthreads();
    // Partials of head h live at slots h * gridDim.x + (block), one per block touching its unit;
    // a thread writes a float4 of one.
    const int head0 = cur.kvh * g.group + cur.h0;
    for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
      const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, mm[w * Tr::kHeads + r]);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) {
        const float wt = fast_exp2(mm[w * Tr::kHeads + r] - mx);  // finite mx: warp 0 saw kbeg
        const float4 x = *reinterpret_cast<const float4*>(mo + (w * Tr::kHeads + r) * D + d);
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
        sum += wt * ml[w * Tr::kHeads + r];
      }
      const size_t slot = static_cast<size_t>(head0 + r) * gridDim.x + b;
      *reinterpret_cast<float4*>(o_part + slot * D + d) = acc;
      if (d == 0) ml_part[slot] = make_float2(mx, sum);
    }

    // The combine, fused: the last block touching this unit to finish merges every block's
    // partial of it. The arrival is one acquire-release atomic by thread 0 after a barrier (the
    // barrier orders the block's partial writes before the release; the acquire, then the
    // barrier after it, orders the last block's reads of the others' partials after theirs),
    // and the partials are read through L2. The last block also resets the counter, so the next
    // launch (or graph replay) starts from zero.
    const int64_t unit0 = static_cast<int64_t>(cur.unit) * len;
    const int first = decode_block_of(work, blocks, unit0);
    const int used = decode_block_of(work, blocks, unit0 + len - 1) - first + 1;
    __shared__ int is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = arrivals + cur.unit;
      is_last = atomic_add_acq_rel(counter, 1) == used - 1;
      if (is_last) *counter = 0;
    }
    __syncthreads();
    if (is_last) {
      // One pass: a thread owns a float4 of one head's output and reads every partial's (m, l)
      // with its output slice, keeping a running maximum (online softmax over the partials), so
      // the partials' loads are all in flight at once: one L2 round trip, no barrier.
      for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
        const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const int h = head0 + r;
        const size_t slot0 = static_cast<size_t>(h) * gridDim.x + first;
        const float2* ml_h = ml_part + slot0;
        const float4* o_h = reinterpret_cast<const float4*>(o_part + slot0 * D + d);
        float mx = -INFINITY, sum = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
        for (int c = 0; c < used; ++c) {
          const float2 x = __ldcg(&ml_h[c]);
          const float4 y = __ldcg(o_h + c * (D / 4));
          const float m_new = fmaxf(mx, x.x);  // finite: every partial saw at least one key
          const float scale = fast_exp2(mx - m_new), wt = fast_exp2(x.x - m_new);
          mx = m_new;
          sum = sum * scale + wt * x.y;
          acc.x = acc.x * scale + wt * y.x;
          acc.y = acc.y * scale + wt * y.y;
          acc.z = acc.z * scale + wt * y.z;
          acc.w = acc.w * scale + wt * y.w;
        }
        const float inv = 1.0f / sum;
        const float res[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
        store_vec<half, 4>(out + static_cast<size_t>(h) * D + d, res);
      }
    }
    if (!more) break;
    // The loop's first barrier orders this segment's merge-area reads before the next writes.
  }
}

// ---------------------------------------------------------------------------------------------

class Flash2Attention final : public AttentionOp {
 public:
  explicit Flash2Attention(const AttentionRequest& r) : request_(r) {}
  const char* name() const override {
    if (request_.phase == AttentionPhase::kPrefill) return "cuda-flash2-prefill";
    return request_.graph_safe ? "cuda-flash2-decode-gpu-pos" : "cuda-flash2-decode";
  }

  Status forward(const AttentionArgs& a) override {
    KUIPER_RETURN_IF_ERROR(check_cuda_call(a, request_));
    const Geometry g = make_geometry(a, request_.graph_safe);
    return with_instantiation(request_.dtype, request_.head_dim, [&](auto tt, auto dt) -> Status {
      using T = typename decltype(tt)::type;
      constexpr int D = decltype(dt)::value;
      if (request_.phase == AttentionPhase::kPrefill) return prefill<T, D>(a, g);
      return decode<T, D>(a, g);
    });
  }

 private:
  template <typename T, int D>
  Status prefill(const AttentionArgs& a, const Geometry& g) {
    if constexpr (std::is_same_v<T, half>) {
      using Tr = TensorCoreTraits<D>;
      auto kernel = flash2_prefill_tc<D>;
      KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash2_prefill_tc<D>>(Tr::kSharedBytes)));
      const int row_blocks = (g.T * g.group + Tr::kRows - 1) / Tr::kRows;
      kernel<<<dim3(row_blocks, g.kv_heads), Tr::kThreads, Tr::kSharedBytes, cuda::stream()>>>(
          a.q.data<half>(), a.k_cache.data<half>(), a.v_cache.data<half>(), a.out.data<half>(), g);
      KUIPER_CUDA_CHECK_LAUNCH("flash2_prefill_tc");
      return Status::Ok();
    } else {
      // fp32 stays on SIMT: tensor cores would round its operands to tf32 (10-bit mantissa),
      // outside what an fp32 path promises.
      using Tr = PrefillTraits<D>;
      auto kernel = flash2_prefill<T, D>;
      KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash2_prefill<T, D>>(Tr::kSharedBytes)));
      const int row_blocks = (g.T * g.group + Tr::kRows - 1) / Tr::kRows;
      kernel<<<dim3(row_blocks, g.kv_heads), Tr::kThreads, Tr::kSharedBytes, cuda::stream()>>>(
          a.q.data<T>(), a.k_cache.data<T>(), a.v_cache.data<T>(), a.out.data<T>(), g);
      KUIPER_CUDA_CHECK_LAUNCH("flash2_prefill");
      return Status::Ok();
    }
  }

  template <typename T, int D>
  Status decode(const AttentionArgs& a, const Geometry& g) {
    if constexpr (std::is_same_v<T, half>) {
      return decode_tc<D>(a, g);
    } else {
      // fp32: one block per kChunk keys of the cache (the SIMT kernel's fixed chunk).
      const int splits = (g.max_ctx + kChunk - 1) / kChunk;
      const int used = request_.graph_safe ? splits : (g.start + kChunk) / kChunk;
      const dim3 grid(used, g.kv_heads, (g.group + kMaxGroupPerBlock - 1) / kMaxGroupPerBlock);
      // Partials for every split: fixed per op and cache, so the same buffers serve every step.
      const size_t slots = static_cast<size_t>(g.heads) * splits;
      KUIPER_ASSIGN_OR_RETURN(float* o_part, o_scratch_.floats(slots * D));
      KUIPER_ASSIGN_OR_RETURN(float* ml, ml_scratch_.floats(slots * 2));
      float2* ml_part = reinterpret_cast<float2*>(ml);
      auto launch = [&](auto kernel) {
        kernel<<<grid, kSplitThreads, 0, cuda::stream()>>>(a.q.data<T>(), a.k_cache.data<T>(),
                                                           a.v_cache.data<T>(), o_part, ml_part,
                                                           g, splits);
      };
      if (g.group == 1) launch(flash2_decode_split<T, D, 1>);
      else if (g.group == 2) launch(flash2_decode_split<T, D, 2>);
      else if (g.group <= 4) launch(flash2_decode_split<T, D, 4>);
      else launch(flash2_decode_split<T, D, kMaxGroupPerBlock>);
      KUIPER_CUDA_CHECK_LAUNCH("flash2_decode_split");
      combine_splits<T, D><<<g.heads, kCombineThreads, 0, cuda::stream()>>>(
          o_part, ml_part, a.out.data<T>(), g, splits, kChunk);
      KUIPER_CUDA_CHECK_LAUNCH("combine_splits");
      return Status::Ok();
    }
  }

  // fp16: one grid of blocks (request.decode_splits when set, else the largest multiple of the
  // unit count that fits the SMs; at most kMaxDecodeSplits) over which the (kv head, head group,
  // key) work is spread evenly on the device (decode_partition.h). The grid depends only on the SM count and the context known on
  // the host (the cache capacity when graph-safe), so a captured launch replays at any position.
  template <int D>
  Status decode_tc(const AttentionArgs& a, const Geometry& g) {
    using Tr = DecodeTcTraits<D>;
    const int head_groups = (g.group + Tr::kHeads - 1) / Tr::kHeads;
    const int units = g.kv_heads * head_groups;
    const int ctx = request_.graph_safe ? g.max_ctx : g.start + 1;
    int grid = request_.decode_splits;
    if (grid <= 0) {
      KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
      grid = sms >= units ? sms / units * units : sms;
    }
    grid = decode_blocks(static_cast<int64_t>(units) * ctx, std::min(grid, kMaxDecodeSplits), units);
    const size_t slots = static_cast<size_t>(g.heads) * grid;
    KUIPER_ASSIGN_OR_RETURN(float* o_part, o_scratch_.floats(slots * D));
    KUIPER_ASSIGN_OR_RETURN(float* ml, ml_scratch_.floats(slots * 2));
    auto kernel = flash2_decode_tc<D>;
    KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash2_decode_tc<D>>(Tr::kSharedBytes)));
    KUIPER_ASSIGN_OR_RETURN(int* arrivals, arrival_counters(units));
    // PDL: what the kernel may read before its wait is in the kernel.
    return cuda::launch_pdl(kernel, dim3(grid), dim3(Tr::kThreads), Tr::kSharedBytes,
                            "flash2_decode_tc", a.q.data<half>(), a.k_cache.data<half>(),
                            a.v_cache.data<half>(), o_part, reinterpret_cast<float2*>(ml),
                            arrivals, a.out.data<half>(), g, head_groups);
  }

  // Zeroed int counters, one per (kv head, head group) of the fused decode; each launch leaves
  // them at zero again. Allocated on the first call, before any graph capture.
  Result<int*> arrival_counters(size_t n) {
    if (n > arrivals_capacity_) {
      KUIPER_ASSIGN_OR_RETURN(arrivals_, Tensor::empty({static_cast<int64_t>(n)}, DataType::kInt32,
                                                       DeviceType::kCuda));
      KUIPER_CUDA_CHECK(cudaMemsetAsync(arrivals_.data<int>(), 0, n * sizeof(int), cuda::stream()));
      arrivals_capacity_ = n;
    }
    return arrivals_.data<int>();
  }

  AttentionRequest request_;
  Scratch o_scratch_;
  Scratch ml_scratch_;
  Tensor arrivals_;
  size_t arrivals_capacity_ = 0;
};

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_flash2_attention(const AttentionRequest& request) {
  return std::unique_ptr<AttentionOp>(new Flash2Attention(request));
}

}  // namespace kuiper::op::cuda_attention
