// Rotary embedding, rotate-half form, in place. Positions come from device memory, so a captured
// decode graph rotates by whatever position the step wrote there.
//
// inv_freq is computed on the host with the CPU reference's exact fp32 expression and passed by
// value as a kernel parameter: device powf may differ from the host's by an ulp, and a kernel
// parameter is baked into a captured graph at no cost, unlike a table that would need a copy.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kMaxHalfDim = 256;  // head_dim up to 512

struct InvFreq {
  float v[kMaxHalfDim];
};

// One block per (token, head), one thread per rotated pair: at decode (one token) the heads
// still spread over as many SMs.
template <typename TX>
__global__ void rope_kernel(TX* x, const int32_t* __restrict__ positions, InvFreq inv_freq,
                            int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  const float pos = static_cast<float>(positions[t]);
  TX* v = x + static_cast<int64_t>(blockIdx.x) * 2 * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq.v[i], &s, &c);
    const float a = to_float(v[i]), b = to_float(v[i + half]);
    v[i] = from_float<TX>(a * c - b * s);
    v[i + half] = from_float<TX>(b * c + a * s);
  }
}

}  // namespace

Status rope(Tensor& x, const Tensor& positions, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  if (half > kMaxHalfDim) {
    return Status::Error("rope: head_dim " + std::to_string(d) + " exceeds the CUDA kernel's " +
                         std::to_string(2 * kMaxHalfDim));
  }
  if (T == 0) return Status::Ok();
  InvFreq inv_freq{};
  for (int64_t i = 0; i < half; ++i) {
    inv_freq.v[i] = 1.0f / std::pow(static_cast<float>(theta),
                                    static_cast<float>(2 * i) / static_cast<float>(d));
  }
  const int threads = static_cast<int>(std::min<int64_t>(256, (half + 31) / 32 * 32));
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    rope_kernel<TX><<<static_cast<unsigned>(T * heads), threads, 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), inv_freq, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH("rope kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
