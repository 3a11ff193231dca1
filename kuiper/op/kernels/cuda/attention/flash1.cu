// FlashAttention-1 style: a block holds a tile of query rows and streams large KV tiles through
// shared memory; per tile it computes the scores, the tile's own row maximum and sum, and folds
// them into the running statistics while the output is kept normalised after every tile (FA1's
// update O = (l e^(m - m') O + e^(m~ - m') P~ V) / l'). Every tile is loaded by the whole block
// between two barriers, one buffer, no prefetch: the structure FlashAttention-2 later
// reorganised (delayed normalisation, per-warp rows, pipelined loads).
//
// fp16 and bf16 run QK^T and PV on tensor cores (flash1_tc_kernel: mma.sync m16n8k16 through the
// helpers shared with flash2), with 128-key tiles, and the output and the row statistics living in
// shared memory, read and rewritten once per tile, as FA1 keeps them in HBM. fp32 keeps the SIMT
// kernel (flash1_kernel): tensor cores would round fp32 operands to tf32.
//
// Rows are (query, head) pairs of one kv head: row r of the flattened [T x group] list is query
// r / group of head kvh * group + r % group. Packing a GQA group into one block loads each K/V
// tile once for all the heads that share it. The grid is (row blocks, kv heads, sequences x
// splits): a batch's sequences each get max_queries' worth of row blocks (the ones past a
// sequence's queries exit). Decode is the same kernel with one query per sequence, split over
// the KV length (grid z, split_keys in split_kv.cuh): each split writes an unnormalised partial
// (O * l, m, l) and combine_splits merges them. The split count never depends on the position,
// so the device-position variant only reads the position from the device.
#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention/ops.cuh"
#include "kuiper/op/kernels/cuda/attention/mma.cuh"
#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"
#include "kuiper/op/kernels/cuda/attention/split_kv.cuh"

namespace kuiper::op::cuda_attention {
namespace {

template <int D>
struct Flash1Traits {
  static constexpr int kRows = 16;     // query rows per block
  static constexpr int kKeys = 64;     // keys per KV tile
  static constexpr int kThreads = 128;
  static constexpr int kLanesPerRow = kThreads / kRows;            // 8 threads share a row
  static constexpr int kColsPerThread = kKeys / kLanesPerRow;      // scores per thread
  static constexpr int kDimsPerThread = D / kLanesPerRow;          // outputs per thread
  // +4 floats per row: the 8 threads of a row read 8 different K rows as float4, and a stride of
  // D + 4 words puts those reads in distinct bank quads.
  static constexpr int kStride = D + 4;
  // +8: the four rows a warp touches then start in different banks.
  static constexpr int kPStride = kKeys + 8;
  static constexpr size_t kSharedBytes =
      sizeof(float) * (static_cast<size_t>(kRows + 2 * kKeys) * kStride + kRows * kPStride);
};

template <typename T, int D>
__global__ void __launch_bounds__(Flash1Traits<D>::kThreads)
    flash1_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  T* __restrict__ out, float* __restrict__ o_part, float2* __restrict__ ml_part,
                  Geometry g) {
  using Tr = Flash1Traits<D>;
  extern __shared__ float4 shared4[];
  float* qs = reinterpret_cast<float*>(shared4);
  float* ks = qs + Tr::kRows * Tr::kStride;
  float* vs = ks + Tr::kKeys * Tr::kStride;
  float* ps = vs + Tr::kKeys * Tr::kStride;

  const RowTile tile = row_tile<Tr::kRows>(g);
  if (tile.empty()) return;
  const int kvh = tile.kvh, total_rows = tile.total_rows, r0 = tile.r0, pos0 = tile.pos0;
  const int kv_end = tile.kv_end;
  // Decode (o_part set, T = 1) takes only its split's keys [kbeg, kend).
  int kbeg = 0, kend = kv_end;
  if (o_part != nullptr && !split_range(g, kv_end, Tr::kKeys, kbeg, kend)) return;

  stage_q_tile<T, D, Tr::kRows, Tr::kThreads>(query_rows<D>(q, g, tile.seq.q0), g, kvh, r0,
                                              total_rows, qs, Tr::kStride);

  const int r = threadIdx.x / Tr::kLanesPerRow;  // this thread's row
  const int c0 = threadIdx.x % Tr::kLanesPerRow;
  const int my_row = min(r0 + r, total_rows - 1);
  const int my_pos = pos0 + my_row / g.group;  // the last key this row may see
  SoftmaxState st;
  float o[Tr::kDimsPerThread] = {};

  for (int key0 = kbeg; key0 < kend; key0 += Tr::kKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_kv_tile<T, D, Tr::kKeys, Tr::kStride, Tr::kThreads>(k, tile.seq.keys, g.kv_heads, kvh,
                                                             key0, kend, ks);
    load_kv_tile<T, D, Tr::kKeys, Tr::kStride, Tr::kThreads>(v, tile.seq.keys, g.kv_heads, kvh,
                                                             key0, kend, vs);
    __syncthreads();

    // S = Q K^T for this thread's columns c0 + 8 i.
    float s[Tr::kColsPerThread] = {};
    for (int d = 0; d < D; d += 4) {
      const float4 qv = *reinterpret_cast<const float4*>(qs + r * Tr::kStride + d);
#pragma unroll
      for (int i = 0; i < Tr::kColsPerThread; ++i) {
        const int c = c0 + i * Tr::kLanesPerRow;
        const float4 kv = *reinterpret_cast<const float4*>(ks + c * Tr::kStride + d);
        s[i] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < Tr::kColsPerThread; ++i) {
      const int key = key0 + c0 + i * Tr::kLanesPerRow;
      if (key > my_pos || key >= kend) s[i] = -INFINITY;
      tile_max = fmaxf(tile_max, s[i]);
    }
    // Key kbeg is in every row's past, so m is finite from the first tile on.
    const float alpha = st.raise_max(group_max<Tr::kLanesPerRow>(tile_max));
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < Tr::kColsPerThread; ++i) {
      const float p = fast_exp2(s[i] - st.m);
      tile_sum += p;
      ps[r * Tr::kPStride + c0 + i * Tr::kLanesPerRow] = p;
    }
    const float keep = st.l * alpha;
    st.accumulate(alpha, group_sum<Tr::kLanesPerRow>(tile_sum));
    __syncthreads();  // P complete

    // O = (l * alpha * O + P V) / l_new: FA1 keeps the output normalised after every tile.
    float acc[Tr::kDimsPerThread] = {};
    for (int j = 0; j < Tr::kKeys; ++j) {
      const float p = ps[r * Tr::kPStride + j];
#pragma unroll
      for (int i = 0; i < Tr::kDimsPerThread / 4; ++i) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + j * Tr::kStride + c0 * 4 + i * 32);
        acc[4 * i] += p * vv.x;
        acc[4 * i + 1] += p * vv.y;
        acc[4 * i + 2] += p * vv.z;
        acc[4 * i + 3] += p * vv.w;
      }
    }
    const float inv = 1.0f / st.l;
#pragma unroll
    for (int i = 0; i < Tr::kDimsPerThread; ++i) o[i] = (keep * o[i] + acc[i]) * inv;
  }

  if (r0 + r < total_rows && o_part != nullptr) {
    const int h = kvh * g.group + r0 + r;  // T = 1: the row is the head within the group
    const size_t slot = split_slot(g, h);
#pragma unroll
    for (int i = 0; i < Tr::kDimsPerThread / 4; ++i) {
      const float4 x = make_float4(o[4 * i] * st.l, o[4 * i + 1] * st.l, o[4 * i + 2] * st.l,
                                   o[4 * i + 3] * st.l);
      *reinterpret_cast<float4*>(o_part + slot * D + c0 * 4 + i * 32) = x;
    }
    if (c0 == 0) ml_part[slot] = make_float2(st.m, st.l);
  } else if (r0 + r < total_rows) {
    const int row = r0 + r, t = row / g.group, h = kvh * g.group + row % g.group;
    T* dst = query_rows<D>(out, g, tile.seq.q0) + (static_cast<size_t>(t) * g.heads + h) * D;
#pragma unroll
    for (int i = 0; i < Tr::kDimsPerThread / 4; ++i) {
      store_vec<T, 4>(dst + c0 * 4 + i * 32, o + 4 * i);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// fp16 and bf16 on tensor cores. Each warp owns 16 rows as one mma row tile; a 128-key tile is
// loaded by the whole block, S = Q K^T stays in registers (128 scores a row, reduced over the row's
// 4 lanes for the tile's maximum and sum) and P V lands in a fresh accumulator, which the FA1
// update then folds into the normalised output in shared memory.

template <int D>
struct Flash1TcTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;
  static constexpr int kKeys = 128;  // FA1's large KV tile
  static constexpr int kChunks = D / 8;
  // +8 floats a row: the float2 accesses of a half-warp (4 rows x 4 lanes) hit distinct banks.
  static constexpr int kOStride = D + 8;
  // K tile, V tile (Q is staged through the V tile before the first KV tile), O, then m and l.
  static constexpr size_t kSharedBytes =
      kTcElemBytes * 2 * kKeys * D + sizeof(float) * kRows * (kOStride + 2);
  static_assert(kRows <= kKeys, "Q is staged in the V tile");
};

template <typename T, int D>
__global__ void __launch_bounds__(Flash1TcTraits<D>::kThreads)
    flash1_tc_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ out, float* __restrict__ o_part,
                     float2* __restrict__ ml_part, Geometry g) {
  using Tr = Flash1TcTraits<D>;
  extern __shared__ uint4 shared16[];
  T* ks = reinterpret_cast<T*>(shared16);
  T* vs = ks + Tr::kKeys * D;
  float* os = reinterpret_cast<float*>(vs + Tr::kKeys * D);
  float* ms = os + Tr::kRows * Tr::kOStride;
  float* ls = ms + Tr::kRows;

  const RowTile tile = row_tile<Tr::kRows>(g);
  if (tile.empty()) return;
  const int kvh = tile.kvh, total_rows = tile.total_rows, r0 = tile.r0, pos0 = tile.pos0;
  const int kv_end = tile.kv_end;
  int kbeg = 0, kend = kv_end;  // decode (o_part set, T = 1): this split's keys only
  if (o_part != nullptr && !split_range(g, kv_end, Tr::kKeys, kbeg, kend)) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  cp_async_q_tile<D, Tr::kRows, Tr::kThreads>(query_rows<D>(q, g, tile.seq.q0), g, kvh, r0,
                                              total_rows, vs);
  cp_async_commit();
  for (int i = threadIdx.x; i < Tr::kRows * Tr::kOStride; i += Tr::kThreads) os[i] = 0.0f;
  for (int i = threadIdx.x; i < Tr::kRows; i += Tr::kThreads) {
    ms[i] = -INFINITY;
    ls[i] = 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_q_fragments<D>(qf, vs);

  const int quad_row = lane / 4, quad_col = (lane % 4) * 2;
  const int warp_row0 = r0 + warp * 16;
  const bool warp_active = warp_row0 < total_rows;
  const int pos_a = pos0 + min(warp_row0 + quad_row, total_rows - 1) / g.group;
  const int pos_b = pos0 + min(warp_row0 + quad_row + 8, total_rows - 1) / g.group;
  const int warp_last_pos = pos0 + min(warp_row0 + 15, total_rows - 1) / g.group;
  const int ra = warp * 16 + quad_row, rb = ra + 8;  // this lane's rows in the block's O, m, l

  for (int key0 = kbeg; key0 < kend; key0 += Tr::kKeys) {
    __syncthreads();  // the previous tile (and, the first time, Q in the V tile) is no longer read
    cp_async_kv_tiles<D, Tr::kKeys, Tr::kThreads>(k, v, tile.seq.keys, g.kv_heads, kvh, key0,
                                                  kend, ks, vs);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (!warp_active || key0 > warp_last_pos) continue;  // warp-uniform

    float s[Tr::kKeys / 8][4] = {};
    mma_qk<D, Tr::kKeys>(s, qf, ks, 0);
    float mt_a = -INFINITY, mt_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < Tr::kKeys / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + j * 8 + quad_col + (e & 1);
        const bool masked = key > (e < 2 ? pos_a : pos_b) || key >= kend;
        s[j][e] = masked ? -INFINITY : s[j][e] * g.scale_log2;
      }
      mt_a = fmaxf(mt_a, fmaxf(s[j][0], s[j][1]));
      mt_b = fmaxf(mt_b, fmaxf(s[j][2], s[j][3]));
    }
    mt_a = group_max<4>(mt_a);
    mt_b = group_max<4>(mt_b);
    // A row whose keys in this tile are all in its future gets P = 0 (and weight 0 below).
    const float base_a = mt_a == -INFINITY ? 0.0f : mt_a;
    const float base_b = mt_b == -INFINITY ? 0.0f : mt_b;
    float lt_a = 0.0f, lt_b = 0.0f;
#pragma unroll
    for (int j = 0; j < Tr::kKeys / 8; ++j) {
      s[j][0] = exp2_ftz(s[j][0] - base_a);
      s[j][1] = exp2_ftz(s[j][1] - base_a);
      s[j][2] = exp2_ftz(s[j][2] - base_b);
      s[j][3] = exp2_ftz(s[j][3] - base_b);
      lt_a += s[j][0] + s[j][1];
      lt_b += s[j][2] + s[j][3];
    }
    lt_a = group_sum<4>(lt_a);
    lt_b = group_sum<4>(lt_b);
    float acc[D / 8][4] = {};
    mma_pv<D, Tr::kKeys>(acc, s, vs, 0);

    // FA1's update, through the statistics and output kept in shared memory. The tile holding
    // key kbeg is every row's first and has a finite maximum, so m_new is finite.
    SoftmaxState st_a{ms[ra], ls[ra]}, st_b{ms[rb], ls[rb]};
    const float lo_a = st_a.l, lo_b = st_b.l;
    const float2 w_a = st_a.merge(mt_a, lt_a), w_b = st_b.merge(mt_b, lt_b);
    const float keep_a = lo_a * w_a.x, keep_b = lo_b * w_b.x;  // O is normalised: O * l weighs
    const float add_a = w_a.y, add_b = w_b.y;
    const float inv_a = 1.0f / st_a.l, inv_b = 1.0f / st_b.l;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2* pa = reinterpret_cast<float2*>(os + ra * Tr::kOStride + n * 8 + quad_col);
      float2* pb = reinterpret_cast<float2*>(os + rb * Tr::kOStride + n * 8 + quad_col);
      const float2 xa = *pa, xb = *pb;
      *pa = make_float2((keep_a * xa.x + add_a * acc[n][0]) * inv_a,
                        (keep_a * xa.y + add_a * acc[n][1]) * inv_a);
      *pb = make_float2((keep_b * xb.x + add_b * acc[n][2]) * inv_b,
                        (keep_b * xb.y + add_b * acc[n][3]) * inv_b);
    }
    __syncwarp();  // every lane of a quad has read the row's m and l
    if (lane % 4 == 0) {
      ms[ra] = st_a.m;
      ls[ra] = st_a.l;
      ms[rb] = st_b.m;
      ls[rb] = st_b.l;
    }
  }
  __syncwarp();  // this warp's rows of O, m and l are final

  for (int i = lane; i < 16 * Tr::kChunks; i += 32) {
    const int r = i / Tr::kChunks, ch = i % Tr::kChunks, row = warp_row0 + r;
    if (row >= total_rows) break;
    const float* src = os + (warp * 16 + r) * Tr::kOStride + ch * 8;
    if (o_part != nullptr) {  // T = 1: the row is the head within the group
      const float l = ls[warp * 16 + r];
      const size_t slot = split_slot(g, kvh * g.group + row);
#pragma unroll
      for (int e = 0; e < 8; ++e) o_part[slot * D + ch * 8 + e] = src[e] * l;
      if (ch == 0) ml_part[slot] = make_float2(ms[warp * 16 + r], l);
    } else {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      float x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = src[e];
      store_vec<T, 8>(query_rows<D>(out, g, tile.seq.q0) + (static_cast<size_t>(t) * g.heads + h) * D +
                          ch * 8,
                      x);
    }
  }
}

// Both kernels' shared memory leaves room for two blocks an SM.
constexpr int kBlocksPerSm = 2;

// Prefill: one launch of kKernel over (row blocks, kv heads). Decode: the same kernel over KV
// splits (grid z) into partials, then combine_splits.
template <auto kKernel, typename Tr, typename T, int D>
Status launch_flash1(const AttentionArgs& a, const Geometry& geometry, const AttentionRequest& r,
                     AttentionBuffers& buffers, const char* what) {
  KUIPER_RETURN_IF_ERROR(allow_shared_memory<kKernel>(Tr::kSharedBytes));
  Geometry g = geometry;
  auto launch = [&](dim3 grid, float* o_part, float2* ml_part) {
    kKernel<<<grid, Tr::kThreads, Tr::kSharedBytes, cuda::stream()>>>(
        a.q.data<T>(), a.k_cache.data<T>(), a.v_cache.data<T>(), a.out.data<T>(), o_part, ml_part,
        g);
    return cuda::check(cudaGetLastError(), what);
  };
  const int row_blocks = (g.max_queries * g.group + Tr::kRows - 1) / Tr::kRows;
  if (r.phase == AttentionPhase::kPrefill) {
    return launch(dim3(row_blocks, g.kv_heads, g.batch), nullptr, nullptr);
  }
  KUIPER_ASSIGN_OR_RETURN(g.splits, decode_split_count(r, g, row_blocks * g.kv_heads * g.batch,
                                                       Tr::kKeys, kBlocksPerSm));
  const int splits = g.splits;
  const size_t slots = static_cast<size_t>(g.batch) * g.heads * splits;
  KUIPER_ASSIGN_OR_RETURN(float* o_part, buffers.partials.floats(slots * D));
  KUIPER_ASSIGN_OR_RETURN(float* ml, buffers.stats.floats(slots * 2));
  float2* ml_part = reinterpret_cast<float2*>(ml);
  KUIPER_RETURN_IF_ERROR(
      launch(dim3(row_blocks, g.kv_heads, g.batch * splits), o_part, ml_part));
  combine_splits<T, D><<<dim3(g.heads, g.batch), kCombineThreads, 0, cuda::stream()>>>(
      o_part, ml_part, a.out.data<T>(), g, splits, Tr::kKeys);
  KUIPER_CUDA_CHECK_LAUNCH("combine_splits");
  return Status::Ok();
}

}  // namespace

Status run_flash1(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                  AttentionBuffers& buffers) {
  auto tensor_cores = [&](auto tt, auto dt) {
    using T = typename decltype(tt)::type;
    constexpr int D = decltype(dt)::value;
    return launch_flash1<flash1_tc_kernel<T, D>, Flash1TcTraits<D>, T, D>(a, g, r, buffers,
                                                                         "flash1_tc_kernel");
  };
  auto simt = [&](auto dt) {
    constexpr int D = decltype(dt)::value;
    return launch_flash1<flash1_kernel<float, D>, Flash1Traits<D>, float, D>(a, g, r, buffers,
                                                                            "flash1_kernel");
  };
  return by_element_type(r, tensor_cores, simt);
}

}  // namespace kuiper::op::cuda_attention
