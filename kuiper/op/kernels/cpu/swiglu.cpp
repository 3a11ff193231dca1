// out = silu(gate) * up with silu(g) = g / (1 + e^-g), of separate gate and up or of the two
// halves of each stacked row.
#include <cmath>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

namespace {

float silu_times(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

}  // namespace

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = silu_times(g[i], u[i]);
}

void swiglu(const Tensor& gate_up, Tensor& out) {
  const int64_t T = out.dim(0), N = out.dim(1);
  const float* gu = gate_up.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = gu + t * 2 * N;
    for (int64_t j = 0; j < N; ++j) o[t * N + j] = silu_times(row[j], row[N + j]);
  }
}

}  // namespace kuiper::cpu
