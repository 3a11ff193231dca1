// KV-cache write: row t of k goes to cache row positions[t]. The positions live in device memory
// so that a captured decode graph writes each step where that step's position says.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

// One block per token. A position outside the cache is skipped: the caller validates positions
// on the host, and a bad one must not become an out-of-bounds write.
template <typename TX>
__global__ void kv_write_kernel(const TX* __restrict__ k, TX* __restrict__ cache,
                                const int32_t* __restrict__ positions, int64_t D,
                                int64_t cache_rows) {
  const int64_t t = blockIdx.x;
  const int64_t row = positions[t];
  if (row < 0 || row >= cache_rows) return;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) cache[row * D + j] = k[t * D + j];
}

}  // namespace

Status kv_write(const Tensor& k, Tensor& cache, const Tensor& positions) {
  const int64_t T = k.dim(0), D = k.dim(1);
  if (T == 0) return Status::Ok();
  return visit_activation(k.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    kv_write_kernel<TX><<<static_cast<unsigned>(T), 256, 0, stream()>>>(
        k.data<TX>(), cache.data<TX>(), positions.data<int32_t>(), D, cache.dim(0));
    KUIPER_CUDA_CHECK_LAUNCH("kv_write kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
