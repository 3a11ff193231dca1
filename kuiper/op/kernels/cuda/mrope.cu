// Interleaved multimodal RoPE (Qwen3-VL), rotate-half form, in place: each rotary frequency reads
// its position from the t, h or w row of positions [3, T] (device memory). inv_freq and the
// frequency -> axis table are computed on the host, as for rope, and passed by value.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"
#include "kuiper/op/kernels/mrope_axes.h"

namespace kuiper::cuda {

namespace {

struct MropeTable {
  RopeTable rope;
  uint8_t axis[kMaxRopeHalfDim];
};

// One block per (token, head), one thread per rotated pair.
template <typename TX>
__global__ void mrope_kernel(TX* x, const int32_t* __restrict__ positions, MropeTable table,
                             int64_t tokens, int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  rotate_half_row(x + static_cast<int64_t>(blockIdx.x) * 2 * half, half,
                  table.rope.attention_factor, [&](int i) {
                    return static_cast<float>(positions[table.axis[i] * tokens + t]) *
                           table.rope.inv_freq[i];
                  });
}

}  // namespace

Status mrope(Tensor& x, const Tensor& positions, const op::RopeParams& rope,
             const std::vector<int64_t>& sections) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  KUIPER_RETURN_IF_ERROR(check_rope_dim("mrope", d));
  if (T == 0) return Status::Ok();
  MropeTable table{};
  table.rope = make_rope_table(rope, d, half);
  const std::vector<uint8_t> axes = op::mrope_axes(half, sections);
  for (int64_t i = 0; i < half; ++i) table.axis[i] = axes[static_cast<size_t>(i)];
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    mrope_kernel<TX><<<static_cast<unsigned>(T * heads), rope_threads(half), 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), table, T, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH("mrope kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
