// The attention input preparation as the unfused reference kernels run it, in op's order:
// per-head RMSNorm of q and k, RoPE at the rotary positions, then the k and v rows written to
// the caches at the cache rows. The stacked form copies q, k and v out of qkv's rows, runs the
// same, and puts the rotated k back.
#include <cstring>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                        const Tensor* k_norm, double eps, const Tensor& positions,
                        const op::RopeParams& rope, Tensor& k_cache, Tensor& v_cache,
                        const Tensor& rope_positions) {
  if (q_norm != nullptr) rmsnorm(q, *q_norm, eps, q);
  if (k_norm != nullptr) rmsnorm(k, *k_norm, eps, k);
  cpu::rope(q, rope_positions, rope);
  cpu::rope(k, rope_positions, rope);
  // k [T, Hkv, d] as the [T, Hkv * d] rows of the cache.
  const Tensor k_rows = Tensor::view(k.raw(), {k.dim(0), v.dim(1)}, k.dtype(), k.device());
  kv_write(k_rows, k_cache, positions);
  kv_write(v, v_cache, positions);
}

void qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                        double eps, const Tensor& positions, const op::RopeParams& rope,
                        Tensor& k_cache, Tensor& v_cache, const Tensor& rope_positions) {
  const int64_t T = qkv.dim(0), d = qkv.dim(2), q_dim = q.dim(1) * d, kv_dim = k_cache.dim(1);
  const int64_t row = q_dim + 2 * kv_dim;
  std::vector<float> k_values(static_cast<size_t>(T * kv_dim)), v_values(k_values.size());
  Tensor k = Tensor::view(k_values.data(), {T, kv_dim / d, d}, DataType::kFp32, DeviceType::kCpu);
  Tensor v = Tensor::view(v_values.data(), {T, kv_dim}, DataType::kFp32, DeviceType::kCpu);
  float* stacked = qkv.data<float>();
  const size_t q_bytes = sizeof(float) * q_dim, kv_bytes = sizeof(float) * kv_dim;
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(q.data<float>() + t * q_dim, stacked + t * row, q_bytes);
    std::memcpy(k_values.data() + t * kv_dim, stacked + t * row + q_dim, kv_bytes);
    std::memcpy(v_values.data() + t * kv_dim, stacked + t * row + q_dim + kv_dim, kv_bytes);
  }
  qk_norm_rope_cache(q, k, v, q_norm, k_norm, eps, positions, rope, k_cache, v_cache,
                     rope_positions);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(stacked + t * row + q_dim, k_values.data() + t * kv_dim, kv_bytes);
  }
}

}  // namespace kuiper::cpu
