// GELU, exact (erf) or the tanh approximation, elementwise.
#include <cmath>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void gelu(const Tensor& x, op::GeluKind kind, Tensor& out) {
  const int64_t n = x.numel();
  const float* in = x.data<float>();
  float* o = out.data<float>();
  if (kind == op::GeluKind::kTanh) {
    const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      o[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      o[i] = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(M_SQRT1_2)));
    }
  }
}

}  // namespace kuiper::cpu
