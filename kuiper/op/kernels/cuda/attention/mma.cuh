// Tensor-core building blocks of the 16-bit (fp16, bf16) attention kernels (flash1, flash2
// prefill and decode): swizzled shared tiles filled by cp.async, ldmatrix fragments and mma.sync
// m16n8k16 (16-bit in, fp32 accumulate) for S = Q K^T and O += P V (and, for the decode's small
// GQA groups, their transposes S^T = K Q^T and O^T += V^T P^T). Every helper is a template
// on the element type T; what differs between the types is only in TensorCore<T>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kuiper/op/kernels/cuda/attention/common.cuh"
#include "kuiper/op/kernels/cuda/tensor_core.cuh"

namespace kuiper::op::cuda_attention {

using kuiper::cuda::TensorCore;

// The bytes of one element of a tensor-core tile (fp16 and bf16 alike): the traits size shared
// memory with it.
constexpr int kTcElemBytes = 2;


// Rows are D 16-bit elements; 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so the 8
// rows an ldmatrix reads (same logical chunk) fall in 8 different bank groups.
template <int D, typename T>
__device__ __forceinline__ uint32_t swizzled(const T* tile, int row, int chunk) {
  static_assert(sizeof(T) == kTcElemBytes, "tensor-core tiles hold 16-bit elements");
  static_assert(D / 8 >= 8, "the swizzle permutes 8 chunks");
  return static_cast<uint32_t>(
      __cvta_generic_to_shared(tile + row * D + ((chunk ^ (row & 7)) * 8)));
}

using kuiper::cuda::cp_async16;  // primitives.cuh
using kuiper::cuda::cp_async_commit;
using kuiper::cuda::cp_async_wait;

// Where a thread's rows of a K/V tile live in the cache: the thread copies chunk threadIdx.x %
// (D / 8) of rows threadIdx.x / (D / 8), then every kThreads / (D / 8) rows on. look_up() reads
// the block table and copy() issues the cp.asyncs, so a kernel can look a tile's rows up one
// tile ahead of its copy: the table loads' latency is then off the copy's path. look_up() keeps
// the raw table entries (their first use is in copy(), not at the load); rows at or past key_end
// are zero-filled by copy() and their table entries never read, as cache rows past the context
// may hold anything, NaN included.
template <int D, int kRows, int kThreads>
struct KvTileRows {
  static constexpr int kChunks = D / 8;
  static_assert(kThreads % kChunks == 0, "a thread keeps one chunk column");
  static constexpr int kStep = kThreads / kChunks;  // rows between a thread's copies
  static constexpr int kPerThread = (kRows + kStep - 1) / kStep;
  // Every row a thread takes lies in the tile (no bounds check a row), and rows kStep apart
  // share their swizzle (row % 8): a thread's shared addresses are its first row's plus
  // constants. Both hold at D = 64 and 128 with 128 threads. Nsight Compute had put 48% of the
  // paged decode's instructions in this copy and its look-up, about 36 a 16-byte row (64
  // sequences, H200); figures in issue 13's section of docs/PERFORMANCE.md.
  static constexpr bool kWhole = kRows % kStep == 0;
  static constexpr bool kSameSwizzle = kStep % 8 == 0;
  const int* table;
  int block_size, last_block;
  int entry[kPerThread];   // the block table's entry of each row (paged), unclamped
  int offset[kPerThread];  // the row within its block (paged) or the cache row; -1: past key_end

  // Rows of positions key0 on of one sequence (of `keys`), up to key_end.
  __device__ __forceinline__ void look_up(const KeyRows& keys, int key0, int key_end) {
    table = keys.table;
    block_size = keys.block_size;
    last_block = keys.last_block;
    const int r0 = threadIdx.x / kChunks;
    if (table == nullptr) {  // contiguous: the position is the row
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int r = r0 + j * kStep;
        entry[j] = 0;
        offset[j] = (kWhole || r < kRows) && key0 + r < key_end ? key0 + r : -1;
      }
      return;
    }
    KeyRows::Walk rows = keys.walk(key0 + r0);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = r0 + j * kStep;
      const bool valid = (kWhole || r < kRows) && key0 + r < key_end;
      entry[j] = valid ? rows.table[rows.slot] : 0;
      offset[j] = valid ? rows.offset : -1;
      if (j + 1 < kPerThread) rows.advance(kStep);
    }
  }
  // Copies the rows into swizzled shared K and V tiles of kv head `kvh` (not committed).
  template <typename T>
  __device__ __forceinline__ void copy(const T* k, const T* v, int kv_heads, int kvh, T* k_tile,
                                       T* v_tile) const {
    const int ch = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
    // The thread's chunk of cache row 0 of kv head kvh; a cache row is kv_heads * D elements.
    const char* k0 = reinterpret_cast<const char*>(k + static_cast<size_t>(kvh) * D + ch * 8);
    const char* v0 = reinterpret_cast<const char*>(v + static_cast<size_t>(kvh) * D + ch * 8);
    const uint32_t row_bytes = static_cast<uint32_t>(kv_heads) * D * sizeof(T);
    const uint32_t k_first = swizzled<D>(k_tile, r0, ch), v_first = swizzled<D>(v_tile, r0, ch);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = r0 + j * kStep;
      if (!kWhole && r >= kRows) break;
      const bool valid = offset[j] >= 0;
      const int row =
          table == nullptr ? offset[j] : min(max(entry[j], 0), last_block) * block_size + offset[j];
      // A row past key_end copies nothing (zero-fill) from row 0, which exists.
      const uint64_t at = static_cast<uint64_t>(static_cast<uint32_t>(valid ? row : 0)) * row_bytes;
      const uint32_t step_bytes = static_cast<uint32_t>(j * kStep * D * sizeof(T));
      cp_async16(kSameSwizzle ? k_first + step_bytes : swizzled<D>(k_tile, r, ch), k0 + at, valid);
      cp_async16(kSameSwizzle ? v_first + step_bytes : swizzled<D>(v_tile, r, ch), v0 + at, valid);
    }
  }
};

// Copies rows [0, kRows) of a K tile and the V tile of the same keys, positions key0 on of kv
// head `kvh` (stored where `keys` says), into swizzled shared tiles by cp.async (not committed);
// one address computation serves both. Rows at or past `key_end` are zero-filled and never read.
template <int D, int kRows, int kThreads, typename T>
__device__ __forceinline__ void cp_async_kv_tiles(const T* k, const T* v, const KeyRows& keys,
                                                  int kv_heads, int kvh, int key0, int key_end,
                                                  T* k_tile, T* v_tile) {
  KvTileRows<D, kRows, kThreads> rows;
  rows.look_up(keys, key0, key_end);
  rows.copy(k, v, kv_heads, kvh, k_tile, v_tile);
}

// Four 8x8 b16 matrices from shared memory into the mma fragment layout; kTrans transposes each
// (V tiles are stored key-major, the P V product wants them dimension-major).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
}

// c0 += a * (b0, b1), c1 += a * (b2, b3) for the four 8x8 matrices b of shared address addr: two
// adjacent 8-column fragments of one product.
template <typename T, bool kTrans>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                         uint32_t addr) {
  uint32_t b[4];
  ldmatrix_x4<kTrans>(b, addr);
  TensorCore<T>::mma(c0, a, b[0], b[1]);
  TensorCore<T>::mma(c1, a, b[2], b[3]);
}

// Copies the query rows [r0, r0 + kRows) of kv head `kvh` into a swizzled shared tile by
// cp.async (not committed), row r being query r / group of head kvh * group + r % group; rows
// past the last query are zero-filled.
template <int D, int kRows, int kThreads, typename T>
__device__ __forceinline__ void cp_async_q_tile(const T* q, const Geometry& g, int kvh, int r0,
                                                int total_rows, T* tile) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks, row = r0 + r;
    const bool valid = row < total_rows;
    const T* src = q;
    if (valid) {
      const int t = row / g.group, h = kvh * g.group + row % g.group;
      src = q + (static_cast<size_t>(t) * g.heads + h) * D + ch * 8;
    }
    cp_async16(swizzled<D>(tile, r, ch), src, valid);
  }
}

// This warp's 16 query rows of a swizzled Q tile as the A fragments of mma_qk.
template <int D, typename T>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[D / 16][4], const T* tile) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    ldmatrix_x4(qf[kk], swizzled<D>(tile, warp * 16 + lane % 16, kk * 2 + lane / 16));
  }
}

// S[16 rows][kKeys] += Q K^T for one warp: `qf` holds the warp's 16 query rows as A fragments
// (D / 16 of them), `kt` a swizzled K tile whose rows key_row0 .. key_row0 + kKeys - 1 are used.
// s[j] is the accumulator of keys 8j .. 8j + 7: row lane / 4 in [0], [1], row lane / 4 + 8 in
// [2], [3], keys (lane % 4) * 2 and + 1.
template <int D, int kKeys, typename T>
__device__ __forceinline__ void mma_qk(float (&s)[kKeys / 8][4], const uint32_t (&qf)[D / 16][4],
                                       const T* kt, int key_row0) {
  const int lane = threadIdx.x % 32;
  const int row = key_row0 + lane % 8 + (lane / 16) * 8, chunk = (lane / 8) % 2;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      mma_pair<T, false>(s[2 * np], s[2 * np + 1], qf[kk],
                      swizzled<D>(kt, row + np * 16, kk * 2 + chunk));
    }
  }
}

// o[16 rows][D] += P V for one warp: P is the S accumulator of mma_qk (already exponentiated),
// whose layout is exactly the A fragment of this product, so P never touches shared memory.
template <int D, int kKeys, typename T>
__device__ __forceinline__ void mma_pv(float (&o)[D / 8][4], const float (&p)[kKeys / 8][4],
                                       const T* vt, int key_row0) {
  using Tc = TensorCore<T>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {Tc::pack(p[2 * kk][0], p[2 * kk][1]),
                           Tc::pack(p[2 * kk][2], p[2 * kk][3]),
                           Tc::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           Tc::pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      mma_pair<T, true>(o[2 * np], o[2 * np + 1], a,
                     swizzled<D>(vt, key_row0 + kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                 np * 2 + lane / 16));
    }
  }
}

// The decode's products with the keys as the mma rows (flash2_decode.cu, for GQA groups of up to
// 8 heads, which fill only 8 of the 16 rows the query-rows form gives them): S^T[16 keys][8
// heads] = K Q^T, then O^T[D][8 heads] += V^T P^T. Half the mma a tile of the query-rows form,
// and half its accumulator. qb holds the heads' q as B fragments: qb[kk][0] the dimensions
// kk * 16 + (lane % 4) * 2 and + 1 of head lane / 4, qb[kk][1] the same + 8. st: key lane / 4 in
// [0] and [1], key lane / 4 + 8 in [2] and [3], heads (lane % 4) * 2 and + 1.
template <int D, typename T>
__device__ __forceinline__ void mma_kq(float (&st)[4], const uint32_t (&qb)[D / 16][2],
                                       const T* kt, int key_row0) {
  const int lane = threadIdx.x % 32;
  const int row = key_row0 + lane % 8 + ((lane / 8) % 2) * 8, chunk = lane / 16;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, swizzled<D>(kt, row, kk * 2 + chunk));
    TensorCore<T>::mma(st, a, qb[kk][0], qb[kk][1]);
  }
}

// An 8x8 matrix of 16-bit elements in the mma fragment layout (row lane / 4, columns (lane % 4)
// * 2 and + 1 in the low and high halves), transposed across the warp.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// o[m] += V^T P^T for one warp: o[m][0] and [1] are dimension m * 16 + lane / 4 of heads
// (lane % 4) * 2 and + 1, [2] and [3] the dimension + 8. p is mma_kq's accumulator, already
// exponentiated: each 8-key half, transposed, is the B fragment of this product.
template <int D, typename T>
__device__ __forceinline__ void mma_vp(float (&o)[D / 16][4], const float (&p)[4], const T* vt,
                                       int key_row0) {
  using Tc = TensorCore<T>;
  const int lane = threadIdx.x % 32;
  const uint32_t b0 = movmatrix_trans(Tc::pack(p[0], p[1]));
  const uint32_t b1 = movmatrix_trans(Tc::pack(p[2], p[3]));
  const int row = key_row0 + lane % 8 + (lane / 16) * 8, chunk = (lane / 8) % 2;
#pragma unroll
  for (int m = 0; m < D / 16; ++m) {
    uint32_t a[4];
    ldmatrix_x4<true>(a, swizzled<D>(vt, row, m * 2 + chunk));
    Tc::mma(o[m], a, b0, b1);
  }
}

}  // namespace kuiper::op::cuda_attention
