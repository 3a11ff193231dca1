// out = a + b, elementwise.
#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = a.numel();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

}  // namespace kuiper::cpu
