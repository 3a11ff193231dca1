// Row-wise RMSNorm: out = weight * (x / sqrt(mean(x^2) + eps)), sums in fp32.
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out) {
  const int64_t D = weight.numel(), R = x.numel() / D;
  std::vector<float> w(static_cast<size_t>(D));
  (void)convert_elements(weight.raw(), weight.dtype(), w.data(), DataType::kFp32, w.size());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* in = x.data<float>() + r * D;
    float* o = out.data<float>() + r * D;
    float sum = 0.0f;
    for (int64_t i = 0; i < D; ++i) sum += in[i] * in[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(D) + static_cast<float>(eps));
    for (int64_t i = 0; i < D; ++i) o[i] = w[i] * (in[i] * inv);
  }
}

}  // namespace kuiper::cpu
