// out = silu(gate) * up with silu(g) = g / (1 + e^-g).
#include <cmath>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace kuiper::cpu
