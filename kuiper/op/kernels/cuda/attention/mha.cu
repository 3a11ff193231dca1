// Standard attention, the baseline the flash kernels are measured against: scores are written
// to a scratch buffer, a softmax normalises each row, then P·V is read back. Prefill runs in
// passes of at most kRowsPerPass queries of every sequence, so the scratch is sequences x rows x
// heads x key_capacity floats, never T^2: it grows only linearly with the context, and the rows
// of a pass shrink (down to one) so that it stays within kScoreBudgetBytes (256 MB) whenever one
// row of every sequence fits (32 heads would need 2M keys in all to exceed it).
//
// Two kernels per pass (grid z: sequence x row of the pass):
//   mha_scores      grid (key tiles, heads, rows): one warp per key, lanes across head_dim,
//                   a warp-sum gives each score q·k * scale (log2 domain).
//   mha_softmax_pv  grid (heads, rows): block max and sum over the row, then warps split the
//                   keys for P·V and reduce their partial outputs through shared memory.
// Device-position and paged calls size the score grid for key_capacity; tiles past a query's
// position exit.
#include <algorithm>

#include "kuiper/op/kernels/cuda/attention/ops.cuh"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::op::cuda_attention {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeysPerBlock = 64;
constexpr int kRowsPerPass = 16;
constexpr size_t kScoreBudgetBytes = size_t{256} << 20;

// Queries of each sequence per pass: kRowsPerPass, fewer when their score rows would exceed
// the budget or the grid's z extent (65535).
int rows_per_pass(const Geometry& g) {
  const size_t row_bytes =
      sizeof(float) * static_cast<size_t>(g.heads) * g.key_capacity * g.batch;
  const size_t fit = std::max<size_t>(1, kScoreBudgetBytes / row_bytes);
  return static_cast<int>(std::min<size_t>({fit, static_cast<size_t>(kRowsPerPass),
                                            static_cast<size_t>(g.max_queries),
                                            static_cast<size_t>(65535 / g.batch)}));
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) mha_scores(const T* __restrict__ q,
                                                      const T* __restrict__ k, float* scores,
                                                      Geometry g, int row0) {
  constexpr int kPerLane = D / 32;
  const Sequence seq = sequence(g, static_cast<int>(blockIdx.z) / g.splits);
  const int t = row0 + static_cast<int>(blockIdx.z) % g.splits;  // splits: rows of the pass
  if (t >= seq.T) return;
  const int h = blockIdx.y;
  const int pos = seq.pos0 + t;
  const int key0 = blockIdx.x * kKeysPerBlock;
  if (key0 > pos) return;  // causal: the whole tile is in this query's future
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float qv[kPerLane];
  load_vec<T, kPerLane>(query_rows<D>(q, g, seq.q0) + (static_cast<size_t>(t) * g.heads + h) * D +
                            lane * kPerLane,
                        qv);
  const int kvh = h / g.group;
  float* row = scores + (static_cast<size_t>(blockIdx.z) * g.heads + h) * g.key_capacity;
  const int key_end = min(key0 + kKeysPerBlock, pos + 1);
  for (int j = key0 + warp; j < key_end; j += kWarps) {
    float kv[kPerLane];
    load_vec<T, kPerLane>(
        k + (static_cast<size_t>(seq.keys.row(j)) * g.kv_heads + kvh) * D + lane * kPerLane, kv);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) s += qv[i] * kv[i];
    s = group_sum<32>(s);
    if (lane == 0) row[j] = s * g.scale_log2;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) mha_softmax_pv(const T* __restrict__ v, float* scores,
                                                          T* __restrict__ out, Geometry g,
                                                          int row0) {
  constexpr int kPerLane = D / 32;
  __shared__ float reduce[kWarps];
  __shared__ float partial[kWarps][D];
  const Sequence seq = sequence(g, static_cast<int>(blockIdx.y) / g.splits);
  const int t = row0 + static_cast<int>(blockIdx.y) % g.splits;
  if (t >= seq.T) return;
  const int h = blockIdx.x;
  const int len = seq.pos0 + t + 1;
  float* row = scores + (static_cast<size_t>(blockIdx.y) * g.heads + h) * g.key_capacity;

  float m = -INFINITY;
  for (int j = threadIdx.x; j < len; j += kThreads) m = fmaxf(m, row[j]);
  m = block_reduce<kThreads, true>(m, reduce);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < len; j += kThreads) {
    const float e = fast_exp2(row[j] - m);
    row[j] = e;
    sum += e;
  }
  sum = block_reduce<kThreads, false>(sum, reduce);  // its barriers also publish the exponentials

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvh = h / g.group;
  float o[kPerLane] = {};
  for (int j = warp; j < len; j += kWarps) {
    const float p = row[j];
    float vv[kPerLane];
    load_vec<T, kPerLane>(
        v + (static_cast<size_t>(seq.keys.row(j)) * g.kv_heads + kvh) * D + lane * kPerLane, vv);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) o[i] += p * vv[i];
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) partial[warp][lane * kPerLane + i] = o[i];
  __syncthreads();
  if (threadIdx.x < D) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += partial[w][threadIdx.x];
    out[(static_cast<size_t>(seq.q0 + t) * g.heads + h) * D + threadIdx.x] =
        cuda::from_float<T>(acc / sum);
  }
}

}  // namespace

Status run_mha(const AttentionArgs& a, const Geometry& geometry, const AttentionRequest& r,
               AttentionBuffers& buffers) {
  const int rows_cap = rows_per_pass(geometry);
  KUIPER_ASSIGN_OR_RETURN(float* scores,
                          buffers.partials.floats(static_cast<size_t>(geometry.batch) * rows_cap *
                                                  geometry.heads * geometry.key_capacity));
  return with_instantiation(r.dtype, r.head_dim, [&](auto tt, auto dt) -> Status {
    using T = typename decltype(tt)::type;
    constexpr int D = decltype(dt)::value;
    const T* q = a.q.data<T>();
    const T* k = a.k_cache.data<T>();
    const T* v = a.v_cache.data<T>();
    T* out = a.out.data<T>();
    for (int row0 = 0; row0 < geometry.max_queries; row0 += rows_cap) {
      // Grid z is (sequence, row of the pass), `rows` of them a sequence: passed as g.splits.
      Geometry g = geometry;
      g.splits = std::min(rows_cap, g.max_queries - row0);
      // Keys the last query of the pass sees: known on the host for the contiguous form without
      // a device position, else key_capacity.
      const bool host_keys = g.starts == nullptr && !r.device_position;
      const int keys = host_keys ? g.start + row0 + g.splits : g.key_capacity;
      const dim3 score_grid((keys + kKeysPerBlock - 1) / kKeysPerBlock, g.heads,
                            g.batch * g.splits);
      mha_scores<T, D><<<score_grid, kThreads, 0, cuda::stream()>>>(q, k, scores, g, row0);
      KUIPER_CUDA_CHECK_LAUNCH("mha_scores");
      mha_softmax_pv<T, D><<<dim3(g.heads, g.batch * g.splits), kThreads, 0, cuda::stream()>>>(
          v, scores, out, g, row0);
      KUIPER_CUDA_CHECK_LAUNCH("mha_softmax_pv");
    }
    return Status::Ok();
  });
}

}  // namespace kuiper::op::cuda_attention
