// 2-D rotary embedding of image patches (the vision tower's), rotate-half form, in place.
// Activations fp32 or fp16, arithmetic fp32.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"

namespace kuiper::cuda {

namespace {

// One block per (token, head), one thread per rotated pair: the first quarter of the pairs turn
// by the patch's row, the second by its column, over the frequencies of d / 2 channels.
template <typename TX>
__global__ void rope_2d_kernel(TX* x, const int32_t* __restrict__ positions, InvFreq freq,
                               int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  const float row = static_cast<float>(positions[2 * t]);
  const float col = static_cast<float>(positions[2 * t + 1]);
  const int quarter = half / 2;
  rotate_half_row(x + static_cast<int64_t>(blockIdx.x) * 2 * half, half, [&](int i) {
    return i < quarter ? row * freq.v[i] : col * freq.v[i - quarter];
  });
}

}  // namespace

Status rope_2d(Tensor& x, const Tensor& positions, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  KUIPER_RETURN_IF_ERROR(check_rope_dim("rope_2d", d));
  if (T == 0) return Status::Ok();
  const InvFreq freq = make_inv_freq(theta, half, d / 4);
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    rope_2d_kernel<TX><<<static_cast<unsigned>(T * heads), rope_threads(half), 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), freq, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH("rope_2d kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
