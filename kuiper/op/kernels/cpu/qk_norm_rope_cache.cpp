// The attention input preparation as the unfused reference kernels run it, in op's order:
// per-head RMSNorm of q and k, RoPE at the rotary positions, then the k and v rows written to
// the caches at the cache rows.
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

}  // namespace kuiper::cpu
