// The GEMV for two rows of x over 16-bit weights (batched decode's products at B = 2), in every
// fused form of op::linear. It reads the weights as the one-row GEMV does (gemv.cuh: a
// warp owns two weight rows, or a gate and an up row for SwiGLU, and each of its 16-byte loads
// takes 512 contiguous bytes of one row, kLoads loads in flight a row, the first issued before
// the PDL wait), and multiplies every row of x by each chunk as it is widened, so the weights
// are read once for the whole small batch. x's rows are staged once a block as fp32 (XsLayout
// within each row, one row after another: kRows x K floats, rows past T zero), times the norm
// weight for the RMSNorm forms, with each row's sum of squares for its 1 / rms; a persistent
// grid of as many blocks as fit. Written for kRows staged rows; launched for two only: at 4 and 8
// rows it lost to cuBLAS in the model (8 staged fp32 rows leave one block an SM); 3 to 8 rows
// take gemv_rows_mma.cuh (docs/PERFORMANCE.md, issue 13's section).
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "kuiper/op/kernels/cuda/gemv.cuh"

namespace kuiper::cuda {

constexpr int kRowsGemvRows = 2;
// x's staged rows a block may hold (two rows of K = 25600 in fp32).
constexpr int64_t kRowsGemvMaxSmem = 200 * 1024;

// Whether gemv_rows takes T rows of x of K columns (given a plain 16-bit weight and x's rows
// 16-byte aligned): the model asks before it runs op::linear's fused forms on two rows.
inline bool gemv_rows_fits(int64_t T, int64_t K) {
  return T == kRowsGemvRows && K % 8 == 0 &&
         kRowsGemvRows * K * static_cast<int64_t>(sizeof(float)) <= kRowsGemvMaxSmem;
}

// Stages rows [0, kRows) of x into xs (zeros past a.T), each per XsLayout<kVec> and times the
// norm weight when there is one; sumsq[n][warp] is each warp's share of row n's sum of squares.
// A thread loads its 16 bytes of every row before it stores the first. Ends with a barrier.
template <typename TX, int kVec, int kRows>
__device__ void stage_x_rows(const GemvArgs& a, float* xs, float (*sumsq)[kGemvWarps]) {
  using Layout = XsLayout<kVec>;
  constexpr int kVecX = 16 / static_cast<int>(sizeof(TX));
  const TX* x = static_cast<const TX*>(a.x);
  const int64_t K = a.K, units = K / kVecX;
  const bool norm = a.norm != nullptr;
  float local[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) local[n] = 0.0f;
  for (int64_t c = threadIdx.x; c < units; c += kGemvThreads) {
    uint4 raw[kRows];
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      raw[n] = n < a.T ? reinterpret_cast<const uint4*>(x + n * K)[c] : make_uint4(0, 0, 0, 0);
    }
    float weight[kVecX];
#pragma unroll
    for (int j = 0; j < kVecX; ++j) {
      weight[j] = norm ? load_as_float(a.norm, a.norm_dtype, c * kVecX + j) : 1.0f;
    }
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const TX* v = reinterpret_cast<const TX*>(&raw[n]);
      float f[kVecX];
#pragma unroll
      for (int j = 0; j < kVecX; ++j) {
        f[j] = to_float(v[j]);
        local[n] += f[j] * f[j];
        f[j] *= weight[j];
      }
      float4* pieces = reinterpret_cast<float4*>(xs + n * K);
#pragma unroll
      for (int j = 0; j < kVecX; j += 4) {
        pieces[Layout::piece(c * (kVecX / 4) + j / 4)] =
            make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const float total = warp_sum(local[n]);
    if (threadIdx.x % 32 == 0) sumsq[n][threadIdx.x / 32] = total;
  }
  __syncthreads();
}

// Chunk c of two weight rows times every staged row of x, added into acc[r][n]: each 16-byte
// piece of the weights is widened once for all kRows rows.
template <typename Reader, int kRows>
__device__ __forceinline__ void chunk_rows(uint4 raw0, typename Reader::Meta m0, uint4 raw1,
                                           typename Reader::Meta m1, const float* xs, int64_t K,
                                           int64_t c, float (&acc)[2][kRows]) {
  using Layout = XsLayout<Reader::kVec>;
  const int sw = Layout::swizzle(c);
  float s[2][kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) s[0][n] = s[1][n] = 0.0f;
#pragma unroll
  for (int p = 0; p < Layout::kPieces; ++p) {
    float v[2][4];
    Reader::piece(raw0, m0, p, v[0]);
    Reader::piece(raw1, m1, p, v[1]);
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const float4 x = reinterpret_cast<const float4*>(xs + n * K)[c * Layout::kPieces + (p ^ sw)];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[r][n] += v[r][0] * x.x;
        s[r][n] += v[r][1] * x.y;
        s[r][n] += v[r][2] * x.z;
        s[r][n] += v[r][3] * x.w;
      }
    }
  }
  const float scale0 = Reader::scale(m0), scale1 = Reader::scale(m1);
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    acc[0][n] += s[0][n] * scale0;
    acc[1][n] += s[1][n] * scale1;
  }
}

// A persistent grid over `tiles` tiles of 8 warps' rows: block b takes tiles b, b + gridDim.x,
// ..., x staged once, the next tile's first loads issued before a finished tile's stores. After
// a tile's sums are reduced over the warp, lane n stores row n of x's outputs.
template <typename Reader, typename TX, typename TO, int kRows, int kLoads>
__global__ void __launch_bounds__(kGemvThreads, 2)
    gemv_rows_kernel(const GemvArgs a, int64_t tiles) {
  extern __shared__ __align__(16) float xs[];
  __shared__ float sumsq[kRows][kGemvWarps];
  constexpr int kVec = Reader::kVec;
  const Reader reader(a.w);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  using Rows = GemvWarpRows;
  auto rows_of = [&](int64_t b) { return gemv_warp_rows(a, b, warp); };
  const int64_t K = a.K, chunks = K / kVec;
  GemvPairLoads<Reader, kLoads> w;
  w.point(reader, rows_of(blockIdx.x));
  const Rows& t = w.t;
  auto load = [&](int64_t c0) { w.load(reader, c0, chunks); };
  if (blockIdx.x < tiles) load(lane);  // weights only: safe before the previous kernel ends
  grid_dependency_wait();
  grid_launch_dependents();
  stage_x_rows<TX, kVec, kRows>(a, xs, sumsq);

  // Lane n's stores of row n of x's outputs.
  auto store = [&](const Rows& done, int n, float v0, float v1) {
    const float inv = a.norm != nullptr ? gemv_inv_rms(a, sumsq[n]) : 1.0f;
    gemv_store_pair(a, static_cast<TO*>(a.out) + n * a.N, done.row, done.valid, v0 * inv,
                    v1 * inv);
  };

  for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    float acc[2][kRows];
#pragma unroll
    for (int n = 0; n < kRows; ++n) acc[0][n] = acc[1][n] = 0.0f;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kLoads) {
      if (c0 != lane) load(c0);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) continue;
        // A missing row multiplies whatever raw holds into a sum never stored.
        chunk_rows<Reader, kRows>(w.raw[0][u], w.meta[0][u], w.raw[1][u], w.meta[1][u], xs, K, c,
                                  acc);
      }
    }
    const Rows done = t;
    if (b + gridDim.x < tiles) {
      w.point(reader, rows_of(b + gridDim.x));
      load(lane);
    }
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const float v0 = warp_sum(acc[0][n]), v1 = warp_sum(acc[1][n]);
      if (lane == n && n < a.T) store(done, n, v0, v1);
    }
  }
}

// Launches gemv_rows_kernel with kRows staged rows on as many blocks as fit.
template <typename Reader, typename TX, typename TO, int kRows>
Status launch_gemv_rows(const GemvArgs& a) {
  constexpr int kLoads = 8;  // two blocks an SM: 128 registers
  constexpr auto kKernel = gemv_rows_kernel<Reader, TX, TO, kRows, kLoads>;
  const int64_t smem = kRows * a.K * static_cast<int64_t>(sizeof(float));
  KUIPER_RETURN_IF_ERROR(allow_shared_memory<kKernel>(kRowsGemvMaxSmem));
  const int64_t groups = a.swiglu ? a.N : (a.N + 1) / 2;  // a warp's rows
  const int64_t tiles = (groups + kGemvWarps - 1) / kGemvWarps;
  KUIPER_ASSIGN_OR_RETURN(const int64_t fit,
                          resident_blocks<kKernel>(kGemvThreads, static_cast<size_t>(smem)));
  const int64_t per_block = (tiles + fit - 1) / fit;
  const int64_t blocks = (tiles + per_block - 1) / per_block;
  return launch_pdl(kKernel, dim3(static_cast<unsigned>(blocks)), dim3(kGemvThreads),
                    static_cast<size_t>(smem), "multi-row gemv kernel launch", a, tiles);
}

// The product of two rows of x through gemv_rows_kernel where it applies: a plain 16-bit weight
// read in whole chunks, x of the weight's type (or fp32 into the norm forms), out of the weight's
// type or fp32, x's 16-byte rows aligned and gemv_rows_fits. true when it ran; false: the
// caller's other path must.
template <typename VisitReader>
Result<bool> gemv_rows(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                       Tensor& out, VisitReader&& visit_reader) {
  GemvArgs a = gemv_args(x, w, o, out);
  if (!gemv_rows_fits(a.T, a.K) || a.fp8_activations) return false;
  return visit_rows_gemv(x, w, out, a.norm != nullptr, visit_reader,
                         [&](auto reader_tag, auto x_tag, auto out_tag) -> Result<bool> {
    using Reader = typename std::decay_t<decltype(reader_tag)>::type;
    using TX = typename std::decay_t<decltype(x_tag)>::type;
    using TO = typename std::decay_t<decltype(out_tag)>::type;
    a.w_vectorized = Reader::vectorizable(a.w);
    a.x_vectorized = a.K % (16 / sizeof(TX)) == 0 && aligned16(x.raw()) &&
                     (a.K * static_cast<int64_t>(sizeof(TX))) % 16 == 0;
    if (!a.w_vectorized || !a.x_vectorized) return false;
    KUIPER_RETURN_IF_ERROR((launch_gemv_rows<Reader, TX, TO, kRowsGemvRows>(a)));
    return true;
  });
}

}  // namespace kuiper::cuda
