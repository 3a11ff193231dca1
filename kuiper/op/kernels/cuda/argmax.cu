// Row-wise argmax, one block per row; ties go to the lowest index, as in the CPU reference.
#include <cfloat>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 1024;

struct Best {
  float value;
  int64_t index;
};

// The better of two candidates: the larger value, or the lower index on equal values.
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

template <typename TX>
__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const TX* __restrict__ logits, int32_t* __restrict__ out, int64_t V) {
  const TX* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  Best best{-FLT_MAX, V};
  // Unrolled so each thread has several loads in flight: one block reads a whole vocab row.
#pragma unroll 8
  for (int64_t i = threadIdx.x; i < V; i += kThreads) best = better(best, Best{to_float(row[i]), i});
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.value, offset),
               __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = better(best, other);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = better(best, warp_best[w]);
    // A row of NaN or -inf only: index 0, like the CPU reference.
    out[blockIdx.x] = static_cast<int32_t>(best.index < V ? best.index : 0);
  }
}

}  // namespace

Status argmax(const Tensor& logits, Tensor& out) {
  const int64_t V = logits.dim(-1), rows = logits.numel() / V;
  if (rows == 0) return Status::Ok();
  return visit_activation(logits.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    argmax_kernel<TX><<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
        logits.data<TX>(), out.data<int32_t>(), V);
    KUIPER_CUDA_CHECK_LAUNCH("argmax kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
