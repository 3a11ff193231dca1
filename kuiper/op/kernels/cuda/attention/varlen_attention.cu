// Bidirectional attention over packed sequences (one sequence per image frame) for the vision
// tower. Activations fp32, fp16 or bf16, arithmetic fp32.
#include <cmath>

#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

using op::cuda_attention::fast_exp2;
using op::cuda_attention::SoftmaxState;

// ---- Attention over packed sequences ----
//
// A block holds kQueries consecutive query rows of one head, one warp each. It walks the keys of
// the sequences its queries belong to in tiles of 32 staged in shared memory (fp32), and each
// warp keeps an online softmax (SoftmaxState, scores in the log2 domain; the output accumulator
// beside it): lane j scores
// key j of the tile, then every lane adds the tile's weighted values to the output dimensions it
// owns (lane, lane + 32, ...). Memory is O(tile), whatever the sequence length. A key outside a
// query's own sequence gets weight 0, so a block straddling two images stays exact.

constexpr int kQueries = 8;  // warps per block
constexpr int kKeyTile = 32;
constexpr int kMaxHeadDim = 128;
constexpr int kMaxPerLane = kMaxHeadDim / 32;

// [begin, end) of the sequence holding token t: the last i with cu[i] <= t, clamped to [0, T].
__device__ __forceinline__ void sequence_of(const int32_t* cu, int S, int64_t t, int64_t T,
                                            int64_t& begin, int64_t& end) {
  int lo = 0, hi = S;  // answer in [0, S)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= t) lo = mid; else hi = mid;
  }
  begin = min(max(static_cast<int64_t>(cu[lo]), int64_t{0}), T);
  end = min(max(static_cast<int64_t>(cu[lo + 1]), begin), T);
}

template <typename TX>
__global__ void __launch_bounds__(kQueries * 32)
    varlen_attention_kernel(const TX* __restrict__ q, const TX* __restrict__ k,
                            const TX* __restrict__ v, const int32_t* __restrict__ cu, int S,
                            TX* __restrict__ out, int64_t T, int heads, int d, float scale) {
  extern __shared__ float smem[];
  const int k_stride = d | 1;  // odd: lane j reading key row j hits bank (j * stride + c) % 32
  float* ks = smem;                     // [kKeyTile][k_stride]
  float* vs = ks + kKeyTile * k_stride;  // [kKeyTile][d]
  float* qs = vs + kKeyTile * d;        // [kQueries][d], pre-scaled (log2 domain)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y;
  const int64_t width = static_cast<int64_t>(heads) * d;
  const int64_t q_first = static_cast<int64_t>(blockIdx.x) * kQueries;
  const int64_t q_last = min(q_first + kQueries, T) - 1;
  const int64_t t = q_first + warp;
  const bool active = t < T;

  int64_t my_begin = 0, my_end = 0, block_begin, block_end, unused;
  if (active) sequence_of(cu, S, t, T, my_begin, my_end);
  sequence_of(cu, S, q_first, T, block_begin, unused);
  sequence_of(cu, S, q_last, T, unused, block_end);

  if (active) {
    for (int c = lane; c < d; c += 32) qs[warp * d + c] = to_float(q[t * width + head * d + c]) * scale;
  }
  SoftmaxState st;
  float acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;

  for (int64_t k0 = block_begin; k0 < block_end; k0 += kKeyTile) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kKeyTile), block_end - k0));
    __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
    for (int idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
      const int j = idx / d, c = idx - j * d;
      const int64_t g = (k0 + j) * width + head * d + c;
      ks[j * k_stride + c] = to_float(k[g]);
      vs[j * d + c] = to_float(v[g]);
    }
    __syncthreads();
    if (!active) continue;  // the loop bounds are block-wide, so the barriers above stay uniform
    const int64_t key = k0 + lane;
    float s = -INFINITY;
    if (lane < n && key >= my_begin && key < my_end) {
      const float* qr = qs + warp * d;
      const float* kr = ks + lane * k_stride;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot += qr[c] * kr[c];
      s = dot;
    }
    const float tile_max = warp_max(s);
    if (tile_max == -INFINITY) continue;  // no key of this tile is in the query's sequence
    const float alpha = st.raise_max(tile_max);  // 0 while m is still -inf
    const float p = fast_exp2(s - st.m);          // 0 for s = -inf
    st.accumulate(alpha, warp_sum(p));
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] *= alpha;
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* vr = vs + j * d;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int c = lane + 32 * i;
        if (c < d) acc[i] += pj * vr[c];
      }
    }
  }
  if (!active) return;
  const float inv = 1.0f / st.l;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) out[t * width + head * d + c] = from_float<TX>(acc[i] * inv);
  }
}

}  // namespace

Status varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                        int64_t heads, Tensor& out) {
  const int64_t T = q.dim(0), d = q.dim(1) / heads;
  if (d > kMaxHeadDim) {
    return Status::Error("varlen_attention: head_dim " + std::to_string(d) +
                         " exceeds the CUDA kernel's " + std::to_string(kMaxHeadDim));
  }
  if (T == 0) return Status::Ok();
  const int k_stride = static_cast<int>(d) | 1;
  const size_t smem = sizeof(float) * (kKeyTile * k_stride + kKeyTile * d + kQueries * d);
  const dim3 grid(blocks_for(T, kQueries), static_cast<unsigned>(heads));
  // log2(e) / sqrt(d): scores in the log2 domain, each exponential one ex2.
  const float scale = 1.4426950408889634f / std::sqrt(static_cast<float>(d));
  return visit_activation(q.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    varlen_attention_kernel<TX><<<grid, kQueries * 32, smem, stream()>>>(
        q.data<TX>(), k.data<TX>(), v.data<TX>(), cu_seqlens.data<int32_t>(),
        static_cast<int>(cu_seqlens.numel() - 1), out.data<TX>(), T, static_cast<int>(heads),
        static_cast<int>(d), scale);
    KUIPER_CUDA_CHECK_LAUNCH("varlen attention kernel");
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
