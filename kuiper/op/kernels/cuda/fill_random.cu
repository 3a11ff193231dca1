// The random fill behind random-weight models: the CPU kernel's hash (random_uniform.h), so both
// devices produce the same bits.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/random_uniform.h"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float scale, float offset) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_float<T>(random_uniform(seed, static_cast<uint64_t>(i), scale, offset));
}

}  // namespace

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
