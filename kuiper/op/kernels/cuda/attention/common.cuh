// Pieces shared by the CUDA attention kernels (mha, flash1, flash2): the problem geometry every
// kernel receives, element traits for fp32/fp16/bf16 (arithmetic is always fp32), vector loads and
// tile staging, and the host-side argument checks and (dtype, head_dim) instantiation switch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

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
  // Device-position decode: the position of the single query is read here instead of `start`,
  // so a captured graph replays correctly at every step.
  const int* device_position;
  float scale_log2;
};

// Position of query 0. A device position outside the cache is clamped rather than trusted: a
// replayed graph must never read past the cache, whatever the host wrote.
__device__ __forceinline__ int first_position(const Geometry& g) {
  if (g.device_position == nullptr) return g.start;
  return min(max(*g.device_position, 0), g.max_ctx - 1);
}

// The block of a prefill-style grid (blockIdx.x: row tile, blockIdx.y: kv head): its rows
// [r0, r0 + kRows) of the kv head's total_rows (query, head) rows, the position of query 0, and
// kv_end, the keys its last row sees. Row tiles are taken from the end: later ones see more
// keys, and launching them first evens out the tail of the grid.
struct RowTile {
  int kvh, total_rows, r0, pos0, kv_end;
};
template <int kRows>
__device__ __forceinline__ RowTile row_tile(const Geometry& g) {
  RowTile t;
  t.kvh = blockIdx.y;
  t.total_rows = g.T * g.group;
  t.r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  t.pos0 = first_position(g);
  t.kv_end = t.pos0 + (min(t.r0 + kRows, t.total_rows) - 1) / g.group + 1;
  return t;
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
template <>
struct Word<__nv_bfloat16> {
  static constexpr int kElems = 2;
  // A bf16 is the upper half of an fp32: widening is a shift or a mask.
  __device__ static void unpack(uint32_t w, float* out) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ static uint32_t pack(const float* in) {
    __nv_bfloat162_raw raw = __nv_bfloat162(__floats2bfloat162_rn(in[0], in[1]));
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

// ---- host side ----

inline const char* phase_name(AttentionPhase p) {
  return p == AttentionPhase::kPrefill ? "prefill" : "decode";
}

// "flash2 decode fp16 head_dim 128 device-position": how errors name a combination.
inline std::string describe(const AttentionRequest& r) {
  return std::string(attention_name(r.kind)) + " " + phase_name(r.phase) + " " +
         dtype_name(r.dtype) + " head_dim " + std::to_string(r.head_dim) +
         (r.device_position ? " device-position" : "");
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
  if (r.device_position) {
    const Tensor& p = a.device_position;
    if (!p.defined() || p.dtype() != DataType::kInt32 || p.numel() != 1 ||
        p.device() != DeviceType::kCuda) {
      return Status::Error(who + "needs device_position, an int32 [1] tensor on the cuda device");
    }
  }
  return Status::Ok();
}

inline Geometry make_geometry(const AttentionArgs& a, bool device_position) {
  Geometry g;
  g.T = static_cast<int>(a.q.dim(0));
  g.heads = static_cast<int>(a.q.dim(1));
  g.kv_heads = static_cast<int>(a.k_cache.dim(1));
  g.group = g.heads / g.kv_heads;
  g.max_ctx = static_cast<int>(a.k_cache.dim(0));
  g.start = static_cast<int>(a.start);
  g.device_position = device_position ? a.device_position.data<int>() : nullptr;
  g.scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(a.q.dim(2)));
  return g;
}

template <int D>
struct DimTag {
  static constexpr int value = D;
};

// Calls f(TypeTag<T>{}, DimTag<D>{}) for the instantiation serving (dtype, head_dim): the one
// place the supported set is spelled out, so the dispatcher's refusal and the kernels agree.
inline bool supported_dtype(DataType t) {
  return t == DataType::kFp32 || t == DataType::kFp16 || t == DataType::kBf16;
}
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
  if (dtype == DataType::kBf16) return by_dim(TypeTag<__nv_bfloat16>{});
  return Status::Error(std::string("attention: no kernel for ") + dtype_name(dtype));
}

// with_instantiation split by element type, as the flash kernels are: tensor_cores(TypeTag<T>{},
// DimTag<D>{}) for the 16-bit types (fp16, bf16), simt(DimTag<D>{}) for fp32 (tensor cores would
// round fp32 operands to tf32, outside what an fp32 path promises).
template <typename TensorCores, typename Simt>
Status by_element_type(const AttentionRequest& r, TensorCores&& tensor_cores, Simt&& simt) {
  return with_instantiation(r.dtype, r.head_dim, [&](auto tt, auto dt) -> Status {
    if constexpr (std::is_same_v<typename decltype(tt)::type, float>) {
      return simt(dt);
    } else {
      return tensor_cores(tt, dt);
    }
  });
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

// What an op keeps on the device between calls, grown on the first call (before any graph
// capture) and reused, so every step's launches are the same.
struct AttentionBuffers {
  Scratch partials;  // split-KV partial outputs (mha: the scores)
  Scratch stats;     // split-KV partials' (m, l)
  Tensor arrivals;   // the fused decode's counters, one per (kv head, head group)
  size_t arrivals_capacity = 0;
};

}  // namespace kuiper::op::cuda_attention
