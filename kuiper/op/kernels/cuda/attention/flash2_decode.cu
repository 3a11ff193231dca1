// FlashAttention-2 decode (flash-decoding): one query cannot fill the GPU from a single KV pass, so
// the context is split over the KV length. fp16 and bf16 (flash2_decode_tc): a fixed grid (the
// largest multiple of the (kv head, group of up to 16 query heads) count that fits the SMs) over
// which the flattened (unit, key) work is spread evenly on the device from the position
// (decode_partition.h); a block whose range crosses into the next unit writes a partial for each.
// K/V stream through a cp.async ring, both products run on tensor cores, and the last block
// touching a unit to finish combines its partials (no second launch). The kernel is launched with
// PDL (unless the request turns it off): it starts loading its first tiles before it waits for the
// kernel before, and keeps them only if the position it reads after the wait is the one it guessed.
// fp32 (flash2_decode_split, SIMT): fixed chunks of kChunk keys, one block per (chunk, kv head,
// group of <= 8 query heads), then combine_splits. Either way each split writes an unnormalised
// partial output with its maximum and sum, partial buffers are sized for the whole cache and
// device-position grids for the capacity (blocks past the position's work exit at once), so nothing
// about a decode step depends on the position except what the kernels read from the device.
#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention/decode_partition.h"
#include "kuiper/op/kernels/cuda/attention/flash2_traits.cuh"
#include "kuiper/op/kernels/cuda/attention/mma.cuh"
#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"
#include "kuiper/op/kernels/cuda/attention/split_kv.cuh"
#include "kuiper/op/kernels/cuda/tuning_log.h"

namespace kuiper::op::cuda_attention {
namespace {

// ---------------------------------------------------------------------------------------------
// SIMT (fp32): split-KV partials, then the combine.

template <typename T, int N>
__device__ __forceinline__ void unpack_slice(const uint4 (&raw)[N], float* out) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) Word<T>::unpack(w[i], out + (c * 4 + i) * Word<T>::kElems);
  }
}

// Loads a lane's slices of kBatch consecutive steps' rows, raw; rows past the context are
// zeros (their score is masked, and 0 * NaN from an unwritten row would poison P·V).
template <typename T, int D>
__device__ __forceinline__ void load_slices(const T* cache, const Geometry& g, int kvh, int first_key,
                                            int len, int part,
                                            uint4 (&raw)[DecodeTraits<T, D>::kBatch]
                                                        [DecodeTraits<T, D>::kWords]) {
  using Tr = DecodeTraits<T, D>;
#pragma unroll
  for (int i = 0; i < Tr::kBatch; ++i) {
    const int key = first_key + i * Tr::kKeysPerStep;
    const uint4* src = reinterpret_cast<const uint4*>(
        cache + (static_cast<size_t>(key) * g.kv_heads + kvh) * D + part * Tr::kElems);
#pragma unroll
    for (int c = 0; c < Tr::kWords; ++c) raw[i][c] = key < len ? src[c] : make_uint4(0, 0, 0, 0);
  }
}

// Calls f(key, slice) for the lane's slice (kElems floats) of each of its keys, kSteps of them,
// kBatch loads in flight at a time. The first batch must already be in `raw` (loaded ahead so
// that it overlaps other work); rows past the context are zeros.
template <typename T, int D, typename F>
__device__ __forceinline__ void for_each_slice(const T* cache, const Geometry& g, int kvh,
                                               int lane_key0, int len, int part,
                                               uint4 (&raw)[DecodeTraits<T, D>::kBatch]
                                                           [DecodeTraits<T, D>::kWords],
                                               F&& f) {
  using Tr = DecodeTraits<T, D>;
#pragma unroll
  for (int b = 0; b < Tr::kSteps; b += Tr::kBatch) {
    if (b > 0) load_slices<T, D>(cache, g, kvh, lane_key0 + b * Tr::kKeysPerStep, len, part, raw);
#pragma unroll
    for (int i = 0; i < Tr::kBatch; ++i) {
      float x[Tr::kElems];
      unpack_slice<T>(raw[i], x);
      f(lane_key0 + (b + i) * Tr::kKeysPerStep, x);
    }
  }
}

// G: query heads per block, the GQA group rounded up to a power of two (at most 8), so a lane
// holds q and output slices for exactly the heads it serves.
template <typename T, int D, int G>
__global__ void __launch_bounds__(kSplitThreads)
    flash2_decode_split(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        float* __restrict__ o_part, float2* __restrict__ ml_part, Geometry g,
                        int max_chunks) {
  using Tr = DecodeTraits<T, D>;
  __shared__ float scores[G][kChunk];
  __shared__ float partial[kSplitThreads / 32][G][D];

  const int chunk = blockIdx.x, kvh = blockIdx.y;
  const int g0 = blockIdx.z * G, ng = min(G, g.group - g0);
  const int len = first_position(g) + 1;
  const int key0 = chunk * kChunk;
  if (key0 >= len) return;  // device-position grids cover the whole cache

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / Tr::kLanesPerKey;   // which key of a step this lane works on
  const int part = lane % Tr::kLanesPerKey;  // which slice of the row
  const int head0 = kvh * g.group + g0;
  const int lane_key0 = key0 + warp * 32 + sub;  // this lane's key in step 0

  uint4 raw[Tr::kBatch][Tr::kWords];
  load_slices<T, D>(k, g, kvh, lane_key0, len, part, raw);
  float qv[G][Tr::kElems];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    if (gi < ng) {
      load_vec<T, Tr::kElems>(q + static_cast<size_t>(head0 + gi) * D + part * Tr::kElems, qv[gi]);
#pragma unroll
      for (int e = 0; e < Tr::kElems; ++e) qv[gi][e] *= g.scale_log2;
    }
  }

  // Scores.
  for_each_slice<T, D>(k, g, kvh, lane_key0, len, part, raw, [&](int key, const float* kv) {
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
      if (gi < ng) {  // block-uniform: every lane joins the shuffles
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < Tr::kElems; ++e) s += qv[gi][e] * kv[e];
        s = group_sum<Tr::kLanesPerKey>(s);
        if (part == 0) scores[gi][key - key0] = key < len ? s : -INFINITY;
      }
    }
  });
  load_slices<T, D>(v, g, kvh, lane_key0, len, part, raw);  // V in flight during the softmax
  __syncthreads();

  // Per head: the chunk's maximum, exponentials (flushed when negligible) and their sum.
  for (int gi = warp; gi < ng; gi += kSplitThreads / 32) {
    float x[kChunk / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kChunk / 32; ++i) {
      x[i] = scores[gi][lane + 32 * i];
      mx = fmaxf(mx, x[i]);
    }
    mx = group_max<32>(mx);  // finite: key0 < len, so the chunk has a valid key
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk / 32; ++i) {
      x[i] = exp2_ftz(x[i] - mx);
      scores[gi][lane + 32 * i] = x[i];
      sum += x[i];
    }
    sum = group_sum<32>(sum);
    if (lane == 0) ml_part[static_cast<size_t>(head0 + gi) * max_chunks + chunk] = make_float2(mx, sum);
  }
  __syncthreads();

  // P·V with the same lane layout; each lane accumulates its row slice for every head.
  float o[G][Tr::kElems] = {};
  for_each_slice<T, D>(v, g, kvh, lane_key0, len, part, raw, [&](int key, const float* vv) {
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
      if (gi < ng) {
        const float p = scores[gi][key - key0];
#pragma unroll
        for (int e = 0; e < Tr::kElems; ++e) o[gi][e] += p * vv[e];
      }
    }
  });
  // Lanes holding the same slice of different keys: fold them, then fold the warps.
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    if (gi < ng) {
#pragma unroll
      for (int e = 0; e < Tr::kElems; ++e) {
#pragma unroll
        for (int off = Tr::kLanesPerKey; off < 32; off *= 2) {
          o[gi][e] += __shfl_xor_sync(0xffffffffu, o[gi][e], off);
        }
        if (sub == 0) partial[warp][gi][part * Tr::kElems + e] = o[gi][e];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ng * D; idx += kSplitThreads) {
    const int gi = idx / D, d = idx % D;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kSplitThreads / 32; ++w) acc += partial[w][gi][d];
    o_part[(static_cast<size_t>(head0 + gi) * max_chunks + chunk) * D + d] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// Decode, fp16 or bf16 on tensor cores (flash-decoding). One block per (split, kv head, group of up
// to 16 query heads): every query head that shares the kv head is a row of one mma tile, so K and V
// are read once per GQA group. The split's keys stream through a kStages-deep cp.async ring of
// 64-key tiles (one barrier per tile), the first tiles requested before the PDL wait; each warp
// takes 16 keys of a tile and keeps its own online softmax (S = Q K^T and P V on mma.sync m16n8k16,
// S kept in registers as P), and at the end the four warps are merged through shared memory into
// the split's unnormalised partial. The last block of a unit to arrive combines the partials in one
// pass.

// Two adjacent 16-bit elements as one register of an mma fragment.
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// atomicAdd with acquire-release semantics at GPU scope; returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Keys in the cache at this decode step (the position + 1), read past L1: a decode kernel reads
// it twice, before and after its dependency wait, and the second read must see a new value.
__device__ __forceinline__ int device_context(const Geometry& g) {
  if (g.device_position == nullptr) return g.start + 1;
  return min(max(__ldcg(g.device_position), 0), g.max_ctx - 1) + 1;
}

template <typename T, int D>
__global__ void __launch_bounds__(DecodeTcTraits<D>::kThreads)
    flash2_decode_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     float* __restrict__ o_part, float2* __restrict__ ml_part,
                     int* __restrict__ arrivals, T* __restrict__ out, Geometry g,
                     int head_groups) {
  using Tr = DecodeTcTraits<D>;
  extern __shared__ uint4 shared16[];
  T* ring = reinterpret_cast<T*>(shared16);
  float* merge = reinterpret_cast<float*>(ring + Tr::kStages * Tr::kStageElems);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const int b = blockIdx.x;
  const int units = g.kv_heads * head_groups;

  // The partition for context `len`: the blocks that hold keys and this block's flat range.
  int len = 0, blocks = 0;
  int64_t work = 0, end = 0, at = 0;  // at: flat key where the current segment starts
  auto partition = [&](int context) {
    len = context;
    work = static_cast<int64_t>(units) * len;
    blocks = decode_blocks(work, gridDim.x, units);
    at = decode_block_begin(work, blocks, b);
    end = decode_block_begin(work, blocks, b + 1);
  };

  // The block's range as segments, one per unit (kv head, head group) it touches.
  struct Segment {
    int unit, kvh, h0, ng, kbeg, kend, n_tiles;
  };
  auto segment_at = [&](int64_t flat) {
    Segment s;
    s.unit = static_cast<int>(flat / len);
    s.kvh = s.unit / head_groups;
    s.h0 = (s.unit % head_groups) * Tr::kHeads;
    s.ng = min(Tr::kHeads, g.group - s.h0);
    const int64_t unit0 = static_cast<int64_t>(s.unit) * len;
    s.kbeg = static_cast<int>(flat - unit0);
    s.kend = static_cast<int>(min(end - unit0, static_cast<int64_t>(len)));
    s.n_tiles = (s.kend - s.kbeg + Tr::kKeys - 1) / Tr::kKeys;
    return s;
  };
  auto load = [&](const Segment& s, int tile) {
    T* kt = ring + (tile % Tr::kStages) * Tr::kStageElems;
    cp_async_kv_tiles<D, Tr::kKeys, Tr::kThreads>(k, v, g.kv_heads, s.kvh,
                                                  s.kbeg + tile * Tr::kKeys, s.kend, kt,
                                                  kt + Tr::kKeys * D);
  };
  auto prologue = [&](const Segment& s) {
#pragma unroll
    for (int t = 0; t < Tr::kStages - 1; ++t) {
      if (t < s.n_tiles) load(s, t);
      cp_async_commit();  // empty groups keep the wait counts uniform
    }
  };

  // Launched with PDL. Every kernel of a step waits before it lets its dependents start, so when
  // this block runs, every kernel but the one just before has finished; that one (qk-norm, RoPE
  // and the cache write) may still be writing q, the newest K/V row (key len - 1) and, for all
  // this kernel can assume, the position. So before the wait the block reads the position as a
  // guess and starts loading the first tiles of its range under it, which hides the first
  // tiles' latency behind the kernel before; after the wait it reads the position again and
  // keeps those tiles only when the position is unchanged and they do not hold the newest row.
  // The next kernel (the o-projection) may start right away: it only prefetches weights before
  // its own wait.
  const int guess = device_context(g);
  partition(guess);
  Segment seg = segment_at(at);
  const bool early = b < blocks && (seg.kend < len || seg.n_tiles > Tr::kStages - 1);
  if (early) prologue(seg);
  cuda::grid_dependency_wait();
  cuda::grid_launch_dependents();

  const int context = device_context(g);
  if (!early || context != guess) {
    cp_async_wait<0>();  // the early copies land before the ring is reused
    partition(context);
    if (b >= blocks) return;  // device-position grids are sized for the capacity
    seg = segment_at(at);
    prologue(seg);
  }

  // Q as A fragments straight from global memory: row r of the tile is head h0 + r of the group
  // (zeros past the group); registers [0], [2] hold row lane / 4, [1], [3] row lane / 4 + 8.
  uint32_t qf[D / 16][4];
  auto load_q = [&](const Segment& s) {
    const T* qa = q + static_cast<size_t>(s.kvh * g.group + s.h0 + qr) * D + qc;
    const T* qb = qa + 8 * D;
    const bool row_a = qr < s.ng, row_b = qr + 8 < s.ng;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][0] = row_a ? load_pair(qa + kk * 16) : 0u;
      qf[kk][1] = row_b ? load_pair(qb + kk * 16) : 0u;
      qf[kk][2] = row_a ? load_pair(qa + kk * 16 + 8) : 0u;
      qf[kk][3] = row_b ? load_pair(qb + kk * 16 + 8) : 0u;
    }
  };

  load_q(seg);

  for (;;) {
    float o[D / 8][4] = {};
    MmaRowsSoftmax softmax;
    for (int it = 0; it < seg.n_tiles; ++it) {
      cp_async_wait<Tr::kStages - 2>();  // tile `it` has landed (for this thread's copies)
      __syncthreads();                   // ... for everyone's, and tile it - 1 is no longer read
      if (it + Tr::kStages - 1 < seg.n_tiles) load(seg, it + Tr::kStages - 1);
      cp_async_commit();

      const int key0 = seg.kbeg + it * Tr::kKeys + warp * 16;
      if (key0 < seg.kend) {  // warp-uniform; key0 itself is valid, so the maxima are finite
        const T* kt = ring + (it % Tr::kStages) * Tr::kStageElems;
        float s[2][4] = {};
        mma_qk<D, 16>(s, qf, kt, warp * 16);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + j * 8 + qc + (e & 1);
            s[j][e] = key < seg.kend ? s[j][e] * g.scale_log2 : -INFINITY;
          }
        }
        softmax.update(s, o);
        mma_pv<D, 16>(o, s, kt + Tr::kKeys * D, warp * 16);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free, and the merge area from the last segment

    // The next segment's first tiles load while this one is merged and written (and combined).
    const Segment cur = seg;
    const int64_t next = static_cast<int64_t>(cur.unit + 1) * len;
    const bool more = next < end;
    if (more) {
      seg = segment_at(next);
      prologue(seg);
    }

    // Merge the warps through shared memory. A warp that saw no key (a segment shorter than its
    // offset) has m = -inf and weight 0 below.
    float* mo = merge;                             // [warp][row][D]
    float* mm = mo + Tr::kWarps * Tr::kHeads * D;  // [warp][row] maxima
    float* ml = mm + Tr::kWarps * Tr::kHeads;      // [warp][row] sums
    softmax.reduce_rows();
    float* wo = mo + warp * Tr::kHeads * D;
    const bool keep_a = qr < cur.ng, keep_b = qr + 8 < cur.ng;  // rows past the group are zeros
    if (lane % 4 == 0) {
      if (keep_a) mm[warp * Tr::kHeads + qr] = softmax.row[0].m;
      if (keep_b) mm[warp * Tr::kHeads + qr + 8] = softmax.row[1].m;
      if (keep_a) ml[warp * Tr::kHeads + qr] = softmax.row[0].l;
      if (keep_b) ml[warp * Tr::kHeads + qr + 8] = softmax.row[1].l;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if (keep_a) *reinterpret_cast<float2*>(wo + qr * D + n * 8 + qc) = make_float2(o[n][0], o[n][1]);
      if (keep_b) {
        *reinterpret_cast<float2*>(wo + (qr + 8) * D + n * 8 + qc) = make_float2(o[n][2], o[n][3]);
      }
    }
    if (more) load_q(seg);  // its latency overlaps the merge
    __syncthreads();
    // Partials of head h live at slots h * gridDim.x + (block), one per block touching its unit;
    // a thread writes a float4 of one.
    const int head0 = cur.kvh * g.group + cur.h0;
    for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
      const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, mm[w * Tr::kHeads + r]);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) {
        const float wt = fast_exp2(mm[w * Tr::kHeads + r] - mx);  // finite mx: warp 0 saw kbeg
        const float4 x = *reinterpret_cast<const float4*>(mo + (w * Tr::kHeads + r) * D + d);
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
        sum += wt * ml[w * Tr::kHeads + r];
      }
      const size_t slot = static_cast<size_t>(head0 + r) * gridDim.x + b;
      *reinterpret_cast<float4*>(o_part + slot * D + d) = acc;
      if (d == 0) ml_part[slot] = make_float2(mx, sum);
    }

    // The combine, fused: the last block touching this unit to finish merges every block's
    // partial of it. The arrival is one acquire-release atomic by thread 0 after a barrier (the
    // barrier orders the block's partial writes before the release; the acquire, then the
    // barrier after it, orders the last block's reads of the others' partials after theirs),
    // and the partials are read through L2. The last block also resets the counter, so the next
    // launch (or graph replay) starts from zero.
    const int64_t unit0 = static_cast<int64_t>(cur.unit) * len;
    const int first = decode_block_of(work, blocks, unit0);
    const int used = decode_block_of(work, blocks, unit0 + len - 1) - first + 1;
    __shared__ int is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = arrivals + cur.unit;
      is_last = atomic_add_acq_rel(counter, 1) == used - 1;
      if (is_last) *counter = 0;
    }
    __syncthreads();
    if (is_last) {
      // One pass: a thread owns a float4 of one head's output and reads every partial's (m, l)
      // with its output slice, keeping a running maximum (online softmax over the partials), so
      // the partials' loads are all in flight at once: one L2 round trip, no barrier.
      for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
        const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const int h = head0 + r;
        const size_t slot0 = static_cast<size_t>(h) * gridDim.x + first;
        SoftmaxState st;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        fold_partials<D>(ml_part + slot0,
                         reinterpret_cast<const float4*>(o_part + slot0 * D + d), 0, used, 1, st,
                         acc);
        const float inv = 1.0f / st.l;
        const float res[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
        store_vec<T, 4>(out + static_cast<size_t>(h) * D + d, res);
      }
    }
    if (!more) break;
    // The loop's first barrier orders this segment's merge-area reads before the next writes.
  }
}

// fp32: one block per kChunk keys of the cache (the SIMT kernel's fixed chunk; decode_grid does
// not apply), then combine_splits.
template <typename T, int D>
Status launch_decode_split(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                           AttentionBuffers& buffers) {
  const int splits = (g.max_ctx + kChunk - 1) / kChunk;
  const int used = r.device_position ? splits : (g.start + kChunk) / kChunk;
  const dim3 grid(used, g.kv_heads, (g.group + kMaxGroupPerBlock - 1) / kMaxGroupPerBlock);
  // Partials for every split: fixed per op and cache, so the same buffers serve every step.
  const size_t slots = static_cast<size_t>(g.heads) * splits;
  KUIPER_ASSIGN_OR_RETURN(float* o_part, buffers.partials.floats(slots * D));
  KUIPER_ASSIGN_OR_RETURN(float* ml, buffers.stats.floats(slots * 2));
  float2* ml_part = reinterpret_cast<float2*>(ml);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kSplitThreads, 0, cuda::stream()>>>(a.q.data<T>(), a.k_cache.data<T>(),
                                                       a.v_cache.data<T>(), o_part, ml_part, g,
                                                       splits);
  };
  if (g.group == 1) launch(flash2_decode_split<T, D, 1>);
  else if (g.group == 2) launch(flash2_decode_split<T, D, 2>);
  else if (g.group <= 4) launch(flash2_decode_split<T, D, 4>);
  else launch(flash2_decode_split<T, D, kMaxGroupPerBlock>);
  KUIPER_CUDA_CHECK_LAUNCH("flash2_decode_split");
  combine_splits<T, D><<<g.heads, kCombineThreads, 0, cuda::stream()>>>(
      o_part, ml_part, a.out.data<T>(), g, splits, kChunk);
  KUIPER_CUDA_CHECK_LAUNCH("combine_splits");
  return Status::Ok();
}

// Zeroed int counters, one per (kv head, head group) of the fused decode; each launch leaves
// them at zero again.
Result<int*> arrival_counters(AttentionBuffers& buffers, size_t n) {
  if (n > buffers.arrivals_capacity) {
    KUIPER_ASSIGN_OR_RETURN(buffers.arrivals, Tensor::empty({static_cast<int64_t>(n)},
                                                            DataType::kInt32, DeviceType::kCuda));
    KUIPER_CUDA_CHECK(
        cudaMemsetAsync(buffers.arrivals.data<int>(), 0, n * sizeof(int), cuda::stream()));
    buffers.arrivals_capacity = n;
  }
  return buffers.arrivals.data<int>();
}

// fp16, bf16: one grid of blocks (request.decode_grid when set, else the largest multiple of the
// unit count that fits the SMs; at most kMaxDecodeSplits) over which the (kv head, head group, key)
// work is spread evenly on the device (decode_partition.h). The grid depends only on the SM count
// and the context known on the host (the cache capacity for a device position), so a captured
// launch replays at any position.
template <typename T, int D>
Status launch_decode_tc(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                        AttentionBuffers& buffers) {
  using Tr = DecodeTcTraits<D>;
  const int head_groups = (g.group + Tr::kHeads - 1) / Tr::kHeads;
  const int units = g.kv_heads * head_groups;
  const int ctx = r.device_position ? g.max_ctx : g.start + 1;
  int grid = r.decode_grid;
  if (grid <= 0) {
    KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
    grid = sms >= units ? sms / units * units : sms;
  }
  grid = decode_blocks(static_cast<int64_t>(units) * ctx, std::min(grid, kMaxDecodeSplits), units);
  KUIPER_LOG_TUNING("attention " + describe(r) + ": " + std::to_string(grid) + " blocks over " +
                    std::to_string(units) + " (kv head, head group) units, context " +
                    std::to_string(ctx));
  const size_t slots = static_cast<size_t>(g.heads) * grid;
  KUIPER_ASSIGN_OR_RETURN(float* o_part, buffers.partials.floats(slots * D));
  KUIPER_ASSIGN_OR_RETURN(float* ml, buffers.stats.floats(slots * 2));
  KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash2_decode_tc<T, D>>(Tr::kSharedBytes)));
  KUIPER_ASSIGN_OR_RETURN(int* arrivals, arrival_counters(buffers, units));
  // PDL: what the kernel may read before its wait is in the kernel.
  return cuda::launch(flash2_decode_tc<T, D>, dim3(grid), dim3(Tr::kThreads), Tr::kSharedBytes,
                      r.pdl, "flash2_decode_tc", a.q.data<T>(), a.k_cache.data<T>(),
                      a.v_cache.data<T>(), o_part, reinterpret_cast<float2*>(ml), arrivals,
                      a.out.data<T>(), g, head_groups);
}

}  // namespace

Status launch_flash2_decode(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                            AttentionBuffers& buffers) {
  return by_element_type(
      r,
      [&](auto tt, auto dt) {
        return launch_decode_tc<typename decltype(tt)::type, decltype(dt)::value>(a, g, r, buffers);
      },
      [&](auto dt) { return launch_decode_split<float, decltype(dt)::value>(a, g, r, buffers); });
}
}  // namespace kuiper::op::cuda_attention
