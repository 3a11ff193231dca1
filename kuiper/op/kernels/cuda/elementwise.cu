// Elementwise kernels: SwiGLU, residual add, and the random fill behind random-weight models.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/random_uniform.h"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 256;

// out = silu(gate) * up with silu(g) = g / (1 + e^-g), the CPU reference's form.
template <typename TX>
__global__ void swiglu_kernel(const TX* gate, const TX* up, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = to_float(gate[i]);
  out[i] = from_float<TX>(g / (1.0f + expf(-g)) * to_float(up[i]));
}

template <typename TX>
__global__ void add_kernel(const TX* a, const TX* b, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<TX>(to_float(a[i]) + to_float(b[i]));
}

template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float scale, float offset) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<T>(random_uniform(seed, static_cast<uint64_t>(i), scale, offset));
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

Status fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  const int64_t n = t.numel();
  if (n == 0) return Status::Ok();
  return visit_float(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_random_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(t.data<T>(), n, seed,
                                                                             scale, offset);
    KUIPER_CUDA_CHECK_LAUNCH("fill_random kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
