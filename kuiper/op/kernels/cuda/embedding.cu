// out[t, :] = table[ids[t], :], widened or narrowed to the activation type. One block per token.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

template <typename TT, typename TO>
__global__ void embedding_kernel(const TT* __restrict__ table, const int32_t* __restrict__ ids,
                                 TO* __restrict__ out, int64_t H) {
  const int64_t t = blockIdx.x;
  const TT* row = table + static_cast<int64_t>(ids[t]) * H;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) out[t * H + j] = from_float<TO>(to_float(row[j]));
}

}  // namespace

Status embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t T = ids.numel(), H = table.dim(1);
  if (T == 0) return Status::Ok();
  return visit_float(table.dtype(), [&](auto table_tag) {
    using TT = typename decltype(table_tag)::type;
    return visit_activation(out.dtype(), [&](auto out_tag) {
      using TO = typename decltype(out_tag)::type;
      embedding_kernel<TT, TO><<<static_cast<unsigned>(T), 256, 0, stream()>>>(
          table.data<TT>(), ids.data<int32_t>(), out.data<TO>(), H);
      KUIPER_CUDA_CHECK_LAUNCH("embedding kernel");
      return Status::Ok();
    });
  });
}

}  // namespace kuiper::cuda
