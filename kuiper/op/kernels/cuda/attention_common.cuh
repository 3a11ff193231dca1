// Pieces shared by the CUDA attention kernels (mha, flash1, flash2): the problem geometry every
// kernel receives, element traits for fp32/fp16 (arithmetic is always fp32), vector loads, warp
// reductions, and the host-side argument checks and (dtype, head_dim) instantiation switch.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "kuiper/base/cuda_runtime.h"
#include "kuiper/op/attention.h"
#include "kuiper/op/kernels/cuda/primitives.cuh"

namespace kuiper::op::cuda_attention {

using cuda::allow_shared_memory;
using cuda::block_reduce;
using cuda::group_max;
using cuda::group_sum;
using cuda::sm_count;
using cuda::TypeTag;

// Everything a kernel needs besides the data pointers. Scores are kept in the log2 domain
// (q is pre-multiplied by scale * log2(e)) so that each exponential is a single ex2 instruction.
struct Geometry {
  int T;         // queries in this call
  int heads;     // query heads
  int kv_heads;  // key/value heads
  int group;     // heads / kv_heads: query heads sharing one kv head
  int max_ctx;   // rows of the KV cache
  int start;     // position of query 0 (host-known)
  // Graph-safe decode: the position of the single query is read here instead of `start`, so a
  // captured graph replays correctly at every step.
  const int* device_position;
  float scale_log2;
};

// Position of query 0. A device position outside the cache is clamped rather than trusted: a
// replayed graph must never read past the cache, whatever the host wrote.
__device__ __forceinline__ int first_position(const Geometry& g) {
  if (g.device_position == nullptr) return g.start;
  return min(max(*g.device_position, 0), g.max_ctx - 1);
}

// ex2.approx with flush-to-zero: relative error 2^-22, far below fp32 test tolerances, one
// instruction instead of exp2f's range handling. -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Flash-style kernels flush exponentials below 2^-kNegligibleLog2 of the running maximum to
// zero. The maximum itself contributes 1 to the softmax denominator, so even 128k flushed terms
// move the result by at most 2^17 * 2^-32 = 3e-5 relative, under fp16 output rounding; in
// exchange no denormal ever enters the PV accumulation.
constexpr float kNegligibleLog2 = 32.0f;
__device__ __forceinline__ float exp2_ftz(float x) {
  return x < -kNegligibleLog2 ? 0.0f : fast_exp2(x);
}

// How a storage type packs into 32-bit words; every load goes through whole words.
template <typename T>
struct Word;
template <>
struct Word<float> {
  static constexpr int kElems = 1;
  __device__ static void unpack(uint32_t w, float* out) { out[0] = __uint_as_float(w); }
  __device__ static uint32_t pack(const float* in) { return __float_as_uint(in[0]); }
};
template <>
struct Word<half> {
  static constexpr int kElems = 2;
  __device__ static void unpack(uint32_t w, float* out) {
    __half2_raw raw;
    raw.x = static_cast<unsigned short>(w & 0xffffu);
    raw.y = static_cast<unsigned short>(w >> 16);
    float2 f = __half22float2(__half2(raw));
    out[0] = f.x;
    out[1] = f.y;
  }
  __device__ static uint32_t pack(const float* in) {
    __half2_raw raw = __half2(__floats2half2_rn(in[0], in[1]));
    return static_cast<uint32_t>(raw.x) | (static_cast<uint32_t>(raw.y) << 16);
  }
};

// Loads N consecutive elements as fp32 using the widest aligned accesses (16, 8 or 4 bytes).
// `src` must be aligned to the access width, which holds for every row/lane offset used here.
template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* src, float* dst) {
  constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords * 4 == N * static_cast<int>(sizeof(T)), "whole words only");
  uint32_t w[kWords];
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 4; ++c) {
      uint4 v = reinterpret_cast<const uint4*>(src)[c];
      w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 2; ++c) {
      uint2 v = reinterpret_cast<const uint2*>(src)[c];
      w[2 * c] = v.x, w[2 * c + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kWords; ++c) w[c] = reinterpret_cast<const uint32_t*>(src)[c];
  }
#pragma unroll
  for (int c = 0; c < kWords; ++c) Word<T>::unpack(w[c], dst + c * Word<T>::kElems);
}

// Stages the query rows [r0, r0 + kRows) of kv head `kvh` into shared memory (row stride
// `stride` floats), pre-scaled into the log2 domain. Row r of a kv head's tile is query
// r / group of head kvh * group + r % group, so a tile holds every query head that shares the
// head's keys; rows past the last query are zeros and never stored.
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void stage_q_tile(const T* __restrict__ q, const Geometry& g, int kvh,
                                             int r0, int total_rows, float* qs, int stride) {
  for (int c = threadIdx.x; c < kRows * (D / 8); c += kThreads) {
    const int r = c / (D / 8), d = (c % (D / 8)) * 8;
    const int row = r0 + r;
    float x[8] = {};
    if (row < total_rows) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      load_vec<T, 8>(q + (static_cast<size_t>(t) * g.heads + h) * D + d, x);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) qs[r * stride + d + i] = x[i] * g.scale_log2;
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* dst, const float* src) {
  constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords * 4 == N * static_cast<int>(sizeof(T)), "whole words only");
  uint32_t w[kWords];
#pragma unroll
  for (int c = 0; c < kWords; ++c) w[c] = Word<T>::pack(src + c * Word<T>::kElems);
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 4; ++c) {
      reinterpret_cast<uint4*>(dst)[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 2; ++c) reinterpret_cast<uint2*>(dst)[c] = make_uint2(w[2 * c], w[2 * c + 1]);
  } else {
#pragma unroll
    for (int c = 0; c < kWords; ++c) reinterpret_cast<uint32_t*>(dst)[c] = w[c];
  }
}

// Copies rows [row0, row0 + kRows) of one kv head of a cache into a shared fp32 tile with row
// stride kStride floats; rows at or past `valid_end` become zeros, never reads of the cache
// beyond the valid prefix (those rows may hold anything, NaN included, and 0 * NaN is NaN).
template <typename T, int D, int kRows, int kStride, int kThreads>
__device__ __forceinline__ void load_kv_tile(const T* cache, int kv_heads, int kvh, int row0,
                                             int valid_end, float* tile) {
  constexpr int kChunksPerRow = D / 8;
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, d = (c % kChunksPerRow) * 8;
    float v[8];
    if (row0 + r < valid_end) {
      load_vec<T, 8>(cache + (static_cast<size_t>(row0 + r) * kv_heads + kvh) * D + d, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    float4* dst = reinterpret_cast<float4*>(tile + r * kStride + d);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// ---- tensor-core building blocks (fp16 in, fp32 accumulate), shared by flash1 and flash2 ----

// Rows are D halves; 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows an
// ldmatrix reads (same logical chunk) fall in 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t swizzled(const half* tile, int row, int chunk) {
  static_assert(D / 8 >= 8, "the swizzle permutes 8 chunks");
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

// Copies rows [0, kRows) of a K tile and the V tile of the same keys, starting at cache row
// `key0` of kv head `kvh`, into swizzled shared tiles by cp.async (not committed); one address
// computation serves both. Rows at or past `key_end` are zero-filled and never read: cache rows
// past the context may hold anything, NaN included.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void cp_async_kv_tiles(const half* k, const half* v, int kv_heads,
                                                  int kvh, int key0, int key_end, half* k_tile,
                                                  half* v_tile) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks, key = key0 + r;
    const bool valid = key < key_end;
    const size_t offset = valid ? (static_cast<size_t>(key) * kv_heads + kvh) * D + ch * 8 : 0;
    cp_async16(swizzled<D>(k_tile, r, ch), k + offset, valid);
    cp_async16(swizzled<D>(v_tile, r, ch), v + offset, valid);
  }
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

// S[16 rows][kKeys] += Q K^T for one warp: `qf` holds the warp's 16 query rows as A fragments
// (D / 16 of them), `kt` a swizzled K tile whose rows key_row0 .. key_row0 + kKeys - 1 are used.
// s[j] is the accumulator of keys 8j .. 8j + 7: row lane / 4 in [0], [1], row lane / 4 + 8 in
// [2], [3], keys (lane % 4) * 2 and + 1.
template <int D, int kKeys>
__device__ __forceinline__ void mma_qk(float (&s)[kKeys / 8][4], const uint32_t (&qf)[D / 16][4],
                                       const half* kt, int key_row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, swizzled<D>(kt, key_row0 + np * 16 + lane % 8 + (lane / 16) * 8,
                                 kk * 2 + (lane / 8) % 2));
      mma_16816(s[2 * np], qf[kk], b[0], b[1]);
      mma_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
    }
  }
}

// o[16 rows][D] += P V for one warp: P is the S accumulator of mma_qk (already exponentiated),
// whose layout is exactly the A fragment of this product, so P never touches shared memory.
template <int D, int kKeys>
__device__ __forceinline__ void mma_pv(float (&o)[D / 8][4], const float (&p)[kKeys / 8][4],
                                       const half* vt, int key_row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {pack_half2(p[2 * kk][0], p[2 * kk][1]),
                           pack_half2(p[2 * kk][2], p[2 * kk][3]),
                           pack_half2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_half2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, swizzled<D>(vt, key_row0 + kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                       np * 2 + lane / 16));
      mma_16816(o[2 * np], a, b[0], b[1]);
      mma_16816(o[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// ---- split-KV decode (flash-decoding): plan and combine, shared by flash1 and flash2 ----
//
// A decode launch has a fixed number of splits per kv head (the grid's split dimension, chosen
// on the host from the SM count and the cache capacity, never from the position). Each split
// takes split_keys(len, splits, granularity) consecutive keys of the len = position + 1 keys the
// query sees, computed on the device from the position, so one captured graph serves every
// step; splits past the context exit at once.
__host__ __device__ __forceinline__ int split_keys(int len, int splits, int granularity) {
  const int per = (len + splits - 1) / splits;
  const int rounded = (per + granularity - 1) / granularity * granularity;
  return rounded > granularity ? rounded : granularity;
}

// out = sum_c o_c * 2^(m_c - M) / sum_c l_c * 2^(m_c - M) over the splits c that hold keys:
// o_c is split c's unnormalised output (sum_j 2^(s_j - m_c) v_j), (m_c, l_c) its maximum and
// exponential sum, at slot head * max_splits + c.
constexpr int kCombineThreads = 256;
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads)
    combine_splits(const float* __restrict__ o_part, const float2* __restrict__ ml_part,
                   T* __restrict__ out, Geometry g, int max_splits, int granularity) {
  constexpr int kLanesPerRow = D / 4;  // float4 per lane
  constexpr int kSlices = kCombineThreads / kLanesPerRow;
  __shared__ float reduce[kCombineThreads / 32];
  __shared__ float4 partial[kSlices][kLanesPerRow];
  const int h = blockIdx.x;
  const int len = first_position(g) + 1;
  const int per = split_keys(len, max_splits, granularity);
  const int used = (len + per - 1) / per;
  const float2* ml = ml_part + static_cast<size_t>(h) * max_splits;

  float mx = -INFINITY;
  for (int c = threadIdx.x; c < used; c += kCombineThreads) mx = fmaxf(mx, ml[c].x);
  mx = block_reduce<kCombineThreads, true>(mx, reduce);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < used; c += kCombineThreads) sum += ml[c].y * fast_exp2(ml[c].x - mx);
  sum = block_reduce<kCombineThreads, false>(sum, reduce);

  const int slice = threadIdx.x / kLanesPerRow, part = threadIdx.x % kLanesPerRow;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int c = slice; c < used; c += kSlices) {
    const float w = fast_exp2(ml[c].x - mx);
    const float4 x =
        reinterpret_cast<const float4*>(o_part + (static_cast<size_t>(h) * max_splits + c) * D)[part];
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

// ---- host side ----

inline const char* phase_name(AttentionPhase p) {
  return p == AttentionPhase::kPrefill ? "prefill" : "decode";
}

// "flash2 decode fp16 head_dim 128 graph-safe": how errors name a combination.
inline std::string describe(const AttentionRequest& r) {
  return std::string(attention_name(r.kind)) + " " + phase_name(r.phase) + " " +
         dtype_name(r.dtype) + " head_dim " + std::to_string(r.head_dim) +
         (r.graph_safe ? " graph-safe" : "");
}

// What every CUDA op checks on each call beyond check_attention_args: the call matches the
// request the op was made for, and everything lives on the GPU.
inline Status check_cuda_call(const AttentionArgs& a, const AttentionRequest& r) {
  KUIPER_RETURN_IF_ERROR(check_attention_args(a));
  const std::string who = "attention " + describe(r) + ": ";
  if (a.q.device() != DeviceType::kCuda || a.k_cache.device() != DeviceType::kCuda ||
      a.v_cache.device() != DeviceType::kCuda || a.out.device() != DeviceType::kCuda) {
    return Status::Error(who + "q, caches and out must be on the cuda device");
  }
  if (a.q.dtype() != r.dtype) return Status::Error(who + "got " + a.q.describe());
  if (a.q.dim(2) != r.head_dim) return Status::Error(who + "got " + a.q.describe());
  if (r.phase == AttentionPhase::kDecode && a.q.dim(0) != 1) {
    return Status::Error(who + "decode takes one query, got " + a.q.describe());
  }
  if (a.k_cache.dim(0) > (int64_t{1} << 30) || a.q.dim(0) > (int64_t{1} << 30)) {
    return Status::Error(who + "sizes beyond 2^30 rows are not supported");
  }
  if (r.graph_safe) {
    const Tensor& p = a.device_position;
    if (!p.defined() || p.dtype() != DataType::kInt32 || p.numel() != 1 ||
        p.device() != DeviceType::kCuda) {
      return Status::Error(who + "needs device_position, an int32 [1] tensor on the cuda device");
    }
  }
  return Status::Ok();
}

inline Geometry make_geometry(const AttentionArgs& a, bool graph_safe) {
  Geometry g;
  g.T = static_cast<int>(a.q.dim(0));
  g.heads = static_cast<int>(a.q.dim(1));
  g.kv_heads = static_cast<int>(a.k_cache.dim(1));
  g.group = g.heads / g.kv_heads;
  g.max_ctx = static_cast<int>(a.k_cache.dim(0));
  g.start = static_cast<int>(a.start);
  g.device_position = graph_safe ? a.device_position.data<int>() : nullptr;
  g.scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(a.q.dim(2)));
  return g;
}

template <int D>
struct DimTag {
  static constexpr int value = D;
};

// Calls f(TypeTag<T>{}, DimTag<D>{}) for the instantiation serving (dtype, head_dim): the one
// place the supported set is spelled out, so the dispatcher's refusal and the kernels agree.
inline bool supported_dtype(DataType t) { return t == DataType::kFp32 || t == DataType::kFp16; }
inline bool supported_head_dim(int64_t d) { return d == 64 || d == 128; }

template <typename F>
Status with_instantiation(DataType dtype, int64_t head_dim, F&& f) {
  auto by_dim = [&](auto type_tag) -> Status {
    if (head_dim == 64) return f(type_tag, DimTag<64>{});
    if (head_dim == 128) return f(type_tag, DimTag<128>{});
    return Status::Error("attention: no kernel for head_dim " + std::to_string(head_dim));
  };
  if (dtype == DataType::kFp32) return by_dim(TypeTag<float>{});
  if (dtype == DataType::kFp16) return by_dim(TypeTag<half>{});
  return Status::Error(std::string("attention: no kernel for ") + dtype_name(dtype));
}

// A device fp32 scratch buffer owned by an op object: grown when a call needs more, so it is
// allocated on the first call (before any graph capture) and reused afterwards.
class Scratch {
 public:
  Result<float*> floats(size_t n) {
    if (n > capacity_) {
      KUIPER_ASSIGN_OR_RETURN(buffer_, Tensor::empty({static_cast<int64_t>(n)}, DataType::kFp32,
                                                     DeviceType::kCuda));
      capacity_ = n;
    }
    return buffer_.data<float>();
  }

 private:
  Tensor buffer_;
  size_t capacity_ = 0;
};

// Splits per (kv head, head group) of a split-KV decode launch: request.decode_splits when set,
// else enough blocks to give every SM `blocks_per_sm` (one wave of equal splits), but no more
// splits than the context fills with `granularity` keys each. The context is the cache capacity
// for graph-safe ops (their position is only on the device), else the host position; either way
// the count never depends on a device-side value, so a captured launch stays valid.
inline Result<int> decode_split_count(const AttentionRequest& r, const Geometry& g,
                                      int head_groups, int granularity, int blocks_per_sm) {
  const int ctx = r.graph_safe ? g.max_ctx : g.start + 1;
  const int most = (ctx + granularity - 1) / granularity;
  int want = r.decode_splits;
  if (want <= 0) {
    KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
    const int groups = g.kv_heads * head_groups;
    want = blocks_per_sm * sms / groups;  // never a partial second wave
  }
  return std::max(1, std::min(want, most));
}

// Per-kind factories (one .cu file each); the dispatcher has already checked the request.
Result<std::unique_ptr<AttentionOp>> make_mha_attention(const AttentionRequest& request);
Result<std::unique_ptr<AttentionOp>> make_flash1_attention(const AttentionRequest& request);
Result<std::unique_ptr<AttentionOp>> make_flash2_attention(const AttentionRequest& request);

}  // namespace kuiper::op::cuda_attention
