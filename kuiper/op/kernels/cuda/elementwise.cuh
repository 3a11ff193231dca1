// The kernel of the elementwise binary ops (add, swiglu): out[i] = fn(a[i], b[i]) in fp32,
// rounded to a's type, one thread per element. b may have another type (add: a 16-bit b into the
// fp32 residual a). out may alias a or b: each thread reads its element before writing it.
#pragma once

#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cuda {

template <typename TA, typename TB, typename Fn>
__global__ void elementwise_kernel(const TA* a, const TB* b, TA* out, int64_t n, Fn fn) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<TA>(fn(to_float(a[i]), to_float(b[i])));
}

// fn: a functor with a __device__ float operator()(float, float) const. out has a's type.
template <typename TA, typename TB, typename Fn>
Status launch_elementwise(const Tensor& a, const Tensor& b, Tensor& out, Fn fn,
                          const char* what) {
  constexpr int kThreads = 256;
  const int64_t n = a.numel();
  if (n == 0) return Status::Ok();
  elementwise_kernel<TA, TB><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
      a.data<TA>(), b.data<TB>(), out.data<TA>(), n, fn);
  KUIPER_CUDA_CHECK_LAUNCH(what);
  return Status::Ok();
}

}  // namespace kuiper::cuda
