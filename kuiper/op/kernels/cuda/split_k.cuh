// Split-K for the multi-row tensor-core GEMV (gemv_rows_mma.cuh): S blocks share a 16-row tile,
// each over its own 1 / S of K, and the block whose partial sums come last adds all S up and
// runs the epilogue.
//
// Why: a block stages its columns of x for all the rows in shared memory beside its ring of
// weights, and 8 rows of a long row do not fit (Qwen3-8B's down_proj, K = 12288: 196 KB of x
// beside the 96 KB ring), which left that product to cuBLAS at 8 sequences. Split in two, each
// block stages half.
//
// Each block leaves its partials of every tile it takes as it goes (no fence there: a fence
// waits for every load the warp has in flight, the ring of weights ahead of the mma), and counts
// them in once its loads are done, one fence a warp. The sum of a tile does not depend on the
// order blocks finish: the last adds the S partials in split order. The counters go back to 0
// once a tile is done, so every launch, captured in a CUDA graph or not, finds them at 0.
//
// Tried on the quantized tensor-core GEMV (gemv_mma.cuh), where staging a long row of x was
// measured at a quarter of down_proj's time, and dropped: no product got faster by more than a
// few percent at any S, and most got slower (docs/PERFORMANCE.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kuiper/base/status.h"

namespace kuiper::cuda {

constexpr int kSplitKColumns = 128;     // a split holds whole 128-column pieces of K
constexpr int kSplitKMaxSplits = 16;
constexpr int64_t kSplitKMaxItems = 8192;  // tiles x splits the workspace holds

// One launch's split of K, passed to the kernel by value.
struct SplitK {
  int splits = 1;                 // S: blocks sharing a tile
  int pieces = 0;                 // K / kSplitKColumns
  float4* partials = nullptr;     // [tile][split][lane]: the epilogue warp's C fragments
  unsigned* arrived = nullptr;    // [tile]: splits done with the tile; 0 between launches

  // Split sp's columns, [begin(sp), begin(sp + 1)) in pieces.
  __host__ __device__ int begin(int sp) const { return sp * pieces / splits; }
  // The most columns one split holds.
  __host__ __device__ int64_t max_columns() const {
    return int64_t{(pieces + splits - 1) / splits} * kSplitKColumns;
  }
};

// The epilogue warp of split sp leaves its C fragment v of `tile` in the workspace. No fence
// here: a fence waits for every load the warp has in flight, which in the GEMVs' main loop is
// the ring of weights ahead of the mma (measured: twice the time of the kernel at 2 splits).
// Call with all 32 lanes.
__device__ __forceinline__ void split_k_leave(const SplitK& s, int tile, int sp, int lane,
                                              const float (&v)[4]) {
  float4* const at = s.partials + (static_cast<int64_t>(tile) * s.splits + sp) * 32 + lane;
  __stcg(at, make_float4(v[0], v[1], v[2], v[3]));
}

// After the warp's last split_k_leave and one __threadfence (so that its partials are visible
// before its counts): counts the warp's split of `tile` in and returns true in the warp whose
// split came last, with v then the sum of the S partials in split order. Call with all 32
// lanes.
__device__ __forceinline__ bool split_k_last(const SplitK& s, int tile, int lane, float (&v)[4]) {
  unsigned before = 0;
  if (lane == 0) before = atomicAdd(s.arrived + tile, 1u);
  before = __shfl_sync(0xffffffffu, before, 0);
  if (before != static_cast<unsigned>(s.splits - 1)) return false;
  __threadfence();
  const float4* const base = s.partials + static_cast<int64_t>(tile) * s.splits * 32 + lane;
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Unrolled: every partial's load in flight at once, added in split order.
#pragma unroll
  for (int i = 0; i < kSplitKMaxSplits; ++i) {
    if (i < s.splits) {
      const float4 p = __ldcg(base + i * 32);
      sum[0] += p.x;
      sum[1] += p.y;
      sum[2] += p.z;
      sum[3] += p.w;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = sum[i];
  if (lane == 0) s.arrived[tile] = 0;  // for the next launch
  return true;
}

// The device's workspace (partials and zeroed counters), made on first use.
Result<SplitK> split_k_workspace(int splits, int64_t K);

}  // namespace kuiper::cuda
