// Row-wise LayerNorm, the vision tower's: mean and biased variance summed in double, so this
// stays the exact side of every comparison.
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

namespace {

std::vector<float> as_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  (void)convert_elements(t.raw(), t.dtype(), v.data(), DataType::kFp32, v.size());
  return v;
}

}  // namespace

void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
               Tensor& out) {
  const int64_t D = weight.numel(), R = x.numel() / D;
  const std::vector<float> w = as_floats(weight), b = as_floats(bias);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* in = x.data<float>() + r * D;
    float* o = out.data<float>() + r * D;
    double sum = 0.0;
    for (int64_t i = 0; i < D; ++i) sum += in[i];
    const double mean = sum / static_cast<double>(D);
    double sq = 0.0;
    for (int64_t i = 0; i < D; ++i) sq += (in[i] - mean) * (in[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(D) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < D; ++i) o[i] = (in[i] - m) * inv * w[i] + b[i];
  }
}

}  // namespace kuiper::cpu
