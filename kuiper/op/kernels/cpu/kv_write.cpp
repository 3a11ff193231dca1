// KV-cache write: row t of k goes to cache row positions[t] (checked by ops.cpp).
#include <algorithm>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void kv_write(const Tensor& k, Tensor& cache, const Tensor& positions) {
  const int64_t T = k.dim(0), D = k.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* src = k.data<float>() + t * D;
    std::copy(src, src + D, cache.data<float>() + positions.data<int32_t>()[t] * D);
  }
}

}  // namespace kuiper::cpu
