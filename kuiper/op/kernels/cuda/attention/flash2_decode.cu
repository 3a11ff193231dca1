// FlashAttention-2 decode (flash-decoding): one query cannot fill the GPU from a single KV pass, so
// the context is split over the KV length. fp16 and bf16 (flash2_decode_tc): a fixed grid (the
// largest multiple of the (sequence, kv head, group of up to 16 query heads) count that fits the
// SMs, or the SM count) over which the flattened (unit, key) work of the whole batch is spread
// evenly on the device from the positions (decode_partition.h), or, where a batch has more units
// than blocks and lengths near enough (decode_keeps_unit_run), as runs of whole units; a block writes
// the units it holds whole straight to out, and a partial for a unit it shares with the next or
// previous block.
// K/V stream through a cp.async ring, both products run on tensor cores (for GQA groups of up to
// 8 heads with the keys as the mma's rows and the heads as its 8 columns, S^T = K Q^T and O^T +=
// V^T P^T: half the mma and half the accumulator of the heads as its 16 rows, which larger groups
// keep; measured on the H200, Qwen3-8B fp16 full-batch decode +1.5% / +1.2% / +2.8% at 8 / 64 /
// 256 sequences, docs/PERFORMANCE.md), and the last block
// touching a unit to finish combines its partials (no second launch); where the blocks are two a
// unit (decode_cluster_blocks, sm_90), each pair is a thread block cluster and its first block
// merges both partials through distributed shared memory instead. The kernel is launched with
// PDL (unless the request turns it off): it starts loading its first tiles before it waits for the
// kernel before, and keeps them only if the position it reads after the wait is the one it guessed.
// Given the step's raw q|k|v (op::AttentionInput, paged, blocks an SM each), it also does the q/k
// norms, RoPE and the cache write of the newest rows itself (DecodeInput, prepare_head).
// fp32 (flash2_decode_split, SIMT): fixed chunks of kChunk keys, one block per (chunk, kv head,
// sequence and group of <= 8 query heads), then combine_splits. Either way each split writes an
// unnormalised partial output with its maximum and sum, partial buffers are sized for the launch's
// key_capacity and device-position grids for the capacity (blocks past the position's work exit at
// once), so nothing about a decode step depends on the position except what the kernels read from
// the device.
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/attention/decode_partition.h"
#include "kuiper/op/kernels/cuda/attention/flash2_traits.cuh"
#include "kuiper/op/kernels/cuda/attention/mma.cuh"
#include "kuiper/op/kernels/cuda/attention/ops.cuh"
#include "kuiper/op/kernels/cuda/attention/softmax_state.cuh"
#include "kuiper/op/kernels/cuda/attention/split_kv.cuh"
#include "kuiper/op/kernels/cuda/rope_row.cuh"
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
__device__ __forceinline__ void load_slices(const T* cache, const KeyRows& keys, const Geometry& g,
                                            int kvh, int first_key, int len, int part,
                                            uint4 (&raw)[DecodeTraits<T, D>::kBatch]
                                                        [DecodeTraits<T, D>::kWords]) {
  using Tr = DecodeTraits<T, D>;
#pragma unroll
  for (int i = 0; i < Tr::kBatch; ++i) {
    const int key = first_key + i * Tr::kKeysPerStep;
    const int row = key < len ? keys.row(key) : 0;  // past the context the table is not read
    const uint4* src = reinterpret_cast<const uint4*>(
        cache + (static_cast<size_t>(row) * g.kv_heads + kvh) * D + part * Tr::kElems);
#pragma unroll
    for (int c = 0; c < Tr::kWords; ++c) raw[i][c] = key < len ? src[c] : make_uint4(0, 0, 0, 0);
  }
}

// Calls f(key, slice) for the lane's slice (kElems floats) of each of its keys, kSteps of them,
// kBatch loads in flight at a time. The first batch must already be in `raw` (loaded ahead so
// that it overlaps other work); rows past the context are zeros.
template <typename T, int D, typename F>
__device__ __forceinline__ void for_each_slice(const T* cache, const KeyRows& keys,
                                               const Geometry& g, int kvh, int lane_key0, int len,
                                               int part,
                                               uint4 (&raw)[DecodeTraits<T, D>::kBatch]
                                                           [DecodeTraits<T, D>::kWords],
                                               F&& f) {
  using Tr = DecodeTraits<T, D>;
#pragma unroll
  for (int b = 0; b < Tr::kSteps; b += Tr::kBatch) {
    if (b > 0) {
      load_slices<T, D>(cache, keys, g, kvh, lane_key0 + b * Tr::kKeysPerStep, len, part, raw);
    }
#pragma unroll
    for (int i = 0; i < Tr::kBatch; ++i) {
      float x[Tr::kElems];
      unpack_slice<T>(raw[i], x);
      f(lane_key0 + (b + i) * Tr::kKeysPerStep, x);
    }
  }
}

// G: query heads per block, the GQA group rounded up to a power of two (at most 8), so a lane
// holds q and output slices for exactly the heads it serves. Grid (chunks, kv heads, sequences x
// head groups of G).
template <typename T, int D, int G>
__global__ void __launch_bounds__(kSplitThreads)
    flash2_decode_split(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        float* __restrict__ o_part, float2* __restrict__ ml_part, Geometry g,
                        int max_chunks) {
  using Tr = DecodeTraits<T, D>;
  __shared__ float scores[G][kChunk];
  __shared__ float partial[kSplitThreads / 32][G][D];

  const int groups = (g.group + G - 1) / G;
  const int seq_i = blockIdx.z / groups;
  const Sequence seq = sequence(g, seq_i);
  const int chunk = blockIdx.x, kvh = blockIdx.y;
  const int g0 = blockIdx.z % groups * G, ng = min(G, g.group - g0);
  const int len = seq.pos0 + 1;
  const int key0 = chunk * kChunk;
  if (key0 >= len) return;  // grids cover key_capacity
  q = query_rows<D>(q, g, seq.q0);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / Tr::kLanesPerKey;   // which key of a step this lane works on
  const int part = lane % Tr::kLanesPerKey;  // which slice of the row
  const int head0 = kvh * g.group + g0;
  const int lane_key0 = key0 + warp * 32 + sub;  // this lane's key in step 0

  uint4 raw[Tr::kBatch][Tr::kWords];
  load_slices<T, D>(k, seq.keys, g, kvh, lane_key0, len, part, raw);
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
  for_each_slice<T, D>(k, seq.keys, g, kvh, lane_key0, len, part, raw, [&](int key, const float* kv) {
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
  load_slices<T, D>(v, seq.keys, g, kvh, lane_key0, len, part, raw);  // V in flight: the softmax
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
    if (lane == 0) {
      ml_part[(static_cast<size_t>(seq_i) * g.heads + head0 + gi) * max_chunks + chunk] =
          make_float2(mx, sum);
    }
  }
  __syncthreads();

  // P·V with the same lane layout; each lane accumulates its row slice for every head.
  float o[G][Tr::kElems] = {};
  for_each_slice<T, D>(v, seq.keys, g, kvh, lane_key0, len, part, raw, [&](int key, const float* vv) {
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
    o_part[((static_cast<size_t>(seq_i) * g.heads + head0 + gi) * max_chunks + chunk) * D + d] = acc;
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

// The step's q, k and v before their norms and RoPE (op::AttentionInput), for the tensor-core
// decode to prepare itself: qkv null when q is given prepared.
struct DecodeInput {
  const void* qkv;  // [T, heads + 2 kv_heads, D]
  const void* q_norm;
  const void* k_norm;
  DataType q_norm_dtype, k_norm_dtype;
  float eps;
  const int* positions;       // the cache rows of the new keys and values
  const int* rope_positions;  // the rotary positions
  void* k_cache;              // the kernel's k and v, written at `positions`
  void* v_cache;
  kuiper::cuda::RopeTable table;
};

// What a lane needs to prepare its pairs (i, i + D / 2), i = lane + 32 k, of a sequence's head
// rows: cos and sin at the sequence's rotary position and the norm weights. Neither depends on
// the kernel before, so the first segment's are worked out before the PDL wait.
template <int D>
struct HeadRotation {
  static constexpr int kPairs = D / 64;
  float cs[kPairs], sn[kPairs];
  float qw0[kPairs], qw1[kPairs], kw0[kPairs], kw1[kPairs];

  __device__ __forceinline__ void set(const DecodeInput& in, int q0, int lane) {
    const float p = static_cast<float>(in.rope_positions[q0]);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int i = lane + 32 * k;
      kuiper::cuda::scaled_sincos(p * in.table.inv_freq[i], in.table.attention_factor, &sn[k],
                                  &cs[k]);
      qw0[k] = in.q_norm != nullptr ? kuiper::cuda::load_as_float(in.q_norm, in.q_norm_dtype, i) : 0.0f;
      qw1[k] = in.q_norm != nullptr
                   ? kuiper::cuda::load_as_float(in.q_norm, in.q_norm_dtype, i + D / 2)
                   : 0.0f;
      kw0[k] = in.k_norm != nullptr ? kuiper::cuda::load_as_float(in.k_norm, in.k_norm_dtype, i) : 0.0f;
      kw1[k] = in.k_norm != nullptr
                   ? kuiper::cuda::load_as_float(in.k_norm, in.k_norm_dtype, i + D / 2)
                   : 0.0f;
    }
  }
};

// One head row, the lane's pairs e0 (first half) and e1 (second) as loaded, normalised (when
// `normed`, weights w0 / w1) and rotated into dst (shared memory) and, when given, global. The
// arithmetic and its order are qk_norm_rope_cache.cu's, so the rows equal the unfused ones bit
// for bit.
template <typename T, int D>
__device__ __forceinline__ void prepare_head(const float (&e0)[D / 64], const float (&e1)[D / 64],
                                             bool normed, const float (&w0)[D / 64],
                                             const float (&w1)[D / 64], float eps,
                                             const HeadRotation<D>& rot, T* dst, T* global,
                                             int lane) {
  using kuiper::cuda::from_float;
  using kuiper::cuda::to_float;
  constexpr int kHalf = D / 2, kPairs = D / 64;
  float inv = 1.0f;
  if (normed) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPairs; ++k) sum += e0[k] * e0[k];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) sum += e1[k] * e1[k];
    sum = kuiper::cuda::warp_sum(sum);
    inv = kuiper::cuda::rms_inverse(sum, D, eps);
  }
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int i = lane + 32 * k;
    float a = e0[k], b = e1[k];
    if (normed) {
      a = to_float(from_float<T>(w0[k] * (a * inv)));
      b = to_float(from_float<T>(w1[k] * (b * inv)));
    }
    const RotatedPair r = rotate_half(a, b, rot.cs[k], rot.sn[k]);
    const T r0 = from_float<T>(r.first), r1 = from_float<T>(r.second);
    dst[i] = r0;
    dst[i + kHalf] = r1;
    if (global != nullptr) {
      global[i] = r0;
      global[i + kHalf] = r1;
    }
  }
}

// The dynamic shared memory of a fused input: kHeads prepared q rows and the newest K and V rows
// of D 16-bit elements, 16-byte aligned after the prefix sums.
constexpr size_t decode_prepared_bytes(int D) {
  return 16 + sizeof(uint16_t) * static_cast<size_t>(DecodeTcTraits<128>::kHeads + 2) * D;
}

// Keys in the cache at this decode step of the contiguous form (the position + 1), read past
// L1: a decode kernel reads it twice, before and after its dependency wait, and the second read
// must see a new value.
__device__ __forceinline__ int device_context(const Geometry& g) {
  if (g.device_position == nullptr) return g.start + 1;
  return min(max(__ldcg(g.device_position), 0), g.key_capacity - 1) + 1;
}

// The work of a batch: sequence i has units (kv head, head group) pairs of len_i keys each, laid
// out sequence-major in one flat range: sequence i's units start at flat key
// units * (len_0 + ... + len_{i-1}), unit u of it u * len_i further on. decode_partition.h spreads
// that range evenly over the grid. Shared memory holds the prefix sums of the lengths (paged);
// the contiguous form has one sequence of a length known without them.
// kKeyRows: the keys are the mma rows and the heads its 8 columns (mma_kq / mma_vp, for GQA
// groups of up to 8 heads); otherwise the heads are its 16 rows (mma_qk / mma_pv).
template <typename T, int D, bool kKeyRows>
__global__ void __launch_bounds__(DecodeTcTraits<D>::kThreads)
    flash2_decode_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     float* __restrict__ o_part, float2* __restrict__ ml_part,
                     int* __restrict__ arrivals, T* __restrict__ out, Geometry g,
                     int head_groups, int cluster, int unit_run, const DecodeInput in) {
  using Tr = DecodeTcTraits<D>;
  // Sequences from g.live on are a graph's padding: the work, the partition and the blocks that
  // hold keys are the live sequences' alone, and the pads' rows of out are not written. Written
  // by host copies before the step, like starts (PagedBatch::live).
  const int launched = g.batch;
  if (g.live != nullptr) g.batch = min(max(__ldcg(g.live), 1), g.batch);
  extern __shared__ uint4 shared16[];
  T* ring = reinterpret_cast<T*>(shared16);
  float* merge = reinterpret_cast<float*>(ring + Tr::kStages * Tr::kStageElems);
  const int rows = min(g.group, Tr::kHeads);  // the merge area's rows a warp
  int64_t* prefix = reinterpret_cast<int64_t*>(merge + Tr::kWarps * rows * (D + 2));
  // Fused input only (decode_prepared_bytes): the segment's prepared q rows, then the newest
  // key's K and V rows, after the prefix sums.
  T* prepared_q = reinterpret_cast<T*>(
      (reinterpret_cast<uintptr_t>(prefix + (g.starts != nullptr ? g.batch + 1 : 0)) + 15) &
      ~uintptr_t{15});
  T* newest = prepared_q + Tr::kHeads * D;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const int b = blockIdx.x;
  const int seq_units = g.kv_heads * head_groups;  // units of one sequence
  const bool paged = g.starts != nullptr;
  // With the step's q, k and v given raw (paged only), the block prepares the q rows of each
  // segment and, for a segment that ends its unit, the newest key and value: into the cache for
  // later steps and into the ring's copy of that row (the copy itself may read the row before it
  // is written). Every tile, the newest's too, can then be asked for before the PDL wait.
  const bool fused = in.qkv != nullptr;
  HeadRotation<D> rot;  // of the segment being prepared

  // prefix[i] = len_0 + ... + len_{i-1} for i in [0, batch], len_i = starts[i] + 1 (clamped):
  // each thread sums a run of sequences, a block-wide scan of the runs gives their offsets.
  // Each warp also leaves the longest len_i of its threads' runs in warp_longest.
  __shared__ int warp_longest[Tr::kWarps];
  auto scan_lengths = [&]() {
    __shared__ int64_t warp_sums[Tr::kWarps];
    const int per = (g.batch + Tr::kThreads - 1) / Tr::kThreads;
    const int lo = min(static_cast<int>(threadIdx.x) * per, g.batch), hi = min(lo + per, g.batch);
    int64_t run = 0;
    int longest = 0;
    for (int i = lo; i < hi; ++i) {
      const int len = sequence(g, i).pos0 + 1;
      run += len;
      longest = max(longest, len);
    }
    int64_t inclusive = run;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int64_t y = __shfl_up_sync(0xffffffffu, inclusive, off);
      if (lane >= off) inclusive += y;
    }
    longest = __reduce_max_sync(0xffffffffu, longest);
    if (lane == 31) warp_sums[warp] = inclusive;
    if (lane == 0) warp_longest[warp] = longest;
    __syncthreads();
    int64_t offset = inclusive - run;
    for (int w = 0; w < warp; ++w) offset += warp_sums[w];
    for (int i = lo; i < hi; ++i) {
      prefix[i] = offset;
      offset += sequence(g, i).pos0 + 1;
    }
    if (threadIdx.x == Tr::kThreads - 1) prefix[g.batch] = offset;
    __syncthreads();
  };

  // The partition: the blocks that hold keys and this block's flat range [block_begin, end).
  int len0 = 0;  // the contiguous form's one length
  int blocks = 0;
  int64_t work = 0, block_begin = 0, end = 0;
  auto keys_before = [&](int i) -> int64_t {
    return paged ? prefix[i] : static_cast<int64_t>(i) * len0;
  };
  auto unit_begin = [&](int unit) -> int64_t {  // the unit's first flat key (past the last: work)
    const int seq_i = unit / seq_units, u = unit % seq_units;
    if (seq_i >= g.batch) return work;
    return seq_units * keys_before(seq_i) + u * (keys_before(seq_i + 1) - keys_before(seq_i));
  };
  auto partition = [&](int contiguous_len) {
    len0 = contiguous_len;
    work = static_cast<int64_t>(seq_units) * keys_before(g.batch);
    if (cluster > 1) {  // unit b / cluster, split evenly over its cluster (decode_cluster_blocks)
      // A pad's clusters hold no keys: both of their blocks leave before the cluster's syncs.
      blocks = min(static_cast<int>(gridDim.x), seq_units * g.batch * cluster);
      const int unit = b / cluster, part = b % cluster;
      const int64_t unit0 = unit_begin(unit), len = unit_begin(unit + 1) - unit0;
      block_begin = unit0 + len * part / cluster;
      end = unit0 + len * (part + 1) / cluster;
      return;
    }
    // unit_run whole units a block (decode_unit_run) where the lengths keep them even.
    int longest = len0;
    if (paged) {
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) longest = max(longest, warp_longest[w]);
    }
    // A padded batch whose live units are no more than the grid: a block a unit, none cut, where
    // the lengths keep that even (the grid was sized for the bucket's units, so the balanced
    // split below would cut most live units in two and combine their partials). Measured on the
    // H200 (Qwen3-8B fp16, kuiper-bench --throughput --cuda-graph at 448 + 128 tokens, full-batch
    // decode tok/s, two turns each; forty-first session): 12 sequences in the graph of 16 (96
    // units, grid 128) 1974.5, 1975.5 -> 2030.0, 2034.3; 24 of 32 (192, grid 256) 4042.6, 4036.8
    // -> 4167.0, 4166.9. Runs of several live units gain nothing or lose (48 of 64 in runs of 2 on 192 of the 256
    // blocks: 7315.7, 7311.2 -> 7323.0, 7324.9; 100 of 128 in runs of 4 on 200: 12154.6, 12136.1
    // -> 12009.5, 12049.0).
    const int live_units = seq_units * g.batch;
    if (g.batch < launched && live_units <= static_cast<int>(gridDim.x) &&
        decode_keeps_unit_run(work, longest, 1, live_units)) {
      blocks = live_units;
      block_begin = unit_begin(b);
      end = unit_begin(b + 1);
      return;
    }
    if (decode_keeps_unit_run(work, longest, unit_run, gridDim.x)) {
      blocks = min(static_cast<int>(gridDim.x), (seq_units * g.batch + unit_run - 1) / unit_run);
      block_begin = unit_begin(b * unit_run);
      end = unit_begin((b + 1) * unit_run);
      return;
    }
    blocks = decode_blocks(work, gridDim.x, seq_units * g.batch);
    block_begin = decode_block_begin(work, blocks, b);
    end = decode_block_begin(work, blocks, b + 1);
  };

  // The block's range as segments, one per unit (sequence, kv head, head group) it touches.
  struct Segment {
    int unit, q0, kvh, h0, ng, len, kbeg, kend, n_tiles;
    int64_t unit0;  // the unit's first flat key
    KeyRows keys;
  };
  auto segment_at = [&](int64_t flat) {
    int seq_i = 0;  // the last sequence starting at or before flat (lengths are >= 1)
    for (int lo = 0, hi = paged ? g.batch : 1; hi - lo > 1;) {
      const int mid = (lo + hi) / 2;
      if (seq_units * keys_before(mid) <= flat) lo = seq_i = mid;
      else hi = mid;
    }
    Segment s;
    const int64_t seq0 = seq_units * keys_before(seq_i);
    s.len = static_cast<int>(keys_before(seq_i + 1) - keys_before(seq_i));
    const int u = static_cast<int>((flat - seq0) / s.len);
    s.unit = seq_i * seq_units + u;
    s.q0 = seq_i * g.max_queries;  // decode: one query a sequence
    s.kvh = u / head_groups;
    s.h0 = (u % head_groups) * Tr::kHeads;
    s.ng = min(Tr::kHeads, g.group - s.h0);
    s.unit0 = seq0 + static_cast<int64_t>(u) * s.len;
    s.kbeg = static_cast<int>(flat - s.unit0);
    s.kend = static_cast<int>(min(end - s.unit0, static_cast<int64_t>(s.len)));
    s.n_tiles = (s.kend - s.kbeg + Tr::kKeys - 1) / Tr::kKeys;
    s.keys = key_rows(g, seq_i);
    return s;
  };
  // The block's tiles form one stream across its segments: the ring keeps kStages - 1 tiles in
  // flight at every step, the next segment's first tiles too, so a segment boundary costs no
  // pipeline drain. Measured on the H100 (bf16, 32 q / 8 kv heads, d 128), draining the ring at
  // every boundary held B = 256 at 1000 keys to 55% of copy bandwidth (638 us): a block of that
  // batch crosses ~16 segments and each drain leaves the SM without a load in flight for about
  // two tile latencies. `ahead` is the next tile to request; tile n of the stream lands in slot
  // n % kStages.
  struct Cursor {
    Segment seg;
    int tile;   // of seg
    bool done;  // past the block's range
  };
  // The rows of tile `ahead` are looked up when the tile before it is requested, so the block
  // table's latency overlaps a tile's compute instead of stalling the copy that follows the
  // barrier. Measured on the H100 (Nsight Compute, B = 256 at 576 keys): the kernel issued 0.27
  // instructions a cycle per scheduler, every warp of the block waiting at once.
  Cursor ahead = {};
  KvTileRows<D, Tr::kKeys, Tr::kThreads> ahead_rows;
  auto look_up_ahead = [&]() {
    const Segment& s = ahead.seg;
    ahead_rows.look_up(s.keys, s.kbeg + ahead.tile * Tr::kKeys, s.kend);
  };
  int requested = 0;  // tiles of the stream requested so far
  auto request = [&]() {
    if (!ahead.done) {
      T* kt = ring + (requested % Tr::kStages) * Tr::kStageElems;
      const Segment& s = ahead.seg;
      ahead_rows.copy(k, v, g.kv_heads, s.kvh, kt, kt + Tr::kKeys * D);
      ++requested;
      if (++ahead.tile == s.n_tiles) {
        const int64_t next = s.unit0 + s.len;
        ahead.done = next >= end;
        if (!ahead.done) {
          ahead.seg = segment_at(next);
          ahead.tile = 0;
        }
      }
      if (!ahead.done) look_up_ahead();
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  };
  // The first kStages - 1 groups. Before the dependency wait (early) only tiles that do not
  // hold a unit's newest key, which the kernel before may still be writing; the rest after it.
  int primed = 0;
  auto prime = [&](bool early) {
    for (; primed < Tr::kStages - 1; ++primed) {
      if (early && !fused && !ahead.done && ahead.tile == ahead.seg.n_tiles - 1 &&
          ahead.seg.kend == ahead.seg.len) {
        break;
      }
      request();
    }
  };
  Segment seg;  // the segment being computed
  auto start_stream = [&]() {
    seg = segment_at(block_begin);
    ahead.seg = seg;
    ahead.tile = 0;
    ahead.done = seg.n_tiles == 0;  // a cluster's block with no keys (a unit shorter than it)
    look_up_ahead();
    requested = 0;
    primed = 0;
  };

  // Launched with PDL. Every kernel of a step waits before it lets its dependents start, so when
  // this block runs, every kernel but the one just before has finished; that one (qk-norm, RoPE
  // and the cache write) may still be writing q and the newest K/V row of each sequence. So
  // before the wait the block computes its partition and requests its first tiles but those
  // holding a newest row, which hides their latency behind the kernel before. Paged: starts and
  // the block tables are written by host copies before the step (attention.h: never by the
  // kernel just before this one), so they are read here as they are. Contiguous: the position
  // may be written by the kernel before, so it is a guess, read again after the wait; the early
  // tiles are kept only when it is unchanged. The next kernel (the o-projection) may start right
  // away: it only prefetches weights before its own wait.
  int guess = 0;
  if (paged) {
    scan_lengths();
    partition(0);
  } else {
    guess = device_context(g);
    partition(guess);
  }
  if (b < blocks) {
    start_stream();
    prime(true);
    if (fused) rot.set(in, seg.q0, lane);
  }
  cuda::grid_dependency_wait();
  cuda::grid_launch_dependents();

  if (!paged) {
    const int context = device_context(g);
    if (context != guess) {
      cp_async_wait<0>();  // the early copies land before the ring is reused
      partition(context);
      if (b < blocks) start_stream();
    }
  }
  if (b >= blocks) return;  // the grid is sized for every sequence's key_capacity
  prime(false);

  // Q as A fragments straight from global memory: row r of the tile is head h0 + r of the group
  // (zeros past the group); registers [0], [2] hold row lane / 4, [1], [3] row lane / 4 + 8.
  // With kKeyRows, as B fragments: [0] and [1] of head lane / 4 (mma_kq).
  uint32_t qf[D / 16][kKeyRows ? 2 : 4];
  auto load_q = [&](const Segment& s) {
    const T* qa = q + (static_cast<size_t>(s.q0) * g.heads + s.kvh * g.group + s.h0 + qr) * D + qc;
    const T* qb = qa + 8 * D;
    const bool row_a = qr < s.ng, row_b = qr + 8 < s.ng;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if constexpr (kKeyRows) {
        qf[kk][0] = row_a ? load_pair(qa + kk * 16) : 0u;
        qf[kk][1] = row_a ? load_pair(qa + kk * 16 + 8) : 0u;
      } else {
        qf[kk][0] = row_a ? load_pair(qa + kk * 16) : 0u;
        qf[kk][1] = row_b ? load_pair(qb + kk * 16) : 0u;
        qf[kk][2] = row_a ? load_pair(qa + kk * 16 + 8) : 0u;
        qf[kk][3] = row_b ? load_pair(qb + kk * 16 + 8) : 0u;
      }
    }
  };

  // Fused input: the segment's q rows into prepared_q and, where the segment ends its unit, the
  // newest K and V rows into `newest` and the cache; read after a barrier.
  // Every row a warp prepares is loaded at once (one round trip): its q rows (heads warp,
  // warp + kWarps, ...) and, where the segment ends its unit, the newest key (last warp) or value
  // (the one before).
  auto prepare = [&](const Segment& s) {
    constexpr int kPairs = D / 64, kRowsAWarp = Tr::kHeads / Tr::kWarps;
    using kuiper::cuda::to_float;
    const T* row = static_cast<const T*>(in.qkv) +
                   static_cast<size_t>(s.q0) * (g.heads + 2 * g.kv_heads) * D;
    const bool newest_here = s.kend == s.len;  // block-uniform
    const bool k_warp = newest_here && warp == Tr::kWarps - 1;
    const bool v_warp = newest_here && warp == Tr::kWarps - 2;
    float e0[kRowsAWarp + 1][kPairs], e1[kRowsAWarp + 1][kPairs];
#pragma unroll
    for (int j = 0; j <= kRowsAWarp; ++j) {
      const int r = warp + j * Tr::kWarps;
      const bool live = j < kRowsAWarp ? r < s.ng : k_warp || v_warp;
      const T* x = j < kRowsAWarp ? row + static_cast<size_t>(s.kvh * g.group + s.h0 + r) * D
                                  : row + static_cast<size_t>(g.heads + (v_warp ? g.kv_heads : 0) +
                                                              s.kvh) * D;
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        e0[j][k] = live ? to_float(x[lane + 32 * k]) : 0.0f;
        e1[j][k] = live ? to_float(x[lane + 32 * k + D / 2]) : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsAWarp; ++j) {
      const int r = warp + j * Tr::kWarps;
      if (r < s.ng) {
        prepare_head<T, D>(e0[j], e1[j], in.q_norm != nullptr, rot.qw0, rot.qw1, in.eps, rot,
                           prepared_q + r * D, nullptr, lane);
      }
    }
    if (k_warp || v_warp) {
      const int pos = in.positions[s.q0];
      const bool cached = pos >= 0 && pos < g.max_ctx;
      const size_t at = (static_cast<size_t>(cached ? pos : 0) * g.kv_heads + s.kvh) * D;
      if (k_warp) {
        prepare_head<T, D>(e0[kRowsAWarp], e1[kRowsAWarp], in.k_norm != nullptr, rot.kw0,
                           rot.kw1, in.eps, rot, newest,
                           cached ? static_cast<T*>(in.k_cache) + at : nullptr, lane);
      } else {
        T* vc = static_cast<T*>(in.v_cache) + at;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const int i = lane + 32 * k;
          const T a = kuiper::cuda::from_float<T>(e0[kRowsAWarp][k]);
          const T b = kuiper::cuda::from_float<T>(e1[kRowsAWarp][k]);
          newest[D + i] = a;
          newest[D + i + D / 2] = b;
          if (cached) {
            vc[i] = a;
            vc[i + D / 2] = b;
          }
        }
      }
    }
  };
  auto load_prepared_q = [&](const Segment& s) {
    const T* qa = prepared_q + qr * D + qc;
    const T* qb = qa + 8 * D;
    const bool row_a = qr < s.ng, row_b = qr + 8 < s.ng;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if constexpr (kKeyRows) {
        qf[kk][0] = row_a ? *reinterpret_cast<const uint32_t*>(qa + kk * 16) : 0u;
        qf[kk][1] = row_a ? *reinterpret_cast<const uint32_t*>(qa + kk * 16 + 8) : 0u;
      } else {
        qf[kk][0] = row_a ? *reinterpret_cast<const uint32_t*>(qa + kk * 16) : 0u;
        qf[kk][1] = row_b ? *reinterpret_cast<const uint32_t*>(qb + kk * 16) : 0u;
        qf[kk][2] = row_a ? *reinterpret_cast<const uint32_t*>(qa + kk * 16 + 8) : 0u;
        qf[kk][3] = row_b ? *reinterpret_cast<const uint32_t*>(qb + kk * 16 + 8) : 0u;
      }
    }
  };

  if (fused) {
    prepare(seg);
    __syncthreads();
  } else {
    load_q(seg);
  }

  int consumed = 0;  // tiles of the stream computed so far
  for (;;) {
    if (fused) load_prepared_q(seg);  // prepared before the last barrier
    // kKeyRows: o[m] holds dimensions m * 16 + lane / 4 and + 8 of heads qc and qc + 1.
    float o[kKeyRows ? D / 16 : D / 8][4] = {};
    std::conditional_t<kKeyRows, MmaColumnsSoftmax, MmaRowsSoftmax> softmax;
    for (int it = 0; it < seg.n_tiles; ++it, ++consumed) {
      cp_async_wait<Tr::kStages - 2>();  // tile `consumed` has landed (this thread's copies)
      __syncthreads();                   // ... everyone's, and tile consumed - 1 is no longer read
      request();                         // into the slot of tile consumed - 1
      if (fused && seg.kend == seg.len && it == seg.n_tiles - 1) {  // block-uniform
        // The newest key's row of the ring's K and V tiles, as prepared (swizzled as copied).
        T* tile = ring + (consumed % Tr::kStages) * Tr::kStageElems;
        const int r = seg.len - 1 - (seg.kbeg + it * Tr::kKeys);
        for (int c = threadIdx.x; c < 2 * (D / 8); c += Tr::kThreads) {
          const int kv = c / (D / 8), ch = c % (D / 8);
          *reinterpret_cast<uint4*>(tile + kv * Tr::kKeys * D + r * D + (ch ^ (r & 7)) * 8) =
              *reinterpret_cast<const uint4*>(newest + kv * D + ch * 8);
        }
        __syncthreads();
      }

      const int key0 = seg.kbeg + it * Tr::kKeys + warp * 16;
      if (key0 < seg.kend) {  // warp-uniform; key0 itself is valid, so the maxima are finite
        const T* kt = ring + (consumed % Tr::kStages) * Tr::kStageElems;
        if constexpr (kKeyRows) {
          float s[4] = {};
          mma_kq<D>(s, qf, kt, warp * 16);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + qr + (e < 2 ? 0 : 8);  // mma row lane / 4, or + 8
            s[e] = key < seg.kend ? s[e] * g.scale_log2 : -INFINITY;
          }
          softmax.update(s, o);
          mma_vp<D>(o, s, kt + Tr::kKeys * D, warp * 16);
        } else {
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
    }
    // No barrier: the merge area is apart from the ring, and the loop's barriers order the last
    // segment's merge-area reads before this one's writes; the next tiles keep loading.
    const Segment cur = seg;
    const int64_t next = cur.unit0 + cur.len;
    const bool more = next < end;
    if (more) seg = segment_at(next);

    // Merge the warps through shared memory. A warp that saw no key (a segment shorter than its
    // offset) has m = -inf and weight 0 below.
    float* mo = merge;                    // [warp][row][D]
    float* mm = mo + Tr::kWarps * rows * D;  // [warp][row] maxima
    float* ml = mm + Tr::kWarps * rows;      // [warp][row] sums
    float* wo = mo + warp * rows * D;
    if constexpr (kKeyRows) {
      softmax.reduce_columns();
      const bool keep_a = qc < cur.ng, keep_b = qc + 1 < cur.ng;  // heads past the group
      if (lane < 4) {
        if (keep_a) mm[warp * rows + qc] = softmax.col[0].m;
        if (keep_b) mm[warp * rows + qc + 1] = softmax.col[1].m;
        if (keep_a) ml[warp * rows + qc] = softmax.col[0].l;
        if (keep_b) ml[warp * rows + qc + 1] = softmax.col[1].l;
      }
#pragma unroll
      for (int m = 0; m < D / 16; ++m) {
        const int d = m * 16 + qr;
        if (keep_a) wo[qc * D + d] = o[m][0], wo[qc * D + d + 8] = o[m][2];
        if (keep_b) wo[(qc + 1) * D + d] = o[m][1], wo[(qc + 1) * D + d + 8] = o[m][3];
      }
    } else {
      softmax.reduce_rows();
      const bool keep_a = qr < cur.ng, keep_b = qr + 8 < cur.ng;  // rows past the group are zeros
      if (lane % 4 == 0) {
        if (keep_a) mm[warp * rows + qr] = softmax.row[0].m;
        if (keep_b) mm[warp * rows + qr + 8] = softmax.row[1].m;
        if (keep_a) ml[warp * rows + qr] = softmax.row[0].l;
        if (keep_b) ml[warp * rows + qr + 8] = softmax.row[1].l;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        if (keep_a) *reinterpret_cast<float2*>(wo + qr * D + n * 8 + qc) = make_float2(o[n][0], o[n][1]);
        if (keep_b) {
          *reinterpret_cast<float2*>(wo + (qr + 8) * D + n * 8 + qc) = make_float2(o[n][2], o[n][3]);
        }
      }
    }
    if (more) {  // its latency overlaps the merge
      if (fused) {
        if (seg.q0 != cur.q0) rot.set(in, seg.q0, lane);
        prepare(seg);
      } else {
        load_q(seg);
      }
    }
    __syncthreads();

    if (cluster > 1) {  // block-uniform
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // The unit's blocks are one cluster (decode_cluster_blocks), one segment each. Each leaves
      // its partial in its own shared memory (the ring: every tile of the segment consumed, no
      // copy in flight), the cluster syncs (a release of the partials and an acquire of the
      // others'), and its first block merges them through distributed shared memory and writes
      // the output; the second sync keeps the others' shared memory until it has read them.
      namespace cg = cooperative_groups;
      static_assert(Tr::kRingBytes >= Tr::kHeads * (D + 2) * sizeof(float),
                    "a cluster's partial fits the ring");
      cg::cluster_group cl = cg::this_cluster();
      float* cpo = reinterpret_cast<float*>(ring);                        // [kHeads][D]
      float2* cml = reinterpret_cast<float2*>(cpo + Tr::kHeads * D);      // [kHeads]
      for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
        const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, mm[w * rows + r]);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float sum = 0.0f;
        if (mx != -INFINITY) {  // a block with no keys leaves (-inf, 0) and zeros
#pragma unroll
          for (int w = 0; w < Tr::kWarps; ++w) {
            const float wt = fast_exp2(mm[w * rows + r] - mx);
            const float4 x = *reinterpret_cast<const float4*>(mo + (w * rows + r) * D + d);
            acc.x += wt * x.x;
            acc.y += wt * x.y;
            acc.z += wt * x.z;
            acc.w += wt * x.w;
            sum += wt * ml[w * rows + r];
          }
        }
        *reinterpret_cast<float4*>(cpo + r * D + d) = acc;
        if (d == 0) cml[r] = make_float2(mx, sum);
      }
      cl.sync();  // release the partials to the cluster, acquire the others'
      if (cl.block_rank() == 0) {
        for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
          const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
          float M = -INFINITY;
          for (int c = 0; c < cluster; ++c) M = fmaxf(M, cl.map_shared_rank(cml, c)[r].x);
          float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          float l = 0.0f;
          for (int c = 0; c < cluster; ++c) {
            const float2 x = cl.map_shared_rank(cml, c)[r];
            if (x.x == -INFINITY) continue;
            const float wt = fast_exp2(x.x - M);
            const float4 y = *reinterpret_cast<const float4*>(cl.map_shared_rank(cpo, c) + r * D + d);
            acc.x += wt * y.x;
            acc.y += wt * y.y;
            acc.z += wt * y.z;
            acc.w += wt * y.w;
            l += wt * x.y;
          }
          const float inv = 1.0f / l;  // l > 0: some block of the unit holds a key
          const float res[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
          store_vec<T, 4>(out + (static_cast<size_t>(cur.q0) * g.heads + cur.kvh * g.group +
                                 cur.h0 + r) * D + d, res);
        }
      }
      cl.sync();  // the first block is done reading: the others' shared memory may go
#else
      __trap();  // the host launches clusters only on sm_90 and up (cluster_launch)
#endif
      break;
    }

    // The blocks touching this unit: [first, first + used). A unit this block holds whole (every
    // unit but its first and last, and all of them where blocks hold whole units) is written
    // straight to out. Otherwise the block writes a partial: slot (block, 0) for its first
    // segment, (block, 1) for its last, the only ones another block can share.
    const int first = decode_block_of(work, blocks, cur.unit0);
    const int used = cur.unit0 >= block_begin && cur.unit0 + cur.len <= end
                         ? 1
                         : decode_block_of(work, blocks, cur.unit0 + cur.len - 1) - first + 1;
    const int which = cur.unit0 <= block_begin ? 0 : 1;
    const int head0 = cur.kvh * g.group + cur.h0;
    T* out_rows = out + (static_cast<size_t>(cur.q0) * g.heads + head0) * D;
    for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
      const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, mm[w * rows + r]);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) {
        const float wt = fast_exp2(mm[w * rows + r] - mx);  // finite mx: warp 0 saw kbeg
        const float4 x = *reinterpret_cast<const float4*>(mo + (w * rows + r) * D + d);
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
        sum += wt * ml[w * rows + r];
      }
      if (used == 1) {
        const float inv = 1.0f / sum;
        const float res[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
        store_vec<T, 4>(out_rows + static_cast<size_t>(r) * D + d, res);
      } else {
        const size_t slot = (static_cast<size_t>(b) * 2 + which) * Tr::kHeads + r;
        *reinterpret_cast<float4*>(o_part + slot * D + d) = acc;
        if (d == 0) ml_part[slot] = make_float2(mx, sum);
      }
    }

    // The combine, fused: the last block touching this unit to finish merges every block's
    // partial of it. The arrival is one acquire-release atomic by thread 0 after a barrier (the
    // barrier orders the block's partial writes before the release; the acquire, then the
    // barrier after it, orders the last block's reads of the others' partials after theirs),
    // and the partials are read through L2. The last block also resets the counter, so the next
    // launch (or graph replay) starts from zero.
    if (used > 1) {  // block-uniform
      __shared__ int is_last;
      __syncthreads();
      if (threadIdx.x == 0) {
        int* counter = arrivals + cur.unit;
        is_last = atomic_add_acq_rel(counter, 1) == used - 1;
        if (is_last) *counter = 0;
      }
      __syncthreads();
      if (is_last) {
        // One pass: a thread owns a float4 of one head's output and reads every partial's
        // (m, l) with its output slice, keeping a running maximum (online softmax over the
        // partials), its loads in flight kFoldChunk at a time (fold_partials): one L2 round trip
        // a chunk, no barrier. Block `first` holds the unit in its last slot unless the unit starts with it.
        const int which0 = decode_block_begin(work, blocks, first) == cur.unit0 ? 0 : 1;
        for (int idx = threadIdx.x; idx < cur.ng * (D / 4); idx += Tr::kThreads) {
          const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
          SoftmaxState st;
          float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          fold_partials<D>(ml_part, reinterpret_cast<const float4*>(o_part + d), used,
                           [=](int c) {
                             return (static_cast<size_t>(first + c) * 2 + (c == 0 ? which0 : 0)) *
                                        Tr::kHeads + r;
                           },
                           st, acc);
          const float inv = 1.0f / st.l;
          const float res[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
          store_vec<T, 4>(out_rows + static_cast<size_t>(r) * D + d, res);
        }
      }
    }
    if (!more) break;
    // The loop's first barrier orders this segment's merge-area reads before the next writes.
  }
}

// fp32: one block per kChunk keys of a sequence's key_capacity (the SIMT kernel's fixed chunk;
// decode_grid does not apply), then combine_splits.
template <typename T, int D>
Status launch_decode_split(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                           AttentionBuffers& buffers) {
  const int splits = (g.key_capacity + kChunk - 1) / kChunk;
  const int groups = (g.group + kMaxGroupPerBlock - 1) / kMaxGroupPerBlock;
  if (static_cast<int64_t>(g.batch) * groups > 65535) {
    return Status::Error("attention " + describe(r) + ": too many sequences for one grid");
  }
  const dim3 grid(splits, g.kv_heads, g.batch * groups);
  // Partials for every split: fixed per op and cache, so the same buffers serve every step.
  const size_t slots = static_cast<size_t>(g.batch) * g.heads * splits;
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
  combine_splits<T, D><<<dim3(g.heads, g.batch), kCombineThreads, 0, cuda::stream()>>>(
      o_part, ml_part, a.out.data<T>(), g, splits, kChunk);
  KUIPER_CUDA_CHECK_LAUNCH("combine_splits");
  return Status::Ok();
}

// Zeroed int counters, one per (sequence, kv head, head group) of the fused decode; each launch
// leaves them at zero again.
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

// Most sequences of one fused decode: the prefix sums of their lengths live in shared memory
// beside the ring (32 KB at this bound, which leaves room for one block an SM).
constexpr int kMaxDecodeBatch = 4096;

// fp16, bf16: one grid of blocks (request.decode_grid when set, else the largest multiple of the
// unit count that fits the SMs, one block each, or, once the batch has more units than SMs,
// every block that fits at once; at most kMaxDecodeSplits) over which the (sequence, kv head, head group, key) work is spread evenly on
// the device (decode_partition.h). The grid depends only on the SM count and the keys known on
// the host (key_capacity per sequence), so a captured launch replays at any position. Many
// sequences need no splitting at all: with B * kv heads units past the SM count a block holds
// whole units, written straight to out, and only the units cut by a block boundary (two a block
// at most, none where the grid is runs of whole units) go through partials and the fused combine. Two blocks an SM (the merge area sized by
// the GQA group leaves room for them) pay where blocks hold whole units and lose where they
// split one: measured on the H100 (`kuiper-bench --attention-only --dtype fp16 --decode-batch B
// --kv-len 576`, 32 q / 8 kv heads, d 128, us, one an SM -> two): B = 64 70.1 -> 63.5, B = 256
// 250.1 -> 238.8, 28 q / 4 kv heads bf16 B = 64 42.1 -> 30.3; but B = 8 11.0 -> 12.3 (four
// blocks a unit instead of two) and one sequence of 4096 keys 9.2 -> 13.4.
template <typename T, int D, bool kKeyRows>
Status launch_decode_tc(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                        AttentionBuffers& buffers) {
  using Tr = DecodeTcTraits<D>;
  const bool paged = g.starts != nullptr;
  if (paged && g.batch > kMaxDecodeBatch) {
    return Status::Error("attention " + describe(r) + ": " + std::to_string(g.batch) +
                         " sequences, more than the " + std::to_string(kMaxDecodeBatch) +
                         " of one decode call");
  }
  const int head_groups = (g.group + Tr::kHeads - 1) / Tr::kHeads;
  const int units = g.kv_heads * head_groups * g.batch;
  const int64_t keys = static_cast<int64_t>(g.batch) * g.key_capacity;
  // The attribute is raised once, for the largest batch; each launch asks for what it uses.
  constexpr size_t kPrefixMost = sizeof(int64_t) * (kMaxDecodeBatch + 1);
  KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash2_decode_tc<T, D, kKeyRows>>(
      Tr::kMostSharedBytes + kPrefixMost + decode_prepared_bytes(D))));
  const bool fused = a.input.defined();
  const size_t prefix_bytes = (paged ? sizeof(int64_t) * (g.batch + 1) : 0) +
                              (fused ? decode_prepared_bytes(D) : 0);
  // Blocks that split units run one an SM (decode_default_grid): they ask for a whole kHeads
  // merge area, which leaves no room for a second (with less, the hardware packed two on some
  // SMs and left others idle: Qwen3-8B fp16 batch 1 167 -> 155.5 tok/s). Past the SM count, the
  // merge area the group needs, so that as many blocks fit as can.
  const size_t alone = Tr::kMostSharedBytes + prefix_bytes;
  const size_t packed =
      Tr::kRingBytes + Tr::merge_bytes(std::min(g.group, Tr::kHeads)) + prefix_bytes;
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  int grid = r.decode_grid;
  if (grid <= 0) {
    KUIPER_ASSIGN_OR_RETURN(const int64_t resident,
                            (resident_blocks<flash2_decode_tc<T, D, kKeyRows>>(Tr::kThreads, packed)));
    grid = decode_default_grid(units, sms, resident);
  }
  const size_t shared = decode_block_alone(grid, sms) ? alone : packed;
  if (fused && (!paged || !decode_block_alone(grid, sms))) {
    return Status::Error("attention " + describe(r) + ": the input is prepared in the kernel "
                         "only where its blocks keep an SM each (flash2_decode_fuses_input)");
  }
  DecodeInput in{};
  if (fused) {
    const AttentionInput& x = a.input;
    in.qkv = x.qkv.raw();
    in.q_norm = x.q_norm != nullptr ? x.q_norm->raw() : nullptr;
    in.k_norm = x.k_norm != nullptr ? x.k_norm->raw() : nullptr;
    in.q_norm_dtype = x.q_norm != nullptr ? x.q_norm->dtype() : DataType::kFp32;
    in.k_norm_dtype = x.k_norm != nullptr ? x.k_norm->dtype() : DataType::kFp32;
    in.eps = static_cast<float>(x.eps);
    in.positions = x.positions.data<int32_t>();
    in.rope_positions = x.rope_positions.data<int32_t>();
    in.k_cache = const_cast<void*>(a.k_cache.raw());
    in.v_cache = const_cast<void*>(a.v_cache.raw());
    in.table = kuiper::cuda::make_rope_table(x.rope, D, D / 2);
  }
  grid = decode_blocks(static_cast<int64_t>(g.kv_heads) * head_groups * keys,
                       std::min(grid, kMaxDecodeSplits), units);
  // Whole units a block where they fill the grid (decode_unit_run; the device may still split
  // the keys evenly where the lengths are uneven): the grid is then the blocks that hold them.
  const int unit_run = decode_unit_run(units, grid);
  if (unit_run > 0) grid = (units + unit_run - 1) / unit_run;
  KUIPER_ASSIGN_OR_RETURN(const bool clusters, cluster_launch());
  const int cluster = clusters ? decode_cluster_blocks(grid, units) : 1;
  KUIPER_LOG_TUNING("attention " + describe(r) + ": " + std::to_string(grid) + " blocks over " +
                    std::to_string(units) + " (sequence, kv head, head group) units" +
                    (cluster > 1 ? " in clusters of " + std::to_string(cluster) : "") +
                    (unit_run > 0 ? ", " + std::to_string(unit_run) + " whole a block" : "") + ", " +
                    std::to_string(g.key_capacity) + " keys a sequence at most");
  // Two partial slots a block (its first and last segment) of kHeads rows each.
  const size_t slots = static_cast<size_t>(grid) * 2 * Tr::kHeads;
  KUIPER_ASSIGN_OR_RETURN(float* o_part, buffers.partials.floats(slots * D));
  KUIPER_ASSIGN_OR_RETURN(float* ml, buffers.stats.floats(slots * 2));
  KUIPER_ASSIGN_OR_RETURN(int* arrivals, arrival_counters(buffers, units));
  // PDL: what the kernel may read before its wait is in the kernel.
  return cuda::launch_in_clusters(flash2_decode_tc<T, D, kKeyRows>, dim3(grid), dim3(Tr::kThreads), shared,
                                  r.pdl, cluster, "flash2_decode_tc", a.q.data<T>(),
                                  a.k_cache.data<T>(), a.v_cache.data<T>(), o_part,
                                  reinterpret_cast<float2*>(ml), arrivals, a.out.data<T>(), g,
                                  head_groups, cluster, unit_run, in);
}

}  // namespace

Result<bool> flash2_decode_fuses_input(const Geometry& g, const AttentionRequest& r) {
  if (g.starts == nullptr || r.dtype == DataType::kFp32) return false;
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  const int units = g.kv_heads * ((g.group + DecodeTcTraits<128>::kHeads - 1) /
                                  DecodeTcTraits<128>::kHeads) * g.batch;
  // launch_decode_tc's grid: the request's, or decode_default_grid's, within the SMs exactly
  // when the units are.
  return r.decode_grid > 0 ? decode_block_alone(r.decode_grid, sms) : units <= sms;
}

Status launch_flash2_decode(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                            AttentionBuffers& buffers) {
  return by_element_type(
      r,
      [&](auto tt, auto dt) {
        // GQA groups of up to 8 heads take the keys-as-rows product (mma_kq), larger ones the
        // heads as the mma's 16 rows.
        using T = typename decltype(tt)::type;
        constexpr int D = decltype(dt)::value;
        if (g.group <= 8) return launch_decode_tc<T, D, true>(a, g, r, buffers);
        return launch_decode_tc<T, D, false>(a, g, r, buffers);
      },
      [&](auto dt) { return launch_decode_split<float, decltype(dt)::value>(a, g, r, buffers); });
}
}  // namespace kuiper::op::cuda_attention
