// out[T, N] = x[T, K] @ w[N, K]^T (+ bias). Weights stay in their stored form (fp32/fp16/bf16 or
// quantized) and are widened a block of rows at a time, so a bf16 or 4-bit model never needs an
// fp32 copy.
#include <algorithm>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

namespace {

// 16 independent partial sums let the compiler vectorise without reassociating a single sum.
float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (float v : acc) s += v;
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

constexpr int64_t kRowBlock = 32;  // weight rows widened together: 32*K floats stay in L2

}  // namespace

void matmul(const Tensor& x, const op::Weight& weight, const Tensor* bias, Tensor& out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = weight.rows();
  std::vector<float> b;
  if (bias != nullptr) {
    b.resize(static_cast<size_t>(N));
    (void)convert_elements(bias->raw(), bias->dtype(), b.data(), DataType::kFp32, b.size());
  }
  // FP8 activations (weight.h): the product takes x rounded to FP8 a group at a time.
  const float* xs = x.data<float>();
  std::vector<float> rounded;
  if (weight.fp8_activations) {
    rounded.resize(static_cast<size_t>(T * K));
    round_to_fp8_groups(xs, T, K, rounded.data());
    xs = rounded.data();
  }
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
#pragma omp parallel
  {
    std::vector<float> wblock(static_cast<size_t>(kRowBlock * K));
#pragma omp for schedule(dynamic, 4)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * kRowBlock, rows = std::min(kRowBlock, N - n0);
      const float* wp = wblock.data();
      if (!weight.quantized() && weight.values.dtype() == DataType::kFp32) {
        wp = weight.values.data<float>() + n0 * K;
      } else {
        dequantize_rows(weight, n0, rows, wblock.data());
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = xs + t * K;
        float* o = out.data<float>() + t * N + n0;
        for (int64_t r = 0; r < rows; ++r) {
          o[r] = dot(xr, wp + r * K, K) + (b.empty() ? 0.0f : b[n0 + r]);
        }
      }
    }
  }
}

}  // namespace kuiper::cpu
