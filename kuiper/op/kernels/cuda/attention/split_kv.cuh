// Split-KV decode (flash-decoding) for flash1 and the fp32 flash2 decode: how many splits a
// launch has, which keys each takes, and the kernel that combines the splits' partials.
#pragma once

#include <algorithm>

#include "kuiper/op/kernels/cuda/attention/common.cuh"
#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"
#include "kuiper/op/kernels/cuda/tuning_log.h"

namespace kuiper::op::cuda_attention {

// A decode launch has a fixed number of splits per (kv head, row block) (the grid's split
// dimension, chosen on the host from the SM count and the cache capacity, never from the
// position). Each split takes split_keys(len, splits, granularity) consecutive keys of the
// len = position + 1 keys the query sees, computed on the device from the position, so one
// captured graph serves every step; splits past the context exit at once.
__host__ __device__ __forceinline__ int split_keys(int len, int splits, int granularity) {
  const int per = (len + splits - 1) / splits;
  const int rounded = (per + granularity - 1) / granularity * granularity;
  return rounded > granularity ? rounded : granularity;
}

// The keys [kbeg, kend) of split blockIdx.z % g.splits of its sequence's kv_end keys; false when
// the split holds none (splits past the context exit at once).
__device__ __forceinline__ bool split_range(const Geometry& g, int kv_end, int granularity,
                                            int& kbeg, int& kend) {
  const int per = split_keys(kv_end, g.splits, granularity);
  kbeg = static_cast<int>(blockIdx.z) % g.splits * per;
  kend = min(kv_end, kbeg + per);
  return kbeg < kv_end;
}

// The partial slot of head h for this block's split: (sequence * heads + h) * splits + split,
// the layout combine_splits reads.
__device__ __forceinline__ size_t split_slot(const Geometry& g, int h) {
  const int z = blockIdx.z;
  return (static_cast<size_t>(z / g.splits) * g.heads + h) * g.splits + z % g.splits;
}

// out = sum_c o_c * 2^(m_c - M) / sum_c l_c * 2^(m_c - M) over the splits c that hold keys:
// o_c is split c's unnormalised output (sum_j 2^(s_j - m_c) v_j), (m_c, l_c) its maximum and
// exponential sum, at slot (sequence * heads + head) * max_splits + c. A block per (head,
// sequence) (grid (heads, batch)): each slice of D / 4 threads folds every kSlices-th split
// (fold_partials), then the slices' states are merged; the sequence's one query is its row of out.
constexpr int kCombineThreads = 256;
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads)
    combine_splits(const float* __restrict__ o_part, const float2* __restrict__ ml_part,
                   T* __restrict__ out, Geometry g, int max_splits, int granularity) {
  constexpr int kLanesPerRow = D / 4;  // float4 per lane
  constexpr int kSlices = kCombineThreads / kLanesPerRow;
  __shared__ float4 partial[kSlices][kLanesPerRow];
  __shared__ float2 states[kSlices];
  const int h = blockIdx.x;
  const Sequence seq = sequence(g, blockIdx.y);
  const int len = seq.pos0 + 1;
  const int per = split_keys(len, max_splits, granularity);
  const int used = (len + per - 1) / per;
  const size_t slot0 = (static_cast<size_t>(blockIdx.y) * g.heads + h) * max_splits;

  const int slice = threadIdx.x / kLanesPerRow, part = threadIdx.x % kLanesPerRow;
  SoftmaxState st;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // This slice's splits: slice, slice + kSlices, ... < used.
  const int mine = slice < used ? (used - slice + kSlices - 1) / kSlices : 0;
  fold_partials<D>(ml_part + slot0, reinterpret_cast<const float4*>(o_part + slot0 * D) + part,
                   mine, [slice](int i) { return static_cast<size_t>(slice + i * kSlices); }, st,
                   acc);
  partial[slice][part] = acc;
  if (part == 0) states[slice] = make_float2(st.m, st.l);
  __syncthreads();
  if (threadIdx.x < kLanesPerRow) {
    SoftmaxState total;
    float4 res = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kSlices && s < used; ++s) {  // slice s holds split s, so a finite m
      res = weigh(res, total.merge(states[s].x, states[s].y), partial[s][threadIdx.x]);
    }
    const float inv = 1.0f / total.l;
    const float x[4] = {res.x * inv, res.y * inv, res.z * inv, res.w * inv};
    store_vec<T, 4>(out + (static_cast<size_t>(seq.q0) * g.heads + h) * D + threadIdx.x * 4, x);
  }
}

// Splits per (sequence, kv head, row block) of a split-KV decode launch with `units` such
// triples: request.decode_grid / units when set, else enough blocks to give every SM
// `blocks_per_sm` (one wave of equal splits), but no more splits than a sequence's key_capacity
// fills with `granularity` keys each, nor more than grid z holds (65535 = batch * splits). The
// count never depends on a device-side value, so a captured launch stays valid.
inline Result<int> decode_split_count(const AttentionRequest& r, const Geometry& g, int units,
                                      int granularity, int blocks_per_sm) {
  const int ctx = g.key_capacity;
  const int most = std::min((ctx + granularity - 1) / granularity, 65535 / g.batch);
  int want = r.decode_grid / units;
  if (r.decode_grid <= 0) {
    KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
    want = blocks_per_sm * sms / units;  // never a partial second wave
  }
  const int splits = std::max(1, std::min(want, most));
  KUIPER_LOG_TUNING("attention " + describe(r) + ": " + std::to_string(splits) +
                    " splits per (sequence, kv head, row block), " + std::to_string(units) +
                    " of them, context " + std::to_string(ctx));
  return splits;
}

}  // namespace kuiper::op::cuda_attention
