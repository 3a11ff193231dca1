// out = silu(gate) * up, elementwise, one thread per element.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 256;

// silu(g) = g / (1 + e^-g), the CPU reference's form.
template <typename TX>
__global__ void swiglu_kernel(const TX* gate, const TX* up, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = to_float(gate[i]);
  out[i] = from_float<TX>(g / (1.0f + expf(-g)) * to_float(up[i]));
}

}  // namespace

Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  if (n == 0) return Status::Ok();
  return visit_activation(gate.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    swiglu_kernel<TX><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
        gate.data<TX>(), up.data<TX>(), out.data<TX>(), n);
    KUIPER_CUDA_CHECK_LAUNCH("swiglu kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
