// out[to[j]] = src[from[j]], a thread an entry; an index out of range skips its entry (the host
// does not read the indices, which may have been written on the device).
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void copy_indexed_kernel(const int32_t* __restrict__ src, int64_t src_n,
                                    const int32_t* __restrict__ from,
                                    const int32_t* __restrict__ to, int64_t n,
                                    int32_t* __restrict__ out, int64_t out_n) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= n) return;
  const int32_t f = from[j], t = to[j];
  if (f < 0 || f >= src_n || t < 0 || t >= out_n) return;
  out[t] = src[f];
}

}  // namespace

Status copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out) {
  const int64_t n = from.numel();
  if (n == 0) return Status::Ok();
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  copy_indexed_kernel<<<blocks, kThreads, 0, stream()>>>(src.data<int32_t>(), src.numel(),
                                                         from.data<int32_t>(), to.data<int32_t>(),
                                                         n, out.data<int32_t>(), out.numel());
  KUIPER_CUDA_CHECK_LAUNCH("copy_indexed kernel");
  return Status::Ok();
}

}  // namespace kuiper::cuda
