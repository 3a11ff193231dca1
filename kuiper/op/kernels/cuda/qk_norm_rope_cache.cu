// The fused attention-input preparation (op::qk_norm_rope_cache): per-head RMSNorm of q and k,
// RoPE, and the KV-cache write of k and v, in one launch.
#include <algorithm>
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"

namespace kuiper::cuda {

namespace {

// The attention input of T tokens in one launch (op::qk_norm_rope_cache): a block takes one
// token's heads, or a group of them (PrepArgs::group_heads, blockIdx.y the group: where there are
// few tokens, several blocks share a token so that more SMs work), counted over the Hq query
// heads, then the Hkv key heads, then the Hkv value heads; a block's warps take its heads in turn.
// q and k heads are RMS-normalised (when a norm weight is given) and rotated in place (at the
// rotary position, which may differ from the cache row), each value rounded to TX where the
// unfused rmsnorm and rope kernels store it; key heads are also written to the cache row at the
// token's position, value heads only copied there. The token's cos and sin are found once a block
// (a table in shared memory) instead of once a head: the same sincosf of the same angle, so the
// values are bit for bit a head's own. Launched with PDL: the norm weights are loaded before the
// wait for the q/k/v GEMM; after it a warp asks for all of its first round of heads before the
// block finds the table. q, k and v are rows of their own tensors, or the three parts of each row
// of one stacked tensor (the row strides say which); q heads are read from q_in and written to
// q_out (the same tensor when unstacked).
//
// Why: with a block of 4 warps for each 4 heads (a grid of T x 12 blocks for Qwen3-8B) the kernel
// took 6.3 us at 64 tokens and 12.4 us at 256 for 0.8 and 3.1 MB of q/k/v, and every head found
// its own sines; in this form 6.4 and 8.6 us (Nsight Compute, H200, Qwen3-8B fp16 decode steps;
// docs/PERFORMANCE.md). A block a token at 64 tokens took 8.0 us (64 SMs working).
constexpr int kPrepWarps = 8;
constexpr int kWarpHeads = 6;  // heads a warp loads before it computes the first (Qwen3-8B: 48 / 8)

struct PrepArgs {
  const void* q_norm;
  const void* k_norm;
  DataType q_norm_dtype, k_norm_dtype;
  float eps;
  const int32_t* positions;       // cache rows
  const int32_t* rope_positions;  // rotary positions (often the same array)
  int Hq, Hkv, half;
  int group_heads;  // heads a block takes (gridDim.y blocks a token)
  int64_t cache_rows;
  int64_t q_in_stride, q_out_stride, k_stride, v_stride;  // elements from one row to the next
};

// kPairs: the rotated pairs a lane holds (head_dim 64 * kPairs, whole warps of pairs), every load
// of a round of heads issued before the first use; 0: any head_dim, a head's elements walked in a
// loop.
template <typename TX, int kPairs>
__global__ void __launch_bounds__(kPrepWarps * 32)
    qk_norm_rope_cache_kernel(const TX* q_in, TX* q_out, TX* k, const TX* v, TX* k_cache,
                              TX* v_cache, const PrepArgs a, const RopeTable table) {
  __shared__ float sines[kMaxRopeHalfDim], cosines[kMaxRopeHalfDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = a.half, d = 2 * half;
  const int begin = static_cast<int>(blockIdx.y) * a.group_heads;
  const int end = min(a.Hq + 2 * a.Hkv, begin + a.group_heads);
  constexpr int kHeld = kPairs > 0 ? kPairs : 1;
  // The norm weights of a lane's pairs (model weights: no kernel before writes them).
  float qw0[kHeld], qw1[kHeld], kw0[kHeld], kw1[kHeld];
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int i = lane + 32 * j;
    const bool held = kPairs > 0;
    qw0[j] = held && a.q_norm != nullptr ? load_as_float(a.q_norm, a.q_norm_dtype, i) : 0.0f;
    qw1[j] = held && a.q_norm != nullptr ? load_as_float(a.q_norm, a.q_norm_dtype, i + half) : 0.0f;
    kw0[j] = held && a.k_norm != nullptr ? load_as_float(a.k_norm, a.k_norm_dtype, i) : 0.0f;
    kw1[j] = held && a.k_norm != nullptr ? load_as_float(a.k_norm, a.k_norm_dtype, i + half) : 0.0f;
  }
  grid_dependency_wait();  // q, k and v come from the GEMM before
  grid_launch_dependents();  // a PDL-launched attention kernel may start (and wait) now
  const int64_t t = blockIdx.x;
  const int64_t kv_dim = static_cast<int64_t>(a.Hkv) * d;
  // Head h's source and destination rows.
  auto source = [&](int h) -> const TX* {
    if (h < a.Hq) return q_in + t * a.q_in_stride + static_cast<int64_t>(h) * d;
    if (h < a.Hq + a.Hkv) return k + t * a.k_stride + static_cast<int64_t>(h - a.Hq) * d;
    return v + t * a.v_stride + static_cast<int64_t>(h - a.Hq - a.Hkv) * d;
  };
  // A round of a warp's heads (first, first + kPrepWarps, ...) into registers: a lane holds
  // elements lane + 32 j and lane + 32 j + half of each.
  float e0[kWarpHeads][kHeld], e1[kWarpHeads][kHeld];
  auto load_round = [&](int first) {
#pragma unroll
    for (int n = 0; n < kWarpHeads; ++n) {
      const int h = first + n * kPrepWarps;
      const TX* x = source(h < end ? h : begin);
#pragma unroll
      for (int j = 0; j < kHeld; ++j) {
        e0[n][j] = kPairs > 0 && h < end ? to_float(x[lane + 32 * j]) : 0.0f;
        e1[n][j] = kPairs > 0 && h < end ? to_float(x[lane + 32 * j + half]) : 0.0f;
      }
    }
  };
  const int first_head = begin + warp;
  if constexpr (kPairs > 0) load_round(first_head);
  const int64_t pos = a.positions[t];
  const bool in_cache = pos >= 0 && pos < a.cache_rows;
  const float p = static_cast<float>(a.rope_positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    scaled_sincos(p * table.inv_freq[i], table.attention_factor, &sines[i], &cosines[i]);
  }
  __syncthreads();
  // The normed (q and k heads) and rotated pair i of a head, stored where it goes.
  auto store_pair = [&](int h, int i, float x0, float x1, float w0, float w1, float inv,
                        bool normed) {
    const bool is_q = h < a.Hq;
    if (normed) {
      x0 = to_float(from_float<TX>(w0 * (x0 * inv)));
      x1 = to_float(from_float<TX>(w1 * (x1 * inv)));
    }
    const RotatedPair r = rotate_half(x0, x1, cosines[i], sines[i]);
    const TX r0 = from_float<TX>(r.first);
    const TX r1 = from_float<TX>(r.second);
    TX* y = is_q ? q_out + t * a.q_out_stride + static_cast<int64_t>(h) * d
                 : k + t * a.k_stride + static_cast<int64_t>(h - a.Hq) * d;
    y[i] = r0;  // each lane writes only the elements it read
    y[i + half] = r1;
    if (!is_q && in_cache) {
      TX* cached = k_cache + pos * kv_dim + static_cast<int64_t>(h - a.Hq) * d;
      cached[i] = r0;
      cached[i + half] = r1;
    }
  };
  auto v_row = [&](int h) {
    return v_cache + pos * kv_dim + static_cast<int64_t>(h - a.Hq - a.Hkv) * d;
  };
  if constexpr (kPairs > 0) {
    // The sum of squares runs over a lane's elements in the unfused rmsnorm's order (the first
    // halves, then the second).
    for (int first = first_head; first < end; first += kPrepWarps * kWarpHeads) {
      if (first != first_head) load_round(first);
#pragma unroll
      for (int n = 0; n < kWarpHeads; ++n) {
        const int h = first + n * kPrepWarps;
        if (h >= end) break;
        if (h >= a.Hq + a.Hkv) {  // a value head: copied to its cache row
          if (!in_cache) continue;
          TX* dst = v_row(h);
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            dst[lane + 32 * j] = from_float<TX>(e0[n][j]);
            dst[lane + 32 * j + half] = from_float<TX>(e1[n][j]);
          }
          continue;
        }
        const bool is_q = h < a.Hq;
        const bool normed = (is_q ? a.q_norm : a.k_norm) != nullptr;
        float inv = 1.0f;
        if (normed) {
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < kPairs; ++j) sum += e0[n][j] * e0[n][j];
#pragma unroll
          for (int j = 0; j < kPairs; ++j) sum += e1[n][j] * e1[n][j];
          sum = warp_sum(sum);
          inv = rms_inverse(sum, d, a.eps);
        }
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          store_pair(h, lane + 32 * j, e0[n][j], e1[n][j], is_q ? qw0[j] : kw0[j],
                     is_q ? qw1[j] : kw1[j], inv, normed);
        }
      }
    }
  } else {
    for (int h = first_head; h < end; h += kPrepWarps) {
      const TX* x = source(h);
      if (h >= a.Hq + a.Hkv) {
        if (!in_cache) continue;
        TX* dst = v_row(h);
        for (int i = lane; i < d; i += 32) dst[i] = x[i];
        continue;
      }
      const bool is_q = h < a.Hq;
      const void* norm = is_q ? a.q_norm : a.k_norm;
      const DataType norm_dtype = is_q ? a.q_norm_dtype : a.k_norm_dtype;
      float inv = 1.0f;
      if (norm != nullptr) {
        float sum = 0.0f;
        for (int i = lane; i < d; i += 32) {
          const float e = to_float(x[i]);
          sum += e * e;
        }
        sum = warp_sum(sum);
        inv = rms_inverse(sum, d, a.eps);
      }
      for (int i = lane; i < half; i += 32) {
        const bool normed = norm != nullptr;
        store_pair(h, i, to_float(x[i]), to_float(x[i + half]),
                   normed ? load_as_float(norm, norm_dtype, i) : 0.0f,
                   normed ? load_as_float(norm, norm_dtype, i + half) : 0.0f, inv, normed);
      }
    }
  }
}

// The heads a block takes: all of a token's where the tokens alone fill the SMs twice over (a
// block of 8 warps with its registers: two an SM), else a token's heads split into as many groups
// as bring the grid near that, at most one group for every 8 heads.
inline int prep_group_heads(int64_t T, int heads, int sms) {
  const int64_t most = (heads + kPrepWarps - 1) / kPrepWarps;
  const int64_t fill = 2 * sms / std::max<int64_t>(T, 1);
  const int64_t groups = std::max<int64_t>(1, std::min(most, fill));
  return static_cast<int>((heads + groups - 1) / groups);
}

// The launch of both forms, PrepArgs' heads and strides set by the caller.
Status launch_prep(const void* q_in, void* q_out, void* k, const void* v, const Tensor* q_norm,
                   const Tensor* k_norm, double eps, const Tensor& positions,
                   const op::RopeParams& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& rope_positions, PrepArgs a, int64_t T, int64_t d, DataType dtype) {
  KUIPER_RETURN_IF_ERROR(check_rope_dim("qk_norm_rope_cache", d));
  if (T == 0) return Status::Ok();
  a.q_norm = q_norm != nullptr ? q_norm->raw() : nullptr;
  a.k_norm = k_norm != nullptr ? k_norm->raw() : nullptr;
  a.q_norm_dtype = q_norm != nullptr ? q_norm->dtype() : DataType::kFp32;
  a.k_norm_dtype = k_norm != nullptr ? k_norm->dtype() : DataType::kFp32;
  a.eps = static_cast<float>(eps);
  a.positions = positions.data<int32_t>();
  a.rope_positions = rope_positions.data<int32_t>();
  a.half = static_cast<int>(d / 2);
  a.cache_rows = k_cache.dim(0);
  const RopeTable table = make_rope_table(rope, d, d / 2);
  const int pairs = a.half % 32 == 0 ? a.half / 32 : 0;  // 0: the loop form
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  const int heads = a.Hq + 2 * a.Hkv;
  a.group_heads = prep_group_heads(T, heads, sms);
  const int groups = (heads + a.group_heads - 1) / a.group_heads;
  return visit_activation(dtype, [&](auto tag) {
    using TX = typename decltype(tag)::type;
    auto kernel = qk_norm_rope_cache_kernel<TX, 0>;
    if (pairs == 1) kernel = qk_norm_rope_cache_kernel<TX, 1>;
    if (pairs == 2) kernel = qk_norm_rope_cache_kernel<TX, 2>;
    if (pairs == 3) kernel = qk_norm_rope_cache_kernel<TX, 3>;
    if (pairs == 4) kernel = qk_norm_rope_cache_kernel<TX, 4>;
    return launch_pdl(kernel, dim3(static_cast<unsigned>(T), static_cast<unsigned>(groups)),
                      dim3(kPrepWarps * 32), 0,
                      "qk_norm_rope_cache kernel launch", static_cast<const TX*>(q_in),
                      static_cast<TX*>(q_out), static_cast<TX*>(k), static_cast<const TX*>(v),
                      k_cache.data<TX>(), v_cache.data<TX>(), a, table);
  });
}

}  // namespace

Status qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                          const Tensor* k_norm, double eps, const Tensor& positions,
                          const op::RopeParams& rope, Tensor& k_cache, Tensor& v_cache,
                          const Tensor& rope_positions) {
  const int64_t d = q.dim(2);
  PrepArgs a{};
  a.Hq = static_cast<int>(q.dim(1));
  a.Hkv = static_cast<int>(k.dim(1));
  a.q_in_stride = a.q_out_stride = q.dim(1) * d;
  a.k_stride = a.v_stride = k.dim(1) * d;
  return launch_prep(q.raw(), q.raw(), k.raw(), v.raw(), q_norm, k_norm, eps, positions, rope,
                     k_cache, v_cache, rope_positions, a, q.dim(0), d, q.dtype());
}

Status qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                          double eps, const Tensor& positions, const op::RopeParams& rope,
                          Tensor& k_cache, Tensor& v_cache, const Tensor& rope_positions) {
  const int64_t d = qkv.dim(2), q_dim = q.dim(1) * d, kv_dim = k_cache.dim(1);
  PrepArgs a{};
  a.Hq = static_cast<int>(q.dim(1));
  a.Hkv = static_cast<int>(kv_dim / d);
  a.q_in_stride = a.k_stride = a.v_stride = qkv.dim(1) * d;
  a.q_out_stride = q_dim;
  const int64_t elem = static_cast<int64_t>(dtype_size(qkv.dtype()));
  char* row0 = static_cast<char*>(qkv.raw());
  return launch_prep(row0, q.raw(), row0 + q_dim * elem, row0 + (q_dim + kv_dim) * elem, q_norm,
                     k_norm, eps, positions, rope, k_cache, v_cache, rope_positions, a, qkv.dim(0),
                     d, qkv.dtype());
}

}  // namespace kuiper::cuda
