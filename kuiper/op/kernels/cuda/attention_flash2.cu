// FlashAttention-2 style kernels.
//
// Prefill (flash2_prefill, fp32 SIMT; flash2_prefill_tc, fp16 tensor cores): a block owns 32 rows ((query, head) pairs of one kv head, packed as
// in flash1) and each warp owns 8 of them outright, so the softmax needs warp shuffles only and
// a KV tile costs two block barriers (load, then reuse). Tiles are small (32 keys), the row sum
// stays per lane until the very end and the output is normalised once (delayed
// normalisation), and exponentials negligible against the row maximum are flushed to zero.
//
// Decode (flash-decoding): one query cannot fill the GPU from a single KV pass, so the context
// is split into fixed chunks of kChunk keys, one block per (chunk, kv head, group of <= 8 query
// heads); inside a block the four warps split the chunk between them. Each block writes an
// unnormalised partial output with its maximum and sum; a combine kernel merges the chunks.
// Partial buffers are sized for the whole cache, and the graph-safe variant launches the grid
// for the whole cache too (chunks past the position exit at once), so nothing about a decode
// step depends on the position except what the kernels read from the device.
#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention_common.cuh"

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
// mma.sync m16n8k16 (fp16 in, fp32 accumulate). A block owns 64 rows, each warp 16 of them (one
// mma row tile); KV tiles of 64 keys are double-buffered in shared memory by cp.async so the
// next tile loads while this one is computed. S stays in registers: its accumulator layout is
// exactly the A-operand layout of the P·V product, so P never touches shared memory.

template <int D>
struct TensorCoreTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;
  static constexpr int kKeys = 64;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  // Q, then two stages of K, then two of V.
  static constexpr size_t kSharedBytes = sizeof(half) * (static_cast<size_t>(kRows) + 4 * kKeys) * D;
};

// Rows are D halves; chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows an
// ldmatrix reads (same logical chunk) fall in 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t swizzled(const half* tile, int row, int chunk) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(tile + row * D + ((chunk ^ (row & 7)) * 8)));
}

// Copies 16 bytes global -> shared without passing through registers; with valid == false the
// destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for a 16x16 fp16 A (row-major fragments), a 16x8 fp16 B, a 16x8 fp32 C.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

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
    half* kt = ks + stage * Tr::kKeys * D;
    half* vt = vs + stage * Tr::kKeys * D;
    for (int c = threadIdx.x; c < Tr::kKeys * Tr::kChunks; c += Tr::kThreads) {
      const int r = c / Tr::kChunks, ch = c % Tr::kChunks, key = tile * Tr::kKeys + r;
      const bool valid = key < kv_end;  // never read cache rows past the context
      const size_t offset = valid ? (static_cast<size_t>(key) * g.kv_heads + kvh) * D + ch * 8 : 0;
      cp_async16(swizzled<D>(kt, r, ch), k + offset, valid);
      cp_async16(swizzled<D>(vt, r, ch), v + offset, valid);
    }
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
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < Tr::kKeys / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, swizzled<D>(kt, np * 16 + lane % 8 + (lane / 16) * 8,
                                     kk * 2 + (lane / 8) % 2));
          mma_16816(s[2 * np], qf[kk], b[0], b[1]);
          mma_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      }

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

#pragma unroll
      for (int kk = 0; kk < Tr::kKeys / 16; ++kk) {
        const uint32_t a[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]),
                               pack_half2(s[2 * kk][2], s[2 * kk][3]),
                               pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, swizzled<D>(vt, kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                           np * 2 + lane / 16));
          mma_16816(o[2 * np], a, b[0], b[1]);
          mma_16816(o[2 * np + 1], a, b[2], b[3]);
        }
      }
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
constexpr int kCombineThreads = 256;

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

// out = sum_c o_c * 2^(m_c - M) / sum_c l_c * 2^(m_c - M): the one normalisation of decode.
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads)
    flash2_decode_combine(const float* __restrict__ o_part, const float2* __restrict__ ml_part,
                          T* __restrict__ out, Geometry g, int max_chunks) {
  constexpr int kLanesPerRow = D / 4;  // float4 per lane
  constexpr int kSlices = kCombineThreads / kLanesPerRow;
  __shared__ float reduce[kCombineThreads / 32];
  __shared__ float4 partial[kSlices][kLanesPerRow];
  const int h = blockIdx.x;
  const int chunks = (first_position(g) + 1 + kChunk - 1) / kChunk;
  const float2* ml = ml_part + static_cast<size_t>(h) * max_chunks;

  float mx = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += kCombineThreads) mx = fmaxf(mx, ml[c].x);
  mx = block_reduce<kCombineThreads, true>(mx, reduce);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += kCombineThreads) sum += ml[c].y * fast_exp2(ml[c].x - mx);
  sum = block_reduce<kCombineThreads, false>(sum, reduce);

  const int slice = threadIdx.x / kLanesPerRow, part = threadIdx.x % kLanesPerRow;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int c = slice; c < chunks; c += kSlices) {
    const float w = fast_exp2(ml[c].x - mx);
    const float4 x =
        reinterpret_cast<const float4*>(o_part + (static_cast<size_t>(h) * max_chunks + c) * D)[part];
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
  }
  partial[slice][part] = acc;
  __syncthreads();
  if (threadIdx.x < kLanesPerRow) {
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      total.x += partial[s][threadIdx.x].x;
      total.y += partial[s][threadIdx.x].y;
      total.z += partial[s][threadIdx.x].z;
      total.w += partial[s][threadIdx.x].w;
    }
    const float inv = 1.0f / sum;
    const float res[4] = {total.x * inv, total.y * inv, total.z * inv, total.w * inv};
    store_vec<T, 4>(out + static_cast<size_t>(h) * D + threadIdx.x * 4, res);
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
    // Partials for every chunk of the cache: fixed, so the same buffers serve every position.
    const int max_chunks = (g.max_ctx + kChunk - 1) / kChunk;
    const size_t slots = static_cast<size_t>(g.heads) * max_chunks;
    KUIPER_ASSIGN_OR_RETURN(float* o_part, o_scratch_.floats(slots * D));
    KUIPER_ASSIGN_OR_RETURN(float* ml, ml_scratch_.floats(slots * 2));
    float2* ml_part = reinterpret_cast<float2*>(ml);
    const int chunks = request_.graph_safe ? max_chunks : (g.start + 1 + kChunk - 1) / kChunk;
    const dim3 grid(chunks, g.kv_heads, (g.group + kMaxGroupPerBlock - 1) / kMaxGroupPerBlock);
    auto launch = [&](auto kernel) {
      kernel<<<grid, kSplitThreads, 0, cuda::stream()>>>(a.q.data<T>(), a.k_cache.data<T>(),
                                                         a.v_cache.data<T>(), o_part, ml_part, g,
                                                         max_chunks);
    };
    if (g.group == 1) launch(flash2_decode_split<T, D, 1>);
    else if (g.group == 2) launch(flash2_decode_split<T, D, 2>);
    else if (g.group <= 4) launch(flash2_decode_split<T, D, 4>);
    else launch(flash2_decode_split<T, D, kMaxGroupPerBlock>);
    KUIPER_CUDA_CHECK_LAUNCH("flash2_decode_split");
    flash2_decode_combine<T, D><<<g.heads, kCombineThreads, 0, cuda::stream()>>>(
        o_part, ml_part, a.out.data<T>(), g, max_chunks);
    KUIPER_CUDA_CHECK_LAUNCH("flash2_decode_combine");
    return Status::Ok();
  }

  AttentionRequest request_;
  Scratch o_scratch_;
  Scratch ml_scratch_;
};

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_flash2_attention(const AttentionRequest& request) {
  return std::unique_ptr<AttentionOp>(new Flash2Attention(request));
}

}  // namespace kuiper::op::cuda_attention
