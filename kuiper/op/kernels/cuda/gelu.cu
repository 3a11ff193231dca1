// GELU, exact (erf) or the tanh approximation, one thread per element. Activations fp32, fp16
// or bf16, arithmetic fp32.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kBlockThreads = 256;

template <typename TX, bool kTanh>
__global__ void gelu_kernel(const TX* x, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = to_float(x[i]);
  float y;
  if constexpr (kTanh) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    y = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
  } else {
    y = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
  }
  out[i] = from_float<TX>(y);
}

}  // namespace

Status gelu(const Tensor& x, op::GeluKind kind, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return Status::Ok();
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    if (kind == op::GeluKind::kTanh) {
      gelu_kernel<TX, true><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), out.data<TX>(), n);
    } else {
      gelu_kernel<TX, false><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), out.data<TX>(), n);
    }
    KUIPER_CUDA_CHECK_LAUNCH("gelu kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
