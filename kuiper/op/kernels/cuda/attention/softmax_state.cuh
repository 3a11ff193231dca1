// The online softmax, written once for every attention kernel (FlashInfer's attention/state.cuh
// and FlashAttention's softmax.h are the models). Scores are in the log2 domain (q carries
// scale * log2(e)), so every exponential is one ex2.
//
// A state is the running maximum m and the denominator l = sum_j 2^(s_j - m) of the keys folded
// in so far; the output accumulated beside it is sum_j 2^(s_j - m) v_j (normalised by 1 / l at
// the end), or already normalised in FA1's form. Folding in a tile whose maximum exceeds m
// multiplies everything accumulated so far by alpha = 2^(m_old - m_new); two states over
// disjoint keys merge by weighting each with 2^(m_i - m_new).
#pragma once

#include <cuda_runtime.h>

#include "kuiper/op/kernels/cuda/attention/common.cuh"

namespace kuiper::op::cuda_attention {

struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.0f;

  // Raises m to cover a tile whose maximum is tile_max and returns alpha, the factor for l and
  // for the output accumulated under the old m (l itself is scaled by accumulate()). With m still
  // -inf and a finite tile_max, alpha is 0.
  __device__ __forceinline__ float raise_max(float tile_max) {
    const float m_new = fmaxf(m, tile_max);
    const float alpha = fast_exp2(m - m_new);
    m = m_new;
    return alpha;
  }
  // l = l * alpha + the tile's sum of 2^(s - m).
  __device__ __forceinline__ void accumulate(float alpha, float tile_sum) {
    l = l * alpha + tile_sum;
  }
  // Folds in another state (m2, l2) over other keys; returns the weights (this, other) of the two
  // outputs in the merged one. At least one of m, m2 must be finite.
  __device__ __forceinline__ float2 merge(float m2, float l2) {
    const float m_new = fmaxf(m, m2);
    const float w_self = fast_exp2(m - m_new), w_other = fast_exp2(m2 - m_new);
    m = m_new;
    l = l * w_self + l2 * w_other;
    return make_float2(w_self, w_other);
  }
};

// acc * w.x + y * w.y: an output slice under the weights merge() returned.
__device__ __forceinline__ float4 weigh(float4 acc, float2 w, float4 y) {
  return make_float4(acc.x * w.x + w.y * y.x, acc.y * w.x + w.y * y.y, acc.z * w.x + w.y * y.z,
                     acc.w * w.x + w.y * y.w);
}

// Folds count split-KV partials into (st, acc), in order: partial i is the state ml[slot(i)]
// and the output slice o[slot(i) * D / 4] (a float4 of a D-wide row). Every partial saw at least
// one key (finite m). Read through L2: other blocks wrote them. The loads go out kFoldChunk at a
// time, all of a chunk before the first is used: a loop whose count is known only at run time
// (`#pragma unroll` or not) waited for each partial's L2 round trip in turn, 4.4 us of the decode
// attention's 13 us at batch 1 (docs/PERFORMANCE.md, issue 15's section). The same sums in the
// same order as one at a time.
constexpr int kFoldChunk = 8;
template <int D, typename SlotOf>
__device__ __forceinline__ void fold_partials(const float2* ml, const float4* o, int count,
                                              SlotOf slot, SoftmaxState& st, float4& acc) {
  for (int i0 = 0; i0 < count; i0 += kFoldChunk) {
    float2 x[kFoldChunk];
    float4 y[kFoldChunk];
#pragma unroll
    for (int j = 0; j < kFoldChunk; ++j) {
      x[j] = make_float2(-INFINITY, 0.0f);
      y[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i0 + j < count) {
        const size_t s = slot(i0 + j);
        x[j] = __ldcg(ml + s);
        y[j] = __ldcg(o + s * (D / 4));
      }
    }
#pragma unroll
    for (int j = 0; j < kFoldChunk; ++j) {
      if (i0 + j < count) acc = weigh(acc, st.merge(x[j].x, x[j].y), y[j]);
    }
  }
}

// The online softmax of the two rows a thread holds in an mma.sync m16n8 accumulator: row
// lane / 4 in elements [0], [1] and row lane / 4 + 8 in [2], [3] of every 8-column fragment. A
// row spans the 4 lanes of a quad: maxima are reduced across it at once, each lane's l stays a
// partial sum until reduce_rows().
struct MmaRowsSoftmax {
  SoftmaxState row[2];

  // Turns a tile of scores s (log2 domain, masked keys -inf; each row must have a finite score
  // here or in an earlier tile) into P = 2^(s - m) in place, and rescales the output o.
  template <int kN, int kO>
  __device__ __forceinline__ void update(float (&s)[kN][4], float (&o)[kO][4]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    const float alpha0 = row[0].raise_max(group_max<4>(mx[0]));
    const float alpha1 = row[1].raise_max(group_max<4>(mx[1]));
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      s[j][0] = exp2_ftz(s[j][0] - row[0].m);
      s[j][1] = exp2_ftz(s[j][1] - row[0].m);
      s[j][2] = exp2_ftz(s[j][2] - row[1].m);
      s[j][3] = exp2_ftz(s[j][3] - row[1].m);
      sum[0] += s[j][0] + s[j][1];
      sum[1] += s[j][2] + s[j][3];
    }
    row[0].accumulate(alpha0, sum[0]);
    row[1].accumulate(alpha1, sum[1]);
    // Once the maxima settle, most tiles raise none of them: alpha is then exactly 1 and the
    // output needs no rescaling (a vote keeps the skip one branch for the warp).
    if (!__any_sync(__activemask(), alpha0 != 1.0f || alpha1 != 1.0f)) return;
#pragma unroll
    for (int n = 0; n < kO; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }
  }

  // Completes each row's l across its quad (every lane of the quad gets it).
  __device__ __forceinline__ void reduce_rows() {
    row[0].l = group_sum<4>(row[0].l);
    row[1].l = group_sum<4>(row[1].l);
  }
};

// The online softmax of an mma m16n8 accumulator whose columns are what is normalised (the
// decode's keys-as-rows product, mma_kq): a thread holds columns (heads) (lane % 4) * 2 and + 1
// of rows (keys) lane / 4 and lane / 4 + 8, in [0], [1] and [2], [3]. A column spans the 8 lanes
// of one lane % 4: maxima are reduced across them at once, each lane's l stays a partial sum
// until reduce_columns().
struct MmaColumnsSoftmax {
  SoftmaxState col[2];

  static __device__ __forceinline__ float column_max(float x) {
#pragma unroll
    for (int off = 4; off < 32; off *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
  }
  static __device__ __forceinline__ float column_sum(float x) {
#pragma unroll
    for (int off = 4; off < 32; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
  }

  // Turns a tile of scores s (log2 domain, masked keys -inf; each column must have a finite
  // score here or in an earlier tile) into P = 2^(s - m) in place, and rescales the output o.
  template <int kO>
  __device__ __forceinline__ void update(float (&s)[4], float (&o)[kO][4]) {
    const float alpha0 = col[0].raise_max(column_max(fmaxf(s[0], s[2])));
    const float alpha1 = col[1].raise_max(column_max(fmaxf(s[1], s[3])));
    s[0] = exp2_ftz(s[0] - col[0].m);
    s[2] = exp2_ftz(s[2] - col[0].m);
    s[1] = exp2_ftz(s[1] - col[1].m);
    s[3] = exp2_ftz(s[3] - col[1].m);
    col[0].accumulate(alpha0, s[0] + s[2]);
    col[1].accumulate(alpha1, s[1] + s[3]);
    if (!__any_sync(__activemask(), alpha0 != 1.0f || alpha1 != 1.0f)) return;
#pragma unroll
    for (int n = 0; n < kO; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha1;
      o[n][2] *= alpha0;
      o[n][3] *= alpha1;
    }
  }

  // Completes each column's l across its 8 lanes (every one of them gets it).
  __device__ __forceinline__ void reduce_columns() {
    col[0].l = column_sum(col[0].l);
    col[1].l = column_sum(col[1].l);
  }
};

}  // namespace kuiper::op::cuda_attention
