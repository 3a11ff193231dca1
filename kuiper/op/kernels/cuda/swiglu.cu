// out = silu(gate) * up, elementwise, of separate gate and up or of the two halves of each
// stacked gate|up row.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/elementwise.cuh"

namespace kuiper::cuda {

namespace {

// silu(g) = g / (1 + e^-g), the CPU reference's form.
struct SiluTimes {
  __device__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};

// One thread per element of out [T, N]; row t of gate_up is its gate half then its up half.
template <typename TX>
__global__ void swiglu_stacked_kernel(const TX* gate_up, TX* out, int64_t T, int64_t N) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * N) return;
  const int64_t t = i / N, j = i - t * N;
  const TX* row = gate_up + t * 2 * N;
  out[i] = from_float<TX>(SiluTimes{}(to_float(row[j]), to_float(row[N + j])));
}

}  // namespace

Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  return visit_activation(gate.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    return launch_elementwise<TX, TX>(gate, up, out, SiluTimes{}, "swiglu kernel");
  });
}

Status swiglu(const Tensor& gate_up, Tensor& out) {
  const int64_t T = out.dim(0), N = out.dim(1);
  if (T * N == 0) return Status::Ok();
  constexpr int kThreads = 256;
  return visit_activation(out.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    swiglu_stacked_kernel<TX><<<blocks_for(T * N, kThreads), kThreads, 0, stream()>>>(
        gate_up.data<TX>(), out.data<TX>(), T, N);
    KUIPER_CUDA_CHECK_LAUNCH("stacked swiglu kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
