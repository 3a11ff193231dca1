// Rotary embedding, rotate-half form, in place. Positions come from device memory, so a captured
// decode graph rotates by whatever position the step wrote there.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"

namespace kuiper::cuda {

namespace {

// One block per (token, head), one thread per rotated pair: at decode (one token) the heads
// still spread over as many SMs.
template <typename TX>
__global__ void rope_kernel(TX* x, const int32_t* __restrict__ positions, RopeTable table,
                            int heads, int half) {
  const float pos = static_cast<float>(positions[blockIdx.x / heads]);
  rotate_half_row(x + static_cast<int64_t>(blockIdx.x) * 2 * half, half, table.attention_factor,
                  [&](int i) { return pos * table.inv_freq[i]; });
}

}  // namespace

Status rope(Tensor& x, const Tensor& positions, const op::RopeParams& rope) {
  const int64_t d = x.dim(2);
  KUIPER_RETURN_IF_ERROR(check_rope_dim("rope", d));
  return launch_head_rows("rope kernel", x, positions, make_rope_table(rope, d, d / 2),
                          [](auto tag) { return rope_kernel<typename decltype(tag)::type>; });
}

}  // namespace kuiper::cuda
