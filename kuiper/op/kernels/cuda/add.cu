// out = a + b, elementwise (the residual add; out may alias a or b). b may be 16-bit where a
// is fp32: deepstack features added into the fp32 residual stream.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/elementwise.cuh"

namespace kuiper::cuda {

namespace {

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace

Status add(const Tensor& a, const Tensor& b, Tensor& out) {
  return visit_activation_pair(a.dtype(), b.dtype(), [&](auto a_tag, auto b_tag) {
    using TA = typename decltype(a_tag)::type;
    using TB = typename decltype(b_tag)::type;
    return launch_elementwise<TA, TB>(a, b, out, Sum{}, "add kernel");
  });
}

}  // namespace kuiper::cuda
