// The fused attention-input preparation (op::qk_norm_rope_cache): per-head RMSNorm of q and k,
// RoPE, and the KV-cache write of k and v, in one launch.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"

namespace kuiper::cuda {

namespace {

// The attention input of T tokens in one launch (op::qk_norm_rope_cache): one warp per head of
// token blockIdx.x, over the Hq query heads, then the Hkv key heads, then the Hkv value heads.
// q and k heads are RMS-normalised (when a norm weight is given) and rotated in place (at the
// rotary position, which may differ from the cache row), each value rounded to TX where the
// unfused rmsnorm and rope kernels store it; key heads are also
// written to the cache row at the token's position, value heads only copied there. Launched
// with PDL: it waits for the q/k/v GEMV before reading anything. q, k and v are rows of their
// own tensors, or the three parts of each row of one stacked tensor (the row strides say which);
// q heads are read from q_in and written to q_out (the same tensor when unstacked).
constexpr int kPrepWarps = 4;
constexpr int kHeldPairs = 4;  // pairs a lane keeps in registers: head_dim up to 256

struct PrepArgs {
  const void* q_norm;
  const void* k_norm;
  DataType q_norm_dtype, k_norm_dtype;
  float eps;
  const int32_t* positions;       // cache rows
  const int32_t* rope_positions;  // rotary positions (often the same array)
  int Hq, Hkv, half;
  int64_t cache_rows;
  int64_t q_in_stride, q_out_stride, k_stride, v_stride;  // elements from one row to the next
};

template <typename TX>
__global__ void __launch_bounds__(kPrepWarps * 32)
    qk_norm_rope_cache_kernel(const TX* q_in, TX* q_out, TX* k, const TX* v, TX* k_cache,
                              TX* v_cache, const PrepArgs a, const RopeTable table) {
  grid_dependency_wait();  // q, k and v come from the GEMV before
  grid_launch_dependents();  // a PDL-launched attention kernel may start (and wait) now
  const int lane = threadIdx.x % 32;
  const int head = blockIdx.y * kPrepWarps + threadIdx.x / 32;
  if (head >= a.Hq + 2 * a.Hkv) return;
  const int64_t t = blockIdx.x;
  const int d = 2 * a.half;
  const int64_t kv_dim = static_cast<int64_t>(a.Hkv) * d;
  const int64_t pos = a.positions[t];
  const bool in_cache = pos >= 0 && pos < a.cache_rows;
  if (head >= a.Hq + a.Hkv) {
    const int hv = head - a.Hq - a.Hkv;
    if (!in_cache) return;
    const TX* src = v + t * a.v_stride + static_cast<int64_t>(hv) * d;
    TX* dst = v_cache + pos * kv_dim + static_cast<int64_t>(hv) * d;
    for (int i = lane; i < d; i += 32) dst[i] = src[i];
    return;
  }
  const bool is_q = head < a.Hq;
  const int hk = head - a.Hq;
  const TX* x = is_q ? q_in + t * a.q_in_stride + static_cast<int64_t>(head) * d
                     : k + t * a.k_stride + static_cast<int64_t>(hk) * d;
  TX* y = is_q ? q_out + t * a.q_out_stride + static_cast<int64_t>(head) * d
               : k + t * a.k_stride + static_cast<int64_t>(hk) * d;
  TX* cached = k_cache + pos * kv_dim + static_cast<int64_t>(hk) * d;
  const void* norm = is_q ? a.q_norm : a.k_norm;
  const DataType norm_dtype = is_q ? a.q_norm_dtype : a.k_norm_dtype;
  const float p = static_cast<float>(a.rope_positions[t]);
  // A lane's pair i and i + half, the norm weights and the frequency of each: the same
  // arithmetic in either form below.
  auto rotate = [&](int i, float e0, float e1, float w0, float w1, float inv_freq, float inv) {
    if (norm != nullptr) {
      e0 = to_float(from_float<TX>(w0 * (e0 * inv)));
      e1 = to_float(from_float<TX>(w1 * (e1 * inv)));
    }
    float s, c;
    scaled_sincos(p * inv_freq, table.attention_factor, &s, &c);
    const RotatedPair r = rotate_half(e0, e1, c, s);
    const TX r0 = from_float<TX>(r.first);
    const TX r1 = from_float<TX>(r.second);
    y[i] = r0;  // each lane writes only the elements it read
    y[i + a.half] = r1;
    if (!is_q && in_cache) {
      cached[i] = r0;
      cached[i + a.half] = r1;
    }
  };
  if (a.half % 32 == 0 && a.half <= 32 * kHeldPairs) {
    // Whole warps of pairs (head_dim 64, 128, 256): a lane holds its pairs in registers, every
    // load issued before the first use, so the head costs one memory round trip instead of a
    // chain of them. The sum of squares runs over the same elements in the same order as below
    // (lane, lane + 32, ...: the first halves, then the second).
    const int pairs = a.half / 32;
    float e0[kHeldPairs], e1[kHeldPairs], w0[kHeldPairs], w1[kHeldPairs], f[kHeldPairs];
#pragma unroll
    for (int k = 0; k < kHeldPairs; ++k) {
      const int i = lane + 32 * k;
      const bool held = k < pairs;
      e0[k] = held ? to_float(x[i]) : 0.0f;
      e1[k] = held ? to_float(x[i + a.half]) : 0.0f;
      w0[k] = held && norm != nullptr ? load_as_float(norm, norm_dtype, i) : 0.0f;
      w1[k] = held && norm != nullptr ? load_as_float(norm, norm_dtype, i + a.half) : 0.0f;
      f[k] = held ? table.inv_freq[i] : 0.0f;
    }
    float inv = 1.0f;
    if (norm != nullptr) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kHeldPairs; ++k) sum += e0[k] * e0[k];
#pragma unroll
      for (int k = 0; k < kHeldPairs; ++k) sum += e1[k] * e1[k];
      sum = warp_sum(sum);
      inv = 1.0f / sqrtf(sum / static_cast<float>(d) + a.eps);
    }
#pragma unroll
    for (int k = 0; k < kHeldPairs; ++k) {
      if (k < pairs) rotate(lane + 32 * k, e0[k], e1[k], w0[k], w1[k], f[k], inv);
    }
    return;
  }
  float inv = 1.0f;
  if (norm != nullptr) {
    float sum = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float e = to_float(x[i]);
      sum += e * e;
    }
    sum = warp_sum(sum);
    inv = 1.0f / sqrtf(sum / static_cast<float>(d) + a.eps);
  }
  for (int i = lane; i < a.half; i += 32) {
    const bool normed = norm != nullptr;
    rotate(i, to_float(x[i]), to_float(x[i + a.half]),
           normed ? load_as_float(norm, norm_dtype, i) : 0.0f,
           normed ? load_as_float(norm, norm_dtype, i + a.half) : 0.0f, table.inv_freq[i], inv);
  }
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
  const dim3 grid(static_cast<unsigned>(T), blocks_for(a.Hq + 2 * a.Hkv, kPrepWarps));
  return visit_activation(dtype, [&](auto tag) {
    using TX = typename decltype(tag)::type;
    return launch_pdl(qk_norm_rope_cache_kernel<TX>, grid, dim3(kPrepWarps * 32), 0,
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
