// 2-D rotary embedding of image patches (the vision tower's), rotate-half form, in place.
// Activations fp32, fp16 or bf16, arithmetic fp32.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"

namespace kuiper::cuda {

namespace {

// One block per (token, head), one thread per rotated pair: the first quarter of the pairs turn
// by the patch's row, the second by its column, over the frequencies of d / 2 channels.
template <typename TX>
__global__ void rope_2d_kernel(TX* x, const int32_t* __restrict__ positions, RopeTable freq,
                               int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  const float row = static_cast<float>(positions[2 * t]);
  const float col = static_cast<float>(positions[2 * t + 1]);
  const int quarter = half / 2;
  rotate_half_row(x + static_cast<int64_t>(blockIdx.x) * 2 * half, half, 1.0f, [&](int i) {
    return i < quarter ? row * freq.inv_freq[i] : col * freq.inv_freq[i - quarter];
  });
}

}  // namespace

Status rope_2d(Tensor& x, const Tensor& positions, double theta) {
  const int64_t d = x.dim(2);
  KUIPER_RETURN_IF_ERROR(check_rope_dim("rope_2d", d));
  return launch_head_rows("rope_2d kernel", x, positions, make_rope_table(theta, d / 2, d / 4),
                          [](auto tag) { return rope_2d_kernel<typename decltype(tag)::type>; });
}

}  // namespace kuiper::cuda
