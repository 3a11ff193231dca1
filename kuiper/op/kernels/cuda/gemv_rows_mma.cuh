// The product of 3 to 8 rows of x over plain 16-bit weights on tensor cores (batched decode at
// B = 3 to 8), in every fused form of op::linear, reading the weights once for all the rows.
//
// It is the tensor-core GEMV of quantized weights (gemv_mma.cuh: 16-row tiles, the 8 warps of a
// block splitting K, one mma.sync m16n8k16 per 16 columns with x's rows as the 8 columns of B,
// the warps' sums added at a tile's end, a persistent grid) with the weights streamed another
// way. There a lane loads 16 bytes of each of its two rows, so one warp load reads 64 bytes of
// each of 16 rows; scripts/access_probe.cu measured 8 rows of 64 bytes a load 8-9% slower than
// the same bytes read contiguously (H100, 2653 against 2879 GB/s), and the plain weights lost to
// cuBLAS there at 8 rows. Here each warp copies its stages of 16 rows x 128 columns into a ring in
// shared memory by cp.async, 2 rows x 256 contiguous bytes an instruction, and reads its mma
// operands out of the ring with 16-byte shared loads: lane (g, c) takes chunk 4r + c of rows g
// and g + 8, four weight pairs each, for two mma steps, and x's row g at the same columns (which
// columns fill an mma's k-slots is free as long as A and B agree: gemv_mma.cuh). The stages of a
// block's tiles (stage j: columns [128 j, 128 j + 128)) are dealt to its warps as one stream.
// H100, Qwen3-8B fp16, cold weights, 8 rows, us against cuBLAS (kuiper-bench --matmul-only): q|k|v 20.0 against 22.6, o 14.3 against
// 15.4, gate+up 70.9 against 74.7, lm_head 414.6 against 437.1; down_proj (K = 12288, each tile
// split over 2 blocks, split_k.cuh, for x to fit) 39.1 against 40.4. In the model the RMSNorms
// stay apart at these rows (qwen_model.cpp; staging 8 fp32 rows normalised cost more than the
// norm kernel), SwiGLU and the residual add ride in the epilogue.
//
// x is staged once a block in gemv_mma's layout (stage_rows_x: with a norm, rounded as the
// unfused rmsnorm stores it), after the ring's first stages are asked for (weights only: safe
// before the PDL wait).
#pragma once

#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/gemv_mma.cuh"
#include "kuiper/op/kernels/cuda/split_k.cuh"

namespace kuiper::cuda {

constexpr int kRowsMmaMinRows = 3;
constexpr int kRowsMmaMaxRows = kMmaGemvMaxRows;
constexpr int kRowsMmaStageCols = 128;  // a stage: 16 rows x 16 chunks of 8 columns
constexpr int kRowsMmaStageChunks = 16 * 16;
constexpr int kRowsMmaRing = 3;  // stages a warp has asked for ahead of its mma
// Most rows of the unsplit residual form (the o-projection of Qwen2.5-7B and Qwen3-8B); more go
// to cuBLAS (op::linear adds the product into out there). Measured on the H100 in the model
// (kuiper-bench --throughput --config models/qwen3-8b.json --dtype fp16 --cuda-graph
// --concurrency 4,8 --input-len 448 --output-len 128, two rounds): at 8 sequences 1162.2 / 1162.8
// tok/s with o_proj here, 1172.0 / 1177.0 on cuBLAS, although the product alone is faster here
// (14.3 against 15.4 us). down_proj at 5 to 8 rows is split (split_k.cuh) and stays: 39.1 against
// cuBLAS's 38.6 and its split-K reduce's 3.7.
constexpr int kRowsMmaMostResidualRows = 4;

// A 16-byte chunk c of a stage's row: moved by 4 on odd rows, so that the 8 lanes of a shared
// load (rows 2p and 2p + 1, four chunks each) meet distinct banks.
__device__ __forceinline__ int rows_mma_swizzle(int c, int row) { return c ^ ((row & 1) << 2); }

// Dynamic shared memory: the warps' rings, then x's staged rows (gemv_mma's layout).
inline int64_t gemv_rows_mma_smem(int64_t T, int64_t K) {
  return int64_t{kMmaGemvWarps} * kRowsMmaRing * kRowsMmaStageChunks * 16 +
         gemv_mma_smem(T, K, 8, 0);
}

// What the kernel's static shared memory (the warps' sums, stage_rows_x's 1 / rms) leaves of a
// block's limit.
inline Result<int64_t> gemv_rows_mma_smem_limit() {
  KUIPER_ASSIGN_OR_RETURN(const int64_t optin, max_dynamic_shared_memory());
  return optin - static_cast<int64_t>(sizeof(float)) * kMmaGemvWarps *
                     (kMmaGemvSlots * 32 * 4 + kMmaGemvMaxRows);
}

// The blocks a tile of gemv_rows_mma is split over (split_k.cuh) for T rows of x of K columns
// over `rows` weight rows: 1 where T staged rows of x fit a block (8 rows of K up to about 7000),
// else the fewest splits whose columns do (8 rows of Qwen3-8B's down_proj, K = 12288: 2); 0
// where none does.
inline int gemv_rows_mma_splits(int64_t T, int64_t K, int64_t rows) {
  if (K % kRowsMmaStageCols != 0 || K % kSplitKColumns != 0) return 0;
  const Result<int64_t> limit = gemv_rows_mma_smem_limit();
  if (!limit.ok()) return 0;
  const int64_t pieces = K / kSplitKColumns, tiles = (rows + 15) / 16;
  for (int64_t S = 1; S <= std::min<int64_t>(kSplitKMaxSplits, pieces); ++S) {
    const int64_t columns = (pieces + S - 1) / S * kSplitKColumns;
    if (gemv_rows_mma_smem(T, columns) > limit.value()) continue;
    return S == 1 || tiles * S <= kSplitKMaxItems ? static_cast<int>(S) : 0;
  }
  return 0;
}

// Whether gemv_rows_mma takes T rows of x of K columns over a plain 16-bit weight of `rows` rows
// (x's rows 16-byte aligned, x and out of the weight's type or fp32 where op::linear allows).
inline bool gemv_rows_mma_fits(int64_t T, int64_t K, int64_t rows) {
  return T >= kRowsMmaMinRows && T <= kRowsMmaMaxRows && gemv_rows_mma_splits(T, K, rows) > 0;
}

// Stages rows [0, T) of x into xs (MmaXs<8>: PlainReader's pairs are a row's columns in order)
// as TW. Without a norm x is TW and is copied as it lies, by cp.async with every unit in flight
// at once (this waits for the ring's first stages too). With one, warp n first adds up row n's
// squares, then each thread writes weight * (x / rms) rounded to TW (as the unfused rmsnorm
// stores it) for its units, four loaded before the first is written. stage_x_pairs (gemv_mma.cuh)
// loads one unit at a time: at 8 rows of 4096 that is 16 to 32 round trips to L2 a block, which
// the 8-row products could not afford. Only columns [k0, k0 + Ks) are staged (a split of K:
// split_k.cuh), as if they were the whole row; a norm's 1 / rms still comes from all K. Ends with
// a barrier.
template <typename TW, typename TX>
__device__ void stage_rows_x(const GemvArgs& a, uint32_t* xs, int k0, int Ks) {
  __shared__ float inv_rms[kMmaGemvMaxRows];
  constexpr int kInFlight = 4;
  const int K = static_cast<int>(a.K), T = static_cast<int>(a.T);
  const int units = Ks / 8, pairs = MmaXs<8>::row_pairs(Ks), total = T * units;
  const TX* x = static_cast<const TX*>(a.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (a.norm == nullptr) {
    for (int i = threadIdx.x; i < total; i += kMmaGemvThreads) {
      const int n = i / units, u = i - n * units;
      cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(xs + n * pairs + 4 * u)),
                 x + static_cast<int64_t>(n) * K + k0 + 8 * u, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    return;
  }
  if (warp < T) {
    const TX* row = x + static_cast<int64_t>(warp) * K;
    float local = 0.0f;
    const int row_units = K / 8;
    for (int u0 = lane; u0 < row_units; u0 += kInFlight * 32) {
      float f[kInFlight][8];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const int u = u0 + 32 * k;
        load8(row + 8 * (u < row_units ? u : 0), true, f[k]);
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (u0 + 32 * k >= row_units) break;
#pragma unroll
        for (int e = 0; e < 8; ++e) local += f[k][e] * f[k][e];
      }
    }
    local = warp_sum(local);
    if (lane == 0) inv_rms[warp] = rms_inverse(local, K, a.eps);
  }
  __syncthreads();
  for (int i0 = threadIdx.x; i0 < total; i0 += kInFlight * kMmaGemvThreads) {
    float f[kInFlight][8], weight[kInFlight][8];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int i = i0 + k * kMmaGemvThreads < total ? i0 + k * kMmaGemvThreads : 0;
      const int n = i / units, u = i - n * units;
      load8(x + static_cast<int64_t>(n) * K + k0 + 8 * u, true, f[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        weight[k][e] = load_as_float(a.norm, a.norm_dtype, k0 + 8 * u + e);
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int i = i0 + k * kMmaGemvThreads;
      if (i >= total) break;
      const int n = i / units, u = i - n * units;
      const float inv = inv_rms[n];
      uint32_t p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = pack_pair<TW>(weight[k][2 * e] * (f[k][2 * e] * inv),
                             weight[k][2 * e + 1] * (f[k][2 * e + 1] * inv));
      }
      *reinterpret_cast<uint4*>(xs + n * pairs + 4 * u) = make_uint4(p[0], p[1], p[2], p[3]);
    }
  }
  __syncthreads();
}

// With S = split.splits > 1, block b takes split b % S of K for tiles b / S, b / S + gridDim.x /
// S, ... (split_k.cuh); the sums of a tile's last split to finish are its outputs. The block's
// tiles' stages are dealt to its warps as one stream, as gemv_mma_kernel deals its super-steps
// (warp w takes stages w, w + workers, ... of the stream, sigma = tile * stages + j), each tile's
// sums handed over by leave_tile_sums.
template <typename TW, typename TX, typename TO>
__global__ void __launch_bounds__(kMmaGemvThreads, 1)
    gemv_rows_mma_kernel(const GemvArgs a, int tiles, const SplitK split) {
  extern __shared__ __align__(16) float smem[];
  __shared__ __align__(16) float sums[kMmaGemvSlots][kMmaGemvWarps][32][4];
  using Reader = PlainReader<TW>;
  using Layout = MmaXs<Reader::kVec>;
  static_assert(Reader::kVec == 8, "16-bit weights: 8 columns a chunk");
  constexpr int kRing = kRowsMmaRing;
  uint4* ring = reinterpret_cast<uint4*>(smem);  // [warp][kRing][16 rows][16 chunks]
  uint32_t* xs = reinterpret_cast<uint32_t*>(ring + kMmaGemvWarps * kRing * kRowsMmaStageChunks);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int K = static_cast<int>(a.K), T = static_cast<int>(a.T);
  const int S = split.splits, sp = static_cast<int>(blockIdx.x) % S;
  const int group = static_cast<int>(blockIdx.x) / S, groups = static_cast<int>(gridDim.x) / S;
  const int k0 = S > 1 ? split.begin(sp) * kSplitKColumns : 0;  // the block's columns of K
  const int Ks = S > 1 ? split.begin(sp + 1) * kSplitKColumns - k0 : K;
  const int stage0 = k0 / kRowsMmaStageCols;  // the first stage of those
  const int stages = Ks / kRowsMmaStageCols;  // at least one
  const int workers = stages < kMmaGemvWarps ? stages : kMmaGemvWarps;
  const int my_tiles = (tiles - group + groups - 1) / groups;
  const bool working = warp < workers;
  auto tile_at = [&](int i) { return group + i * groups; };  // the block's i-th tile
  uint4* my_ring = ring + warp * kRing * kRowsMmaStageChunks;

  // The lane's copies: chunk lane % 16 of stage rows 2i + lane / 16 (i < 8), each row of the
  // tile being row[r / 8] of MmaTileRows for g = r % 8 (8 gate and 8 up rows for SwiGLU).
  const char* load_row[8];
  bool load_valid[8];
  int load_tile = 0, load_sigma = warp, load_slot = 0;  // the next stage to load
  auto set_load_rows = [&]() {
    const int tile = tile_at(load_tile);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = 2 * i + lane / 16;
      const MmaTileRows t(a, tile, r % 8);
      load_valid[i] = t.valid[r / 8];
      load_row[i] = static_cast<const char*>(a.w.values) +
                    (load_valid[i] ? t.row[r / 8] : 0) * a.w.row_bytes;
    }
  };
  auto issue = [&]() {  // the warp's next stage, or an empty group past its last
    if (load_tile < my_tiles) {
      const int chunk = (stage0 + load_sigma - load_tile * stages) * 16 + lane % 16;
      uint4* buf = my_ring + load_slot * kRowsMmaStageChunks;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = 2 * i + lane / 16;
        cp_async16(static_cast<uint32_t>(
                       __cvta_generic_to_shared(buf + r * 16 + rows_mma_swizzle(lane % 16, r))),
                   load_row[i] + static_cast<int64_t>(chunk) * 16, load_valid[i]);
      }
      load_slot = load_slot + 1 == kRing ? 0 : load_slot + 1;
      load_sigma += workers;
      if (load_sigma - load_tile * stages >= stages && ++load_tile < my_tiles) set_load_rows();
    }
    cp_async_commit();
  };
  if (working && my_tiles > 0) {
    set_load_rows();
#pragma unroll
    for (int j = 0; j < kRing - 1; ++j) issue();  // weights only: safe before the previous kernel ends
  }
  grid_dependency_wait();
  grid_launch_dependents();
  stage_rows_x<TW, TX>(a, xs, k0, Ks);
  if (!working) return;  // K has fewer stages than the block has warps

  const int x_n = g < T ? g : T - 1;  // this lane's column of B
  const uint32_t* x_row = xs + x_n * Layout::row_pairs(Ks);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int tile = 0, sigma = warp, slot = 0;  // the stage the mma is at
  int adder = 0;                         // tile % workers: the warp that adds the tile up
  const int total = (my_tiles * stages - warp + workers - 1) / workers;
  for (int s = 0; s < total; ++s) {
    issue();  // stage s + kRing - 1, into the slot stage s - 1 freed
    cp_async_wait<kRing - 1>();
    __syncwarp();  // every lane's copies of stage s are in
    const uint4* buf = my_ring + slot * kRowsMmaStageChunks;
    const int q0 = (sigma - tile * stages) * 16;  // the stage's first chunk of a row
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int q = 4 * r + c;
      const uint4 lo = buf[g * 16 + rows_mma_swizzle(q, g)];
      const uint4 hi = buf[(g + 8) * 16 + rows_mma_swizzle(q, g + 8)];
      // One unit a chunk: no swizzle.
      const uint4 b = *reinterpret_cast<const uint4*>(x_row + Layout::at(q0 + q, 0, 0));
      const uint32_t step0[4] = {lo.x, hi.x, lo.y, hi.y};
      TensorCore<TW>::mma(acc, step0, b.x, b.y);
      const uint32_t step1[4] = {lo.z, hi.z, lo.w, hi.w};
      TensorCore<TW>::mma(acc, step1, b.z, b.w);
    }
    __syncwarp();  // the slot is read: the next issue may overwrite it
    slot = slot + 1 == kRing ? 0 : slot + 1;
    sigma += workers;
    if (sigma - tile * stages >= stages) {  // the warp's last stage of the tile
      if (leave_tile_sums<kMmaGemvSlots>(sums, acc, tile, workers, adder == warp, warp, lane, 1)) {
        float v[4];
        mma_gemv_sum(sums[tile & (kMmaGemvSlots - 1)], workers, lane, v);
        release_tile_sums<kMmaGemvSlots>(tile, my_tiles, workers, 1);
        if (S == 1) {
          mma_gemv_store<TO>(a, MmaTileRows(a, tile_at(tile), g), v, lane);
        } else {
          split_k_leave(split, tile_at(tile), sp, lane, v);
        }
      }
      ++tile;
      adder = adder + 1 == workers ? 0 : adder + 1;
    }
  }
  // Split K: once the block's copies are done, each adding warp counts in the tiles it left
  // partials of, and stores those it finished last.
  if (S == 1) return;
  __threadfence();
  for (int i = warp; i < my_tiles; i += workers) {
    float v[4];
    if (split_k_last(split, tile_at(i), lane, v)) {
      mma_gemv_store<TO>(a, MmaTileRows(a, tile_at(i), g), v, lane);
    }
  }
}

// The product of kRowsMmaMinRows to kRowsMmaMaxRows rows of x through gemv_rows_mma_kernel where
// it applies: a plain 16-bit weight read in whole chunks, x of the weight's type (or fp32 into
// the norm forms), out of the weight's type or fp32, x's rows 16-byte aligned and
// gemv_rows_mma_fits. true when it ran; false: the caller's other path must.
template <typename VisitReader>
Result<bool> gemv_rows_mma(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                           Tensor& out, VisitReader&& visit_reader) {
  GemvArgs a = gemv_args(x, w, o, out);
  const int64_t w_rows = a.swiglu ? 2 * a.N : a.N;
  if (a.fp8_activations || !gemv_rows_mma_fits(a.T, a.K, w_rows) || a.N >= (int64_t{1} << 30)) {
    return false;
  }
  const int splits = gemv_rows_mma_splits(a.T, a.K, w_rows);
  if (a.residual && splits == 1 && a.T > kRowsMmaMostResidualRows) return false;
  SplitK split;
  if (splits > 1) {
    KUIPER_ASSIGN_OR_RETURN(split, split_k_workspace(splits, a.K));
  }
  const int64_t columns = splits > 1 ? split.max_columns() : a.K;  // of x, a block stages
  KUIPER_ASSIGN_OR_RETURN(const int64_t smem_limit, gemv_rows_mma_smem_limit());
  return visit_rows_gemv(x, w, out, a.norm != nullptr, visit_reader,
                         [&](auto reader_tag, auto x_tag, auto out_tag) -> Result<bool> {
    using Reader = typename std::decay_t<decltype(reader_tag)>::type;
    using TX = typename std::decay_t<decltype(x_tag)>::type;
    using TO = typename std::decay_t<decltype(out_tag)>::type;
    a.w_vectorized = Reader::vectorizable(a.w);
    a.x_vectorized = aligned16(x.raw());
    if (!a.w_vectorized || !a.x_vectorized) return false;
    constexpr auto kKernel = gemv_rows_mma_kernel<typename Reader::Weight, TX, TO>;
    KUIPER_RETURN_IF_ERROR(allow_shared_memory<kKernel>(static_cast<size_t>(smem_limit)));
    const int64_t smem = gemv_rows_mma_smem(a.T, columns);
    const int64_t tiles = gemv_mma_tiles(a);
    KUIPER_ASSIGN_OR_RETURN(const int64_t fit, resident_blocks<kKernel>(
                                                   kMmaGemvThreads, static_cast<size_t>(smem)));
    // Groups of `splits` blocks, as many as fit at once, each taking the same number of tiles
    // (give or take one for the last).
    const int64_t fit_groups = std::max<int64_t>(1, std::min(fit, tiles * splits) / splits);
    const int64_t per_block = (tiles + fit_groups - 1) / fit_groups;
    const int64_t groups = (tiles + per_block - 1) / per_block;
    KUIPER_RETURN_IF_ERROR(launch_pdl(kKernel, dim3(static_cast<unsigned>(groups * splits)),
                                      dim3(kMmaGemvThreads), static_cast<size_t>(smem),
                                      "multi-row tensor-core gemv kernel launch", a,
                                      static_cast<int>(tiles), split));
    return true;
  });
}

}  // namespace kuiper::cuda
