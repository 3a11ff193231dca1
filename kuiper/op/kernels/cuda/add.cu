// out = a + b, elementwise, one thread per element (the residual add; out may alias a or b).
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 256;

template <typename TX>
__global__ void add_kernel(const TX* a, const TX* b, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<TX>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

Status add(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = a.numel();
  if (n == 0) return Status::Ok();
  return visit_activation(a.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    add_kernel<TX><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(a.data<TX>(), b.data<TX>(),
                                                                      out.data<TX>(), n);
    KUIPER_CUDA_CHECK_LAUNCH("add kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
