// FlashAttention-2 prefill (flash2_prefill, fp32 SIMT; flash2_prefill_tc, fp16/bf16 tensor cores):
// a block owns a tile of rows ((query, head) pairs of one kv head, packed as in flash1) and each
// warp owns its rows outright (8 in the SIMT kernel, 16 in the tensor-core one), so the softmax
// needs warp shuffles only and a KV tile costs at most two block barriers. Tiles are small (32 / 64
// keys; the tensor-core kernel double-buffers them with cp.async), the row sum stays per lane until
// the very end and the output is normalised once (delayed normalisation), and exponentials
// negligible against the row maximum are flushed to zero. The grid is (row blocks, kv heads,
// sequences): each sequence of a batch gets max_queries' worth of row blocks, and reads its keys
// through its block table (Sequence::keys) in the paged form.
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention/flash2_traits.cuh"
#include "kuiper/op/kernels/cuda/attention/mma.cuh"
#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"

namespace kuiper::op::cuda_attention {
namespace {

template <typename T, int D>
__global__ void __launch_bounds__(PrefillTraits<D>::kThreads)
    flash2_prefill(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   T* __restrict__ out, Geometry g) {
  using Tr = PrefillTraits<D>;
  constexpr int R = Tr::kRowsPerWarp;
  extern __shared__ float4 shared4[];
  float* qs = reinterpret_cast<float*>(shared4);
  float* ks = qs + Tr::kRows * D;
  float* vs = ks + Tr::kKeys * Tr::kKStride;
  float* ps_all = vs + Tr::kKeys * D;

  const RowTile tile = row_tile<Tr::kRows>(g);
  if (tile.empty()) return;
  const int kvh = tile.kvh, total_rows = tile.total_rows, r0 = tile.r0, pos0 = tile.pos0;
  const int kv_end = tile.kv_end;
  out = query_rows<D>(out, g, tile.seq.q0);

  stage_q_tile<T, D, Tr::kRows, Tr::kThreads>(query_rows<D>(q, g, tile.seq.q0), g, kvh, r0,
                                              total_rows, qs, D);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* qw = qs + warp * R * D;
  float* ps = ps_all + warp * Tr::kKeys * R;  // [key][row]: the P·V step reads a row of 8 at once
  int pos[R];
#pragma unroll
  for (int r = 0; r < R; ++r) pos[r] = pos0 + min(r0 + warp * R + r, total_rows - 1) / g.group;
  const int warp_last_pos = pos[R - 1];

  SoftmaxState st[R];  // l: per-lane partial sums, reduced once, after the last tile
  float o[R][Tr::kPerLane] = {};

  for (int key0 = 0; key0 < kv_end; key0 += Tr::kKeys) {
    __syncthreads();  // every warp is done with the previous tile
    load_kv_tile<T, D, Tr::kKeys, Tr::kKStride, Tr::kThreads>(k, tile.seq.keys, g.kv_heads, kvh,
                                                              key0, kv_end, ks);
    load_kv_tile<T, D, Tr::kKeys, D, Tr::kThreads>(v, tile.seq.keys, g.kv_heads, kvh, key0,
                                                   kv_end, vs);
    __syncthreads();
    if (key0 > warp_last_pos) continue;  // the tile is in the future of all this warp's rows

    float s[R] = {};
    for (int d = 0; d < D; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(ks + lane * Tr::kKStride + d);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(qw + r * D + d);
        s[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    const int key = key0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Key 0 is in every row's past, so after the first tile m[r] is finite and a fully
      // masked later tile leaves it unchanged (alpha = 1).
      const float sr = key > pos[r] ? -INFINITY : s[r];
      const float alpha = st[r].raise_max(group_max<32>(sr));
      const float p = exp2_ftz(sr - st[r].m);
      st[r].accumulate(alpha, p);
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) o[r][i] *= alpha;
      ps[lane * R + r] = p;
    }
    __syncwarp();
    for (int j = 0; j < Tr::kKeys; ++j) {
      const float4 p_lo = *reinterpret_cast<const float4*>(ps + j * R);
      const float4 p_hi = *reinterpret_cast<const float4*>(ps + j * R + 4);
      const float p[R] = {p_lo.x, p_lo.y, p_lo.z, p_lo.w, p_hi.x, p_hi.y, p_hi.z, p_hi.w};
      float vv[Tr::kPerLane];
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) vv[i] = vs[j * D + lane * Tr::kPerLane + i];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < Tr::kPerLane; ++i) o[r][i] += p[r] * vv[i];
      }
    }
    __syncwarp();  // P is rewritten by the next tile
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = r0 + warp * R + r;
    const float inv = 1.0f / group_sum<32>(st[r].l);
    if (row < total_rows) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      float res[Tr::kPerLane];
#pragma unroll
      for (int i = 0; i < Tr::kPerLane; ++i) res[i] = o[r][i] * inv;
      store_vec<T, Tr::kPerLane>(out + (static_cast<size_t>(t) * g.heads + h) * D +
                                     lane * Tr::kPerLane,
                                 res);
    }
  }
}

// Tensor cores: the same FA2 schedule with the two matrix products on mma.sync m16n8k16 (fp16 or
// bf16 in, fp32 accumulate). A block owns 128 rows, each warp 16 of them (one mma row tile); KV
// tiles of 64 keys are double-buffered in shared memory by cp.async so the next tile loads while
// this one is computed. S stays in registers: its accumulator layout is exactly the A-operand
// layout of the P·V product, so P never touches shared memory.

template <typename T, int D>
__global__ void __launch_bounds__(PrefillTcTraits<D>::kThreads)
    flash2_prefill_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      T* __restrict__ out, Geometry g) {
  using Tr = PrefillTcTraits<D>;
  extern __shared__ uint4 shared16[];
  T* qs = reinterpret_cast<T*>(shared16);
  T* ks = qs + Tr::kRows * D;
  T* vs = ks + 2 * Tr::kKeys * D;

  const RowTile tile = row_tile<Tr::kRows>(g);
  if (tile.empty()) return;
  const int kvh = tile.kvh, total_rows = tile.total_rows, r0 = tile.r0, pos0 = tile.pos0;
  const int kv_end = tile.kv_end;
  const int n_tiles = (kv_end + Tr::kKeys - 1) / Tr::kKeys;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const KeyRows keys = tile.seq.keys;
  out = query_rows<D>(out, g, tile.seq.q0);

  cp_async_q_tile<D, Tr::kRows, Tr::kThreads>(query_rows<D>(q, g, tile.seq.q0), g, kvh, r0,
                                              total_rows, qs);
  auto load_kv = [&](int tile, int stage) {
    cp_async_kv_tiles<D, Tr::kKeys, Tr::kThreads>(k, v, keys, g.kv_heads, kvh, tile * Tr::kKeys,
                                                  kv_end, ks + stage * Tr::kKeys * D,
                                                  vs + stage * Tr::kKeys * D);
  };
  load_kv(0, 0);
  cp_async_commit();

  // This thread's two rows in the mma accumulator layout: lane / 4 and lane / 4 + 8.
  const int quad_row = lane / 4, quad_col = (lane % 4) * 2;
  const int warp_row0 = r0 + warp * 16;
  const int pos_a = pos0 + min(warp_row0 + quad_row, total_rows - 1) / g.group;
  const int pos_b = pos0 + min(warp_row0 + quad_row + 8, total_rows - 1) / g.group;
  const int warp_first_pos = pos0 + min(warp_row0, total_rows - 1) / g.group;
  const int warp_last_pos = pos0 + min(warp_row0 + 15, total_rows - 1) / g.group;

  uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  MmaRowsSoftmax softmax;

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();  // everything but the prefetch just issued has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (tile == 0) load_q_fragments<D>(qf, qs);
    const int key0 = tile * Tr::kKeys;
    if (key0 <= warp_last_pos) {
      const T* kt = ks + (tile & 1) * Tr::kKeys * D;
      const T* vt = vs + (tile & 1) * Tr::kKeys * D;

      float s[Tr::kKeys / 8][4] = {};
      mma_qk<D, Tr::kKeys>(s, qf, kt, 0);

      const bool diagonal = key0 + Tr::kKeys - 1 > warp_first_pos;
#pragma unroll
      for (int j = 0; j < Tr::kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + j * 8 + quad_col + (e & 1);
          float x = s[j][e] * g.scale_log2;
          if (diagonal && key > (e < 2 ? pos_a : pos_b)) x = -INFINITY;
          s[j][e] = x;
        }
      }
      // Key 0 is in every row's past, so the maxima are finite from the first tile on.
      softmax.update(s, o);
      mma_pv<D, Tr::kKeys>(o, s, vt, 0);
    }
    __syncthreads();  // the stage just read is the next prefetch's target
  }

  softmax.reduce_rows();
  const float inv_a = 1.0f / softmax.row[0].l, inv_b = 1.0f / softmax.row[1].l;
  const int row_a = warp_row0 + quad_row, row_b = row_a + 8;
#pragma unroll
  for (int half_row = 0; half_row < 2; ++half_row) {
    const int row = half_row == 0 ? row_a : row_b;
    if (row >= total_rows) continue;
    const float inv = half_row == 0 ? inv_a : inv_b;
    const int t = row / g.group, h = kvh * g.group + row % g.group;
    T* dst = out + (static_cast<size_t>(t) * g.heads + h) * D + quad_col;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) =
          TensorCore<T>::pack(o[n][2 * half_row] * inv, o[n][2 * half_row + 1] * inv);
    }
  }
}

// One launch over (row blocks, kv heads, sequences).
template <auto kKernel, typename Tr, typename T>
Status launch_prefill(const AttentionArgs& a, const Geometry& g, const char* what) {
  KUIPER_RETURN_IF_ERROR(allow_shared_memory<kKernel>(Tr::kSharedBytes));
  const int row_blocks = (g.max_queries * g.group + Tr::kRows - 1) / Tr::kRows;
  kKernel<<<dim3(row_blocks, g.kv_heads, g.batch), Tr::kThreads, Tr::kSharedBytes,
            cuda::stream()>>>(
      a.q.data<T>(), a.k_cache.data<T>(), a.v_cache.data<T>(), a.out.data<T>(), g);
  KUIPER_CUDA_CHECK_LAUNCH(what);
  return Status::Ok();
}

}  // namespace

Status launch_flash2_prefill(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r) {
  auto tensor_cores = [&](auto tt, auto dt) {
    using T = typename decltype(tt)::type;
    constexpr int D = decltype(dt)::value;
    return launch_prefill<flash2_prefill_tc<T, D>, PrefillTcTraits<D>, T>(a, g,
                                                                         "flash2_prefill_tc");
  };
  auto simt = [&](auto dt) {
    constexpr int D = decltype(dt)::value;
    return launch_prefill<flash2_prefill<float, D>, PrefillTraits<D>, float>(a, g,
                                                                            "flash2_prefill");
  };
  return by_element_type(r, tensor_cores, simt);
}

}  // namespace kuiper::op::cuda_attention
