// Pieces shared by the CUDA attention kernels (mha, flash1, flash2): the problem geometry every
// kernel receives, element traits for fp32/fp16/bf16 (arithmetic is always fp32), vector loads and
// tile staging, and the host-side argument checks and (dtype, head_dim) instantiation switch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kuiper/base/cuda_runtime.h"
#include "kuiper/op/attention.h"
#include "kuiper/op/kernels/cuda/primitives.cuh"

namespace kuiper::op::cuda_attention {

using cuda::allow_shared_memory;
using cuda::block_reduce;
using cuda::group_max;
using cuda::group_sum;
using cuda::resident_blocks;
using cuda::cluster_launch;
using cuda::sm_count;
using cuda::TypeTag;

// Everything a kernel needs besides the data pointers. Scores are kept in the log2 domain
// (q is pre-multiplied by scale * log2(e)) so that each exponential is a single ex2 instruction.
//
// A call serves `batch` sequences (attention.h's PagedBatch); the contiguous form is the batch of
// one whose keys sit in cache rows 0, 1, ... (no block table). Sequence i's view (its queries,
// first position and key rows) comes from sequence(g, i); a grid's blockIdx.z names the sequence
// (times `splits` for split-KV decode), and every launch is sized for max_queries queries and
// key_capacity keys per sequence, values known on the host, never read from the device.
struct Geometry {
  int T;         // query rows of q, every sequence's
  int heads;     // query heads
  int kv_heads;  // key/value heads
  int group;     // heads / kv_heads: query heads sharing one kv head
  int max_ctx;   // rows of the KV cache (of the whole pool when paged)
  int start;     // contiguous form: position of query 0 (host-known)
  // Contiguous device-position decode: the position of the single query is read here instead of
  // `start`, so a captured graph replays correctly at every step.
  const int* device_position;
  float scale_log2;
  int batch;         // sequences
  int max_queries;   // most queries of one sequence: the grids' row extent
  int key_capacity;  // most keys of one sequence the launch (grids, scratch) is sized for
  // Blocks per sequence along grid z (z = sequence * splits + j): split-KV decode's splits of
  // the keys, mha's queries of a pass; 1 elsewhere.
  int splits;
  // Paged (null in the contiguous form): query_begin [batch + 1] (null: sequence i owns rows
  // [i * max_queries, (i + 1) * max_queries), as in decode), starts [batch] and block_tables
  // [batch, table_width] of block_size-row blocks of the pool.
  const int* query_begin;
  const int* starts;
  const int* block_tables;
  int table_width;
  int block_size;
  // Paged, optional: sequences from *live on are padding (PagedBatch::live), null: none.
  const int* live;
};

// Position of query 0 of the contiguous form. A device position outside the cache is clamped
// rather than trusted: a replayed graph must never read past the cache, whatever the host wrote.
__device__ __forceinline__ int first_position(const Geometry& g) {
  if (g.device_position == nullptr) return g.start;
  return min(max(*g.device_position, 0), g.key_capacity - 1);
}

// Where a sequence's key positions live: cache row pos (no table), or row pos % block_size of
// pool block table[pos / block_size]. Table entries are clamped to the pool (callers keep pos in
// [0, table_width * block_size), so the table itself is never read past its row). One row
// lookup per loaded K/V row: the table is a few hundred bytes that stay in L1.
struct KeyRows {
  const int* table;
  int block_size;
  int last_block;  // pool blocks - 1
  __device__ __forceinline__ int row(int pos) const {
    if (table == nullptr) return pos;
    const int slot = pos / block_size;
    const int block = min(max(table[slot], 0), last_block);
    return block * block_size + (pos - slot * block_size);
  }
  // Positions pos, pos + step, pos + 2 * step, ... as (table slot, row in the block): one
  // division for the whole walk instead of one a row (a 64-key tile takes 8 rows a thread);
  // KvTileRows (mma.cuh) turns them into cache rows.
  struct Walk {
    const int* table;
    int block_size, last_block, slot, offset;  // contiguous: slot 0, offset = pos
    __device__ __forceinline__ void advance(int step) {
      offset += step;
      if (table == nullptr) return;
      if (offset >= block_size) {  // once, where block_size >= step (blocks of 16 rows, step 8)
        offset -= block_size;
        ++slot;
        while (offset >= block_size) {
          offset -= block_size;
          ++slot;
        }
      }
    }
  };
  __device__ __forceinline__ Walk walk(int pos) const {
    const int slot = table == nullptr ? 0 : pos / block_size;
    return {table, block_size, last_block, slot, pos - slot * block_size};
  }
};

// Sequence i's key rows: through its row of the block tables, or the identity (contiguous).
__device__ __forceinline__ KeyRows key_rows(const Geometry& g, int i) {
  KeyRows k;
  k.table = g.block_tables == nullptr
                ? nullptr
                : g.block_tables + static_cast<size_t>(i) * g.table_width;
  k.block_size = g.block_size;
  k.last_block = g.max_ctx / g.block_size - 1;
  return k;
}

// One sequence of the batch: its T queries are rows [q0, q0 + T) of q and out, at positions
// [pos0, pos0 + T); query t sees positions [0, pos0 + t], stored where `keys` says.
struct Sequence {
  int T, q0, pos0;
  KeyRows keys;
};

// Sequence i's view. What is read from the device is clamped so that no kernel reads outside q,
// the table or the pool, and no sequence exceeds the launch's max_queries / key_capacity: rows
// to within [0, g.T), T to max_queries, positions so that pos0 + T <= key_capacity. The metadata
// are read through L2: a kernel started early (PDL) must not see stale L1 lines.
__device__ __forceinline__ Sequence sequence(const Geometry& g, int i) {
  Sequence s;
  if (g.query_begin != nullptr) {
    const int b = min(max(__ldcg(g.query_begin + i), 0), g.T);
    const int e = min(max(__ldcg(g.query_begin + i + 1), b), g.T);
    s.q0 = b;
    s.T = min(e - b, g.max_queries);
  } else {
    s.q0 = i * g.max_queries;
    s.T = g.max_queries;
  }
  s.T = min(s.T, g.key_capacity);
  if (g.starts != nullptr) {
    s.pos0 = min(max(__ldcg(g.starts + i), 0), g.key_capacity - s.T);
  } else {
    s.pos0 = first_position(g);
  }
  s.keys = key_rows(g, i);
  return s;
}

// The block of a prefill-style grid (blockIdx.x: row tile, blockIdx.y: kv head, blockIdx.z:
// sequence, times g.splits): its rows [r0, r0 + kRows) of the kv head's total_rows (query,
// head) rows of its sequence, the position of the sequence's query 0, and kv_end, the keys its
// last row sees. Row tiles are taken from the end: later ones see more keys, and launching them
// first evens out the tail of the grid. A sequence with fewer queries than the grid's
// max_queries leaves tiles empty(): they exit at once.
struct RowTile {
  int kvh, total_rows, r0, pos0, kv_end;
  Sequence seq;
  __device__ __forceinline__ bool empty() const { return r0 >= total_rows; }
};
template <int kRows>
__device__ __forceinline__ RowTile row_tile(const Geometry& g) {
  RowTile t;
  t.seq = sequence(g, static_cast<int>(blockIdx.z) / g.splits);
  t.kvh = blockIdx.y;
  t.total_rows = t.seq.T * g.group;
  t.r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  t.pos0 = t.seq.pos0;
  t.kv_end = t.pos0 + (min(t.r0 + kRows, t.total_rows) - 1) / g.group + 1;
  return t;
}

// Rows of q or out from query row q0 on: kernels index their sequence's queries from 0.
template <int D, typename T>
__device__ __forceinline__ T* query_rows(T* p, const Geometry& g, int q0) {
  return p + static_cast<size_t>(q0) * g.heads * D;
}

// ex2.approx with flush-to-zero: relative error 2^-22, far below fp32 test tolerances, one
// instruction instead of exp2f's range handling. -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Flash-style kernels flush exponentials below 2^-kNegligibleLog2 of the running maximum to
// zero. The maximum itself contributes 1 to the softmax denominator, so even 128k flushed terms
// move the result by at most 2^17 * 2^-32 = 3e-5 relative, under fp16 output rounding; in
// exchange no denormal ever enters the PV accumulation.
constexpr float kNegligibleLog2 = 32.0f;
__device__ __forceinline__ float exp2_ftz(float x) {
  return x < -kNegligibleLog2 ? 0.0f : fast_exp2(x);
}

// How a storage type packs into 32-bit words; every load goes through whole words.
template <typename T>
struct Word;
template <>
struct Word<float> {
  static constexpr int kElems = 1;
  __device__ static void unpack(uint32_t w, float* out) { out[0] = __uint_as_float(w); }
  __device__ static uint32_t pack(const float* in) { return __float_as_uint(in[0]); }
};
template <>
struct Word<half> {
  static constexpr int kElems = 2;
  __device__ static void unpack(uint32_t w, float* out) {
    __half2_raw raw;
    raw.x = static_cast<unsigned short>(w & 0xffffu);
    raw.y = static_cast<unsigned short>(w >> 16);
    float2 f = __half22float2(__half2(raw));
    out[0] = f.x;
    out[1] = f.y;
  }
  __device__ static uint32_t pack(const float* in) {
    __half2_raw raw = __half2(__floats2half2_rn(in[0], in[1]));
    return static_cast<uint32_t>(raw.x) | (static_cast<uint32_t>(raw.y) << 16);
  }
};
template <>
struct Word<__nv_bfloat16> {
  static constexpr int kElems = 2;
  // A bf16 is the upper half of an fp32: widening is a shift or a mask.
  __device__ static void unpack(uint32_t w, float* out) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ static uint32_t pack(const float* in) {
    __nv_bfloat162_raw raw = __nv_bfloat162(__floats2bfloat162_rn(in[0], in[1]));
    return static_cast<uint32_t>(raw.x) | (static_cast<uint32_t>(raw.y) << 16);
  }
};

// Loads N consecutive elements as fp32 using the widest aligned accesses (16, 8 or 4 bytes).
// `src` must be aligned to the access width, which holds for every row/lane offset used here.
template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* src, float* dst) {
  constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords * 4 == N * static_cast<int>(sizeof(T)), "whole words only");
  uint32_t w[kWords];
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 4; ++c) {
      uint4 v = reinterpret_cast<const uint4*>(src)[c];
      w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 2; ++c) {
      uint2 v = reinterpret_cast<const uint2*>(src)[c];
      w[2 * c] = v.x, w[2 * c + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kWords; ++c) w[c] = reinterpret_cast<const uint32_t*>(src)[c];
  }
#pragma unroll
  for (int c = 0; c < kWords; ++c) Word<T>::unpack(w[c], dst + c * Word<T>::kElems);
}

// Stages the query rows [r0, r0 + kRows) of kv head `kvh` into shared memory (row stride
// `stride` floats), pre-scaled into the log2 domain. Row r of a kv head's tile is query
// r / group of head kvh * group + r % group, so a tile holds every query head that shares the
// head's keys; rows past the last query are zeros and never stored.
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void stage_q_tile(const T* __restrict__ q, const Geometry& g, int kvh,
                                             int r0, int total_rows, float* qs, int stride) {
  for (int c = threadIdx.x; c < kRows * (D / 8); c += kThreads) {
    const int r = c / (D / 8), d = (c % (D / 8)) * 8;
    const int row = r0 + r;
    float x[8] = {};
    if (row < total_rows) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      load_vec<T, 8>(q + (static_cast<size_t>(t) * g.heads + h) * D + d, x);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) qs[r * stride + d + i] = x[i] * g.scale_log2;
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* dst, const float* src) {
  constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords * 4 == N * static_cast<int>(sizeof(T)), "whole words only");
  uint32_t w[kWords];
#pragma unroll
  for (int c = 0; c < kWords; ++c) w[c] = Word<T>::pack(src + c * Word<T>::kElems);
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 4; ++c) {
      reinterpret_cast<uint4*>(dst)[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int c = 0; c < kWords / 2; ++c) reinterpret_cast<uint2*>(dst)[c] = make_uint2(w[2 * c], w[2 * c + 1]);
  } else {
#pragma unroll
    for (int c = 0; c < kWords; ++c) reinterpret_cast<uint32_t*>(dst)[c] = w[c];
  }
}

// Copies positions [row0, row0 + kRows) of one kv head of a cache (stored where `keys` says)
// into a shared fp32 tile with row stride kStride floats; positions at or past `valid_end`
// become zeros, never reads of the cache beyond the valid prefix (those rows may hold anything,
// NaN included, and 0 * NaN is NaN).
template <typename T, int D, int kRows, int kStride, int kThreads>
__device__ __forceinline__ void load_kv_tile(const T* cache, const KeyRows& keys, int kv_heads,
                                             int kvh, int row0, int valid_end, float* tile) {
  constexpr int kChunksPerRow = D / 8;
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, d = (c % kChunksPerRow) * 8;
    float v[8];
    if (row0 + r < valid_end) {
      load_vec<T, 8>(cache + (static_cast<size_t>(keys.row(row0 + r)) * kv_heads + kvh) * D + d,
                     v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    float4* dst = reinterpret_cast<float4*>(tile + r * kStride + d);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// ---- host side ----

inline const char* phase_name(AttentionPhase p) {
  return p == AttentionPhase::kPrefill ? "prefill" : "decode";
}

// "flash2 decode fp16 head_dim 128 device-position": how errors name a combination.
inline std::string describe(const AttentionRequest& r) {
  return std::string(attention_name(r.kind)) + " " + phase_name(r.phase) + " " +
         dtype_name(r.dtype) + " head_dim " + std::to_string(r.head_dim) +
         (r.device_position ? " device-position" : "");
}

// The paged form's metadata and bounds (attention.h's PagedBatch), beyond check_attention_args:
// the kernels clamp what they read, so these checks are about shapes and host values only.
inline Status check_paged_call(const AttentionArgs& a, const AttentionRequest& r,
                               const std::string& who) {
  const PagedBatch& p = a.paged;
  auto is_int32_on_gpu = [](const Tensor& t, int ndim) {
    return t.defined() && t.dtype() == DataType::kInt32 && t.device() == DeviceType::kCuda &&
           t.ndim() == ndim;
  };
  if (!is_int32_on_gpu(p.query_begin, 1) || !is_int32_on_gpu(p.starts, 1) ||
      !is_int32_on_gpu(p.block_tables, 2)) {
    return Status::Error(who + "paged: query_begin, starts and block_tables must be int32 [B + 1], "
                               "[B] and [B, W] tensors on the cuda device");
  }
  const int64_t B = p.sequences();
  if (B < 1 || p.starts.numel() != B || p.block_tables.dim(0) != B ||
      p.block_tables.dim(1) < 1) {
    return Status::Error(who + "paged: query_begin " + p.query_begin.describe() + ", starts " +
                         p.starts.describe() + ", block_tables " + p.block_tables.describe() +
                         " do not describe one batch of B >= 1 sequences");
  }
  if (B > 65535) return Status::Error(who + "paged: more than 65535 sequences");
  if (p.block_size < 1 || a.k_cache.dim(0) % p.block_size != 0 ||
      a.k_cache.dim(0) < p.block_size) {
    return Status::Error(who + "paged: block_size " + std::to_string(p.block_size) +
                         " must be >= 1 and divide the pool's " +
                         std::to_string(a.k_cache.dim(0)) + " rows");
  }
  const int64_t capacity = p.block_tables.dim(1) * p.block_size;
  if (capacity > (int64_t{1} << 30)) {
    return Status::Error(who + "paged: block tables of more than 2^30 keys are not supported");
  }
  if (r.phase == AttentionPhase::kDecode) {
    if (a.q.dim(0) != B) {
      return Status::Error(who + "paged decode takes one query per sequence: q " +
                           a.q.describe() + " for " + std::to_string(B) + " sequences");
    }
  } else if (p.max_queries < 1 || p.max_queries > a.q.dim(0)) {
    return Status::Error(who + "paged: max_queries " + std::to_string(p.max_queries) +
                         " must be in [1, q rows " + std::to_string(a.q.dim(0)) + "]");
  }
  if (!r.device_position && (p.max_keys < 1 || p.max_keys > capacity)) {
    return Status::Error(who + "paged: max_keys " + std::to_string(p.max_keys) +
                         " must be in [1, W * block_size = " + std::to_string(capacity) + "]");
  }
  return Status::Ok();
}

// What every CUDA op checks on each call beyond check_attention_args: the call matches the
// request the op was made for, and everything lives on the GPU.
inline Status check_cuda_call(const AttentionArgs& a, const AttentionRequest& r) {
  KUIPER_RETURN_IF_ERROR(check_attention_args(a));
  const std::string who = "attention " + describe(r) + ": ";
  if (a.q.device() != DeviceType::kCuda || a.k_cache.device() != DeviceType::kCuda ||
      a.v_cache.device() != DeviceType::kCuda || a.out.device() != DeviceType::kCuda) {
    return Status::Error(who + "q, caches and out must be on the cuda device");
  }
  if (a.q.dtype() != r.dtype) return Status::Error(who + "got " + a.q.describe());
  if (a.q.dim(2) != r.head_dim) return Status::Error(who + "got " + a.q.describe());
  if (a.k_cache.dim(0) > (int64_t{1} << 30) || a.q.dim(0) > (int64_t{1} << 30)) {
    return Status::Error(who + "sizes beyond 2^30 rows are not supported");
  }
  if (a.paged.defined()) return check_paged_call(a, r, who);
  if (r.phase == AttentionPhase::kDecode && a.q.dim(0) != 1) {
    return Status::Error(who + "decode takes one query, got " + a.q.describe());
  }
  if (r.device_position) {
    const Tensor& p = a.device_position;
    if (!p.defined() || p.dtype() != DataType::kInt32 || p.numel() != 1 ||
        p.device() != DeviceType::kCuda) {
      return Status::Error(who + "needs device_position, an int32 [1] tensor on the cuda device");
    }
  }
  return Status::Ok();
}

// The call's geometry. The sizes every launch is made for come from the host only: the
// contiguous form has one sequence of T queries and start + T keys (the whole cache for a device
// position); the paged form max_queries (1 in decode) and max_keys (the tables' W * block_size
// for a device position, so that one capture serves every step).
inline Geometry make_geometry(const AttentionArgs& a, const AttentionRequest& r) {
  Geometry g;
  g.T = static_cast<int>(a.q.dim(0));
  g.heads = static_cast<int>(a.q.dim(1));
  g.kv_heads = static_cast<int>(a.k_cache.dim(1));
  g.group = g.heads / g.kv_heads;
  g.max_ctx = static_cast<int>(a.k_cache.dim(0));
  g.scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(a.q.dim(2)));
  g.splits = 1;
  const PagedBatch& p = a.paged;
  if (!p.defined()) {
    g.start = static_cast<int>(a.start);
    g.device_position = r.device_position ? a.device_position.data<int>() : nullptr;
    g.batch = 1;
    g.max_queries = g.T;
    g.key_capacity = r.device_position ? g.max_ctx : g.start + g.T;
    g.query_begin = g.starts = g.block_tables = g.live = nullptr;
    g.table_width = 0;
    g.block_size = 1;
    return g;
  }
  const bool decode = r.phase == AttentionPhase::kDecode;
  g.start = 0;
  g.device_position = nullptr;
  g.batch = static_cast<int>(p.sequences());
  g.table_width = static_cast<int>(p.block_tables.dim(1));
  g.block_size = static_cast<int>(p.block_size);
  g.max_queries = decode ? 1 : static_cast<int>(p.max_queries);
  const int64_t capacity = p.block_tables.dim(1) * p.block_size;
  g.key_capacity = static_cast<int>(r.device_position ? capacity : p.max_keys);
  // Decode has exactly one query per sequence, row i: query_begin is not needed.
  g.query_begin = decode ? nullptr : p.query_begin.data<int>();
  g.starts = p.starts.data<int>();
  g.block_tables = p.block_tables.data<int>();
  g.live = p.live.defined() ? p.live.data<int>() : nullptr;
  return g;
}

template <int D>
struct DimTag {
  static constexpr int value = D;
};

// Calls f(TypeTag<T>{}, DimTag<D>{}) for the instantiation serving (dtype, head_dim): the one
// place the supported set is spelled out, so the dispatcher's refusal and the kernels agree.
inline bool supported_dtype(DataType t) {
  return t == DataType::kFp32 || t == DataType::kFp16 || t == DataType::kBf16;
}
inline bool supported_head_dim(int64_t d) { return d == 64 || d == 128; }

template <typename F>
Status with_instantiation(DataType dtype, int64_t head_dim, F&& f) {
  auto by_dim = [&](auto type_tag) -> Status {
    if (head_dim == 64) return f(type_tag, DimTag<64>{});
    if (head_dim == 128) return f(type_tag, DimTag<128>{});
    return Status::Error("attention: no kernel for head_dim " + std::to_string(head_dim));
  };
  if (dtype == DataType::kFp32) return by_dim(TypeTag<float>{});
  if (dtype == DataType::kFp16) return by_dim(TypeTag<half>{});
  if (dtype == DataType::kBf16) return by_dim(TypeTag<__nv_bfloat16>{});
  return Status::Error(std::string("attention: no kernel for ") + dtype_name(dtype));
}

// with_instantiation split by element type, as the flash kernels are: tensor_cores(TypeTag<T>{},
// DimTag<D>{}) for the 16-bit types (fp16, bf16), simt(DimTag<D>{}) for fp32 (tensor cores would
// round fp32 operands to tf32, outside what an fp32 path promises).
template <typename TensorCores, typename Simt>
Status by_element_type(const AttentionRequest& r, TensorCores&& tensor_cores, Simt&& simt) {
  return with_instantiation(r.dtype, r.head_dim, [&](auto tt, auto dt) -> Status {
    if constexpr (std::is_same_v<typename decltype(tt)::type, float>) {
      return simt(dt);
    } else {
      return tensor_cores(tt, dt);
    }
  });
}

// A device fp32 scratch buffer owned by an op object: grown when a call needs more, so it is
// allocated on the first call (before any graph capture) and reused afterwards.
class Scratch {
 public:
  Result<float*> floats(size_t n) {
    if (n > capacity_) {
      KUIPER_ASSIGN_OR_RETURN(buffer_, Tensor::empty({static_cast<int64_t>(n)}, DataType::kFp32,
                                                     DeviceType::kCuda));
      capacity_ = n;
    }
    return buffer_.data<float>();
  }

 private:
  Tensor buffer_;
  size_t capacity_ = 0;
};

// What an op keeps on the device between calls, grown on the first call (before any graph
// capture) and reused, so every step's launches are the same.
struct AttentionBuffers {
  Scratch partials;  // split-KV partial outputs (mha: the scores)
  Scratch stats;     // split-KV partials' (m, l)
  Tensor arrivals;   // the fused decode's counters, one per (sequence, kv head, head group)
  size_t arrivals_capacity = 0;
};

}  // namespace kuiper::op::cuda_attention
