// out = silu(gate) * up, elementwise.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/elementwise.cuh"

namespace kuiper::cuda {

namespace {

// silu(g) = g / (1 + e^-g), the CPU reference's form.
struct SiluTimes {
  __device__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};

}  // namespace

Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  return visit_activation(gate.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    return launch_elementwise<TX, TX>(gate, up, out, SiluTimes{}, "swiglu kernel");
  });
}

}  // namespace kuiper::cuda
