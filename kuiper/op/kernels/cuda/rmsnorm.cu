// RMSNorm over rows of D elements. The row length decides the shape of the work: a hidden-size
// row (thousands of elements) gets a whole block, so at decode (one row) its loads are spread
// over 256 threads instead of queueing behind one warp; a head row (Qwen3's per-head q/k norm,
// x viewed as [T * heads, head_dim]) is one warp's work, with no shared memory or barrier. x and
// out may differ in type (the fp32 residual stream normalised into 16-bit activations). Launched
// with PDL: the weight is loaded before the wait for the kernel before, and the next kernel (the
// multi-row GEMVs at 3 to 8 sequences) may start asking for its weights while this one runs.
// Measured on the H100 (kuiper-bench --throughput --config models/qwen3-8b.json --dtype fp16
// --cuda-graph --concurrency 4,8 --input-len 448 --output-len 128, two rounds): 8 sequences
// 1152.2 / 1158.7 -> 1162.2 / 1162.8 tok/s, 4 sequences 612.3 / 616.0 -> 616.9 / 620.5.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kBlockThreads = 256;
constexpr int kWideRow = 1024;  // rows at least this long get a block each
// Elements a thread keeps in registers: a row of up to kThreadsPerRow * kHeld elements is read
// once, all of a thread's loads (x and the weight) in flight together, so the kernel costs one
// memory round trip and the reduction. Longer rows loop and read x twice. Measured on the H100
// (Nsight Compute, a 4096-wide fp32 residual row a block, 8 to 256 rows): 9.2 us a call when
// each thread walked its 16 elements 4 loads at a time, twice.
constexpr int kHeld = 32;

template <typename TX, typename TW, typename TO, int kThreadsPerRow, bool kInRegisters>
__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_kernel(const TX* x, const TW* __restrict__ weight, TO* out, int64_t rows, int D,
                   float eps) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  constexpr int kWarpsPerRow = kThreadsPerRow / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int tid = threadIdx.x % kThreadsPerRow;
  // x and out may alias: each thread reads its elements before writing the same ones.
  const TX* in = x + row * D;
  TO* o = out + row * D;
  const bool live = row < rows;
  float sum = 0.0f;
  float held[kInRegisters ? kHeld : 1], w[kInRegisters ? kHeld : 1];
  if constexpr (kInRegisters) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {  // the weight: safe before the PDL wait
      const int i = tid + j * kThreadsPerRow;
      w[j] = live && i < D ? to_float(weight[i]) : 0.0f;
    }
  }
  grid_dependency_wait();
  grid_launch_dependents();
  if constexpr (kInRegisters) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int i = tid + j * kThreadsPerRow;
      held[j] = live && i < D ? to_float(in[i]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kHeld; ++j) sum += held[j] * held[j];
  } else if (live) {
#pragma unroll 4
    for (int i = tid; i < D; i += kThreadsPerRow) {
      const float v = to_float(in[i]);
      sum += v * v;
    }
  }
  if constexpr (kWarpsPerRow > 1) {
    __shared__ float partial[kWarpsPerRow];
    sum = block_reduce<kThreadsPerRow, false>(sum, partial);
  } else {
    sum = warp_sum(sum);
  }
  if (!live) return;
  // The CPU reference's order: weight * (x * inv).
  const float inv = rms_inverse(sum, D, eps);
  if constexpr (kInRegisters) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int i = tid + j * kThreadsPerRow;
      if (i < D) o[i] = from_float<TO>(w[j] * (held[j] * inv));
    }
  } else {
#pragma unroll 4
    for (int i = tid; i < D; i += kThreadsPerRow) {
      o[i] = from_float<TO>(to_float(weight[i]) * (to_float(in[i]) * inv));
    }
  }
}

template <typename TX, typename TW, typename TO, int kThreadsPerRow>
Status launch(const Tensor& x, const Tensor& weight, double eps, Tensor& out, int64_t rows,
              int64_t D) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreadsPerRow;
  const auto kernel = D <= kThreadsPerRow * kHeld
                          ? rmsnorm_kernel<TX, TW, TO, kThreadsPerRow, true>
                          : rmsnorm_kernel<TX, TW, TO, kThreadsPerRow, false>;
  return launch_pdl(kernel, dim3(static_cast<unsigned>(blocks_for(rows, kRowsPerBlock))),
                    dim3(kBlockThreads), 0, "rmsnorm kernel", x.data<TX>(), weight.data<TW>(),
                    out.data<TO>(), rows, static_cast<int>(D), static_cast<float>(eps));
}

}  // namespace

Status rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out) {
  const int64_t D = weight.numel(), rows = x.numel() / D;
  if (rows == 0) return Status::Ok();
  return visit_activation_pair(x.dtype(), out.dtype(), [&](auto x_tag, auto out_tag) {
    using TX = typename decltype(x_tag)::type;
    using TO = typename decltype(out_tag)::type;
    return visit_float(weight.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      if (D >= kWideRow) return launch<TX, TW, TO, kBlockThreads>(x, weight, eps, out, rows, D);
      return launch<TX, TW, TO, 32>(x, weight, eps, out, rows, D);
    });
  });
}

}  // namespace kuiper::cuda
