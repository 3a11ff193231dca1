// The kernel of the elementwise binary ops (add, swiglu): out[i] = fn(a[i], b[i]) in fp32,
// rounded to the activation type, one thread per element. out may alias a or b: each thread
// reads its element before writing it.
#pragma once

#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cuda {

template <typename TX, typename Fn>
__global__ void elementwise_kernel(const TX* a, const TX* b, TX* out, int64_t n, Fn fn) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<TX>(fn(to_float(a[i]), to_float(b[i])));
}

// fn: a functor with a __device__ float operator()(float, float) const.
template <typename Fn>
Status launch_elementwise(const Tensor& a, const Tensor& b, Tensor& out, Fn fn,
                          const char* what) {
  constexpr int kThreads = 256;
  const int64_t n = a.numel();
  if (n == 0) return Status::Ok();
  return visit_activation(a.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    elementwise_kernel<TX><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
        a.data<TX>(), b.data<TX>(), out.data<TX>(), n, fn);
    KUIPER_CUDA_CHECK_LAUNCH(what);
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
