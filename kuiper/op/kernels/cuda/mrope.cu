// Interleaved multimodal RoPE (Qwen3-VL), rotate-half form, in place: each rotary frequency reads
// its position from the t, h or w row of positions [3, T] (device memory). inv_freq and the
// frequency -> axis table are computed on the host, as in rope.cu, and passed by value.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/mrope_axes.h"

namespace kuiper::cuda {

namespace {

constexpr int kMaxHalfDim = 256;  // head_dim up to 512

struct MropeTable {
  float inv_freq[kMaxHalfDim];
  uint8_t axis[kMaxHalfDim];
};

// One block per (token, head), one thread per rotated pair.
template <typename TX>
__global__ void mrope_kernel(TX* x, const int32_t* __restrict__ positions, MropeTable table,
                             int64_t tokens, int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  TX* v = x + static_cast<int64_t>(blockIdx.x) * 2 * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float pos = static_cast<float>(positions[table.axis[i] * tokens + t]);
    float s, c;
    sincosf(pos * table.inv_freq[i], &s, &c);
    const float a = to_float(v[i]), b = to_float(v[i + half]);
    v[i] = from_float<TX>(a * c - b * s);
    v[i + half] = from_float<TX>(b * c + a * s);
  }
}

}  // namespace

Status mrope(Tensor& x, const Tensor& positions, double theta,
             const std::vector<int64_t>& sections) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  if (half > kMaxHalfDim) {
    return Status::Error("mrope: head_dim " + std::to_string(d) + " exceeds the CUDA kernel's " +
                         std::to_string(2 * kMaxHalfDim));
  }
  if (T == 0) return Status::Ok();
  MropeTable table{};
  const std::vector<uint8_t> axes = op::mrope_axes(half, sections);
  for (int64_t i = 0; i < half; ++i) {
    table.inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                        static_cast<float>(2 * i) / static_cast<float>(d));
    table.axis[i] = axes[static_cast<size_t>(i)];
  }
  const int threads = static_cast<int>(std::min<int64_t>(256, (half + 31) / 32 * 32));
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    mrope_kernel<TX><<<static_cast<unsigned>(T * heads), threads, 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), table, T, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH("mrope kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
