// CUDA kernels of the vision tower: LayerNorm, GELU and the 2-D rotary embedding. Activations
// fp32 or fp16, arithmetic fp32.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/rope_2d_freq.h"

namespace kuiper::cuda {

namespace {

constexpr int kBlockThreads = 256;

// ---- LayerNorm ----

// Sum of v over the kThreadsPerRow threads of a row (a warp, or the whole block). `partial`
// holds one float per warp of the row; the barrier at the end lets it be reused at once.
template <int kThreadsPerRow>
__device__ __forceinline__ float row_sum(float v, float* partial) {
  v = warp_sum(v);
  if constexpr (kThreadsPerRow > 32) {
    constexpr int kWarps = kThreadsPerRow / 32;
    const int tid = threadIdx.x % kThreadsPerRow;
    if (tid % 32 == 0) partial[tid / 32] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[w];
    __syncthreads();
  }
  return v;
}

// Two passes over the row (mean, then the squared deviations), as the CPU reference: a wide
// row (merged vision tokens are 4x hidden) gets a block, a narrow one a warp.
template <typename TX, typename TW, int kThreadsPerRow>
__global__ void __launch_bounds__(kBlockThreads)
    layernorm_kernel(const TX* x, const TW* __restrict__ weight, const TW* __restrict__ bias,
                     TX* out, int64_t rows, int D, float eps) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  __shared__ float partial[kThreadsPerRow / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int tid = threadIdx.x % kThreadsPerRow;
  const bool valid = row < rows;  // block-wide rows are always valid, so barriers are uniform
  const TX* in = x + (valid ? row : 0) * D;
  float sum = 0.0f;
  if (valid) {
    for (int i = tid; i < D; i += kThreadsPerRow) sum += to_float(in[i]);
  }
  const float mean = row_sum<kThreadsPerRow>(sum, partial) / static_cast<float>(D);
  float sq = 0.0f;
  if (valid) {
    for (int i = tid; i < D; i += kThreadsPerRow) {
      const float c = to_float(in[i]) - mean;
      sq += c * c;
    }
  }
  const float var = row_sum<kThreadsPerRow>(sq, partial) / static_cast<float>(D);
  if (!valid) return;
  // x and out may alias: each thread rewrites only elements it has finished reading.
  const float inv = 1.0f / sqrtf(var + eps);
  TX* o = out + row * D;
  for (int i = tid; i < D; i += kThreadsPerRow) {
    o[i] = from_float<TX>((to_float(in[i]) - mean) * inv * to_float(weight[i]) +
                          to_float(bias[i]));
  }
}

template <typename TX, typename TW, int kThreadsPerRow>
Status launch_layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        Tensor& out, int64_t rows, int64_t D) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  layernorm_kernel<TX, TW, kThreadsPerRow>
      <<<blocks_for(rows, kRowsPerBlock), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), weight.data<TW>(), bias.data<TW>(), out.data<TX>(), rows,
          static_cast<int>(D), static_cast<float>(eps));
  KUIPER_CUDA_CHECK_LAUNCH("layernorm kernel");
  return Status::Ok();
}

// ---- GELU ----

template <typename TX, bool kTanh>
__global__ void gelu_kernel(const TX* x, TX* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = to_float(x[i]);
  float y;
  if constexpr (kTanh) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    y = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
  } else {
    y = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
  }
  out[i] = from_float<TX>(y);
}

// ---- 2-D rotary embedding ----

constexpr int kMaxQuarterDim = 128;  // head_dim up to 512

struct Rope2dFreq {
  float v[kMaxQuarterDim];
};

// One block per (token, head), one thread per rotated pair.
template <typename TX>
__global__ void rope_2d_kernel(TX* x, const int32_t* __restrict__ positions, Rope2dFreq freq,
                               int heads, int half) {
  const int64_t t = blockIdx.x / heads;
  const float row = static_cast<float>(positions[2 * t]);
  const float col = static_cast<float>(positions[2 * t + 1]);
  const int quarter = half / 2;
  TX* v = x + static_cast<int64_t>(blockIdx.x) * 2 * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = i < quarter ? row * freq.v[i] : col * freq.v[i - quarter];
    float s, c;
    sincosf(angle, &s, &c);
    const float a = to_float(v[i]), b = to_float(v[i + half]);
    v[i] = from_float<TX>(a * c - b * s);
    v[i + half] = from_float<TX>(b * c + a * s);
  }
}

}  // namespace

Status layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor& out) {
  const int64_t D = weight.numel(), rows = x.numel() / D;
  if (rows == 0) return Status::Ok();
  if (bias.dtype() != weight.dtype()) {
    return Status::Error(std::string("layernorm: the CUDA kernel wants weight and bias of one "
                                     "type, got ") + weight.describe() + " and " +
                         bias.describe());
  }
  return visit_activation(x.dtype(), [&](auto x_tag) {
    using TX = typename decltype(x_tag)::type;
    return visit_float(weight.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      if (D >= 1024) return launch_layernorm<TX, TW, kBlockThreads>(x, weight, bias, eps, out, rows, D);
      return launch_layernorm<TX, TW, 32>(x, weight, bias, eps, out, rows, D);
    });
  });
}

Status gelu(const Tensor& x, op::GeluKind kind, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return Status::Ok();
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    if (kind == op::GeluKind::kTanh) {
      gelu_kernel<TX, true><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), out.data<TX>(), n);
    } else {
      gelu_kernel<TX, false><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream()>>>(
          x.data<TX>(), out.data<TX>(), n);
    }
    KUIPER_CUDA_CHECK_LAUNCH("gelu kernel");
    return Status::Ok();
  });
}

Status rope_2d(Tensor& x, const Tensor& positions, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2, quarter = d / 4;
  if (quarter > kMaxQuarterDim) {
    return Status::Error("rope_2d: head_dim " + std::to_string(d) + " exceeds the CUDA kernel's " +
                         std::to_string(4 * kMaxQuarterDim));
  }
  if (T == 0) return Status::Ok();
  Rope2dFreq freq{};
  for (int64_t j = 0; j < quarter; ++j) freq.v[j] = rope_2d_inv_freq(theta, d, j);
  const int threads = static_cast<int>(std::min<int64_t>(256, (half + 31) / 32 * 32));
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    rope_2d_kernel<TX><<<static_cast<unsigned>(T * heads), threads, 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), freq, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH("rope_2d kernel");
    return Status::Ok();
  });
}
}  // namespace kuiper::cuda
