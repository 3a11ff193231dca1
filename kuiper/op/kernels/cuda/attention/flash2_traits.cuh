// The shapes of the FlashAttention-2 kernels, one traits struct per kernel (FlashAttention's
// kernel_traits.h is the model): tile sizes, threads and shared memory, with the measurements
// that chose them. The kernels are in flash2_prefill.cu and flash2_decode.cu, the launcher that
// picks the phase in flash2.cu.
#pragma once

#include <cstddef>

#include "kuiper/op/kernels/cuda/attention/common.cuh"
#include "kuiper/op/kernels/cuda/attention/mma.cuh"

namespace kuiper::op::cuda_attention {

// ---- prefill ----

// SIMT (fp32): each warp owns kRowsPerWarp rows.
template <int D>
struct PrefillTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 8;
  static constexpr int kRows = kWarps * kRowsPerWarp;
  static constexpr int kKeys = 32;           // one key per lane in the score step
  static constexpr int kPerLane = D / 32;    // output dims per lane in the P·V step
  // Lane j reads K row j as float4: a stride of D + 4 words keeps a quarter-warp's reads in
  // distinct bank quads. Q and V are read broadcast or contiguously and need no padding.
  static constexpr int kKStride = D + 4;
  static constexpr size_t kSharedBytes =
      sizeof(float) * (static_cast<size_t>(kRows) * D + kKeys * kKStride + kKeys * D +
                       kWarps * kKeys * kRowsPerWarp);
};

// Tensor cores (fp16, bf16): each warp owns 16 rows, one mma row tile.
template <int D>
struct PrefillTcTraits {
  // 8 warps (128 rows) share each KV tile: measured 200 vs 184 TFLOP/s with 4 warps at T = 8192
  // (176 vs 165 at T = 2048) on the H100, Qwen3-8B's attention shape.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;
  static constexpr int kKeys = 64;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  // Q, then two stages of K, then two of V.
  static constexpr size_t kSharedBytes =
      kTcElemBytes * (static_cast<size_t>(kRows) + 4 * kKeys) * D;
};

// ---- decode ----

// SIMT (fp32): split-KV partials over fixed chunks, then combine_splits.
constexpr int kChunk = 128;            // keys per split block
constexpr int kSplitThreads = 128;     // 4 warps, 32 keys each
constexpr int kMaxGroupPerBlock = 8;   // query heads of one kv head handled by one block

template <typename T, int D>
struct DecodeTraits {
  static constexpr int kElems = 8;                  // one row slice per lane: a 16 B fp16 load
  static constexpr int kLanesPerKey = D / kElems;   // lanes that together hold one K/V row
  static constexpr int kKeysPerStep = 32 / kLanesPerKey;
  static constexpr int kSteps = 32 / kKeysPerStep;  // steps to cover a warp's 32 keys
  static constexpr int kWords = kElems * static_cast<int>(sizeof(T)) / 16;  // uint4 per slice
  // Row slices a lane keeps in flight: all of its warp's keys for fp16 (64 registers), half for
  // fp32. Issuing every load before the first use turns the block's life into about two memory
  // latencies (K, then V, which is prefetched while the softmax runs) instead of one per batch.
  static constexpr int kBatch = sizeof(T) == 2 ? kSteps : kSteps / 2;
};

// Tensor cores (fp16, bf16): the balanced partition of decode_partition.h, the combine fused.
// Most blocks of a decode grid (each holds a partial slot per head it touches).
constexpr int kMaxDecodeSplits = 512;

template <int D>
struct DecodeTcTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHeads = 16;  // mma rows: query heads per block
  static constexpr int kKeys = kWarps * 16;
  // Ring depth: measured on the H100 (32 q / 8 kv heads, d 128, graph replay), 3 stages take
  // 9.3 us at 4096 keys and 50.7 at 32768, 4 stages 9.6 and 49.9, 2 stages are much slower.
  static constexpr int kStages = 3;
  static constexpr int kStageElems = 2 * kKeys * D;  // K tile then V tile
  static constexpr size_t kRingBytes = static_cast<size_t>(kTcElemBytes) * kStages * kStageElems;
  // After the ring, the merge area: the warps' partials (kWarps x `rows` rows of D floats, then
  // their m and l), rows the query heads a block serves (the GQA group, at most kHeads). Separate
  // from the ring so that the next segment's tiles load while a segment is merged.
  static constexpr size_t merge_bytes(int rows) {
    return sizeof(float) * kWarps * static_cast<size_t>(rows) * (D + 2);
  }
  static constexpr size_t kMostSharedBytes = kRingBytes + merge_bytes(kHeads);
  // Blocks an SM: one while the grid splits units (a long range streams better than two short
  // ones), as many as fit once blocks hold whole units (two for GQA groups of up to 8 heads at
  // D = 128; launch_decode_tc, flash2_decode.cu, has the figures).
};

// ---- the phases' launchers, called by run_flash2 (flash2.cu) ----

Status launch_flash2_prefill(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r);
Status launch_flash2_decode(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                            AttentionBuffers& buffers);

}  // namespace kuiper::op::cuda_attention
