// Row-wise LayerNorm (the vision tower's). Activations fp32, fp16 or bf16,
// arithmetic fp32.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kBlockThreads = 256;

// Sum of v over the kThreadsPerRow threads of a row (a warp, or the whole block). `partial`
// holds one float per warp of the row; block_reduce's leading barrier lets it be reused at once.
template <int kThreadsPerRow>
__device__ __forceinline__ float row_sum(float v, float* partial) {
  if constexpr (kThreadsPerRow > 32) {
    return block_reduce<kThreadsPerRow, false>(v, partial);
  } else {
    return warp_sum(v);
  }
}

// Two passes over the row (mean, then the squared deviations), as the CPU reference: a wide
// row (merged vision tokens are 4x hidden) gets a block, a narrow one a warp.
template <typename TX, typename TW, int kThreadsPerRow>
__global__ void __launch_bounds__(kBlockThreads)
    layernorm_kernel(const TX* x, const TW* __restrict__ weight, const TW* __restrict__ bias,
                     TX* out, int64_t rows, int D, float eps) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  __shared__ float partial[kThreadsPerRow / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int tid = threadIdx.x % kThreadsPerRow;
  const bool valid = row < rows;  // block-wide rows are always valid, so barriers are uniform
  const TX* in = x + (valid ? row : 0) * D;
  float sum = 0.0f;
  if (valid) {
    for (int i = tid; i < D; i += kThreadsPerRow) sum += to_float(in[i]);
  }
  const float mean = row_sum<kThreadsPerRow>(sum, partial) / static_cast<float>(D);
  float sq = 0.0f;
  if (valid) {
    for (int i = tid; i < D; i += kThreadsPerRow) {
      const float c = to_float(in[i]) - mean;
      sq += c * c;
    }
  }
  const float var = row_sum<kThreadsPerRow>(sq, partial) / static_cast<float>(D);
  if (!valid) return;
  // x and out may alias: each thread rewrites only elements it has finished reading.
  const float inv = 1.0f / sqrtf(var + eps);
  TX* o = out + row * D;
  for (int i = tid; i < D; i += kThreadsPerRow) {
    o[i] = from_float<TX>((to_float(in[i]) - mean) * inv * to_float(weight[i]) +
                          to_float(bias[i]));
  }
}

template <typename TX, typename TW, int kThreadsPerRow>
Status launch_layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        Tensor& out, int64_t rows, int64_t D) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  layernorm_kernel<TX, TW, kThreadsPerRow>
      <<<blocks_for(rows, kRowsPerBlock), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), weight.data<TW>(), bias.data<TW>(), out.data<TX>(), rows,
          static_cast<int>(D), static_cast<float>(eps));
  KUIPER_CUDA_CHECK_LAUNCH("layernorm kernel");
  return Status::Ok();
}

}  // namespace

Status layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor& out) {
  const int64_t D = weight.numel(), rows = x.numel() / D;
  if (rows == 0) return Status::Ok();
  if (bias.dtype() != weight.dtype()) {
    return Status::Error(std::string("layernorm: the CUDA kernel wants weight and bias of one "
                                     "type, got ") + weight.describe() + " and " +
                         bias.describe());
  }
  return visit_activation(x.dtype(), [&](auto x_tag) {
    using TX = typename decltype(x_tag)::type;
    return visit_float(weight.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      if (D >= 1024) return launch_layernorm<TX, TW, kBlockThreads>(x, weight, bias, eps, out, rows, D);
      return launch_layernorm<TX, TW, 32>(x, weight, bias, eps, out, rows, D);
    });
  });
}

}  // namespace kuiper::cuda
