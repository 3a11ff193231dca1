// The GEMV for one row of x, shared by the plain (matmul.cu) and the quantized
// (quantized_matmul.cu) weights: one kernel body, templated on a weight reader that turns a
// 16-byte chunk of a weight row into weights (weight_readers.cuh), so every format keeps the same
// load pipeline and the same fused forms.
//
// Decode reads every weight byte once, so the GEMV is built to keep the memory system busy from
// the first cycle to the last:
//  - a block of 8 warps, each warp owning two output rows: 16 16-byte streaming loads in flight
//    per lane (8 per row) before the first multiply, the whole of a 4096-wide fp16 row pair in
//    two round trips. (Measured on the H100, Qwen3-8B graph decode: this 126-register form, 2
//    blocks per SM, gives 146 tok/s; 4 loads per row capped to 64 registers, 4 blocks per SM,
//    136 tok/s, and letting the next kernel launch only after the main loop, 139-140.);
//  - x is staged once per block in shared memory as fp32, so the inner loop reads it with 16-byte
//    shared loads and the two rows of a warp share those reads;
//  - the first loads are issued before griddepcontrol.wait: launched with programmatic dependent
//    launch (PDL), the blocks start while the previous kernel finishes, and their weight loads
//    (which depend on nothing) overlap its tail; x, the bias and the residual are read after the
//    wait (138 -> 146 tok/s);
//  - an fp32 x past one wave of blocks runs on a persistent grid that stages it once a block,
//    each warp loading its next rows before it stores the ones it finished (launch_gemv: Qwen3-8B
//    fp16 163.3 -> 166.8 tok/s).
// A quantized reader also loads each chunk's scale (and zero) with the chunk, so the dequantizing
// multiply never waits on a second round trip.
// Fused forms (op::linear): the RMSNorm of x (every block stages x times the norm weight and
// scales the dot products by 1 / rms at the end; the normalised x is not rounded to the
// activation type as the rmsnorm kernel would store it), SwiGLU over stacked [gate; up] rows (the
// warp's two rows are gate row n and up row n), and a residual add into out. x is read as TX and
// out written as TO: fp32 x (the residual stream) into 16-bit out for the norm forms, 16-bit x
// into an fp32 residual out, whose sum then sees the product in fp32.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/tuning_log.h"
#include "kuiper/op/kernels/cuda/weight_readers.cuh"
#include "kuiper/op/ops.h"

namespace kuiper::cuda {

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
// kUnroll, a template argument: 16-byte loads in flight per lane and row. 8 (126 registers, 2
// blocks per SM) everywhere, except where a launch has between one and two SM-fuls of such
// blocks (q/k/v: 384 blocks, 264 fit at once on an H100): there the 4-load form, capped at 64
// registers so that 4 blocks fit per SM, runs it in one wave instead of 1.45.

struct GemvArgs {
  WeightView w;
  const void* x;
  const void* norm;  // RMSNorm weight [K] or null
  DataType norm_dtype;
  float eps;
  const void* bias;  // [rows of w] or null
  DataType bias_dtype;
  void* out;  // [N]; with residual it also holds the residual
  int64_t N;  // outputs (a row of out)
  int64_t K;
  int64_t T;  // rows of x and of out: 1 here, up to 8 in the tensor-core GEMV (gemv_mma.cuh)
  int64_t up_offset;  // swiglu: first up row (= N); 0 otherwise
  bool w_vectorized;  // the reader's 16-byte chunks apply (WeightReader::vectorizable)
  bool x_vectorized;
  bool residual;
  bool swiglu;
  bool fp8_activations;  // x rounded to FP8 first (weight.h): the tensor-core GEMV only
};

// Whether the GEMVs of several rows of x (gemv_rows.cuh, gemv_rows_mma.cuh) take x of TX and out
// of TO with a weight of TW: a 16-bit weight, x and out each of its type or fp32 (an fp32 x only
// into a norm, which visit_rows_gemv checks), not both fp32.
template <typename TX, typename TW, typename TO>
constexpr bool kRowsGemvTypes = sizeof(TW) == 2 &&
                                (std::is_same_v<TX, TW> || std::is_same_v<TX, float>) &&
                                (std::is_same_v<TO, TW> || std::is_same_v<TO, float>) &&
                                !(std::is_same_v<TX, float> && std::is_same_v<TO, float>);

// The multi-row GEMVs' type dispatch: calls launch(reader_tag, x_tag, out_tag) -> Result<bool>
// (whether it ran) with w's reader and x's and out's types where those GEMVs take them
// (kRowsGemvTypes; an fp32 x only when `norm`). Returns whether launch ran; false: the caller's
// other path must. visit_reader(w, fn) calls fn(TypeTag<Reader>{}) with w's reader
// (weight_readers.cuh).
template <typename VisitReader, typename Launch>
Result<bool> visit_rows_gemv(const Tensor& x, const op::Weight& w, const Tensor& out, bool norm,
                             VisitReader&& visit_reader, Launch&& launch) {
  bool ran = false;
  KUIPER_RETURN_IF_ERROR(visit_activation_pair(x.dtype(), out.dtype(), [&](auto x_tag,
                                                                            auto out_tag) {
    using TX = typename std::decay_t<decltype(x_tag)>::type;
    using TO = typename std::decay_t<decltype(out_tag)>::type;
    return visit_reader(w, [&](auto reader_tag) -> Status {
      using Reader = typename std::decay_t<decltype(reader_tag)>::type;
      if constexpr (kRowsGemvTypes<TX, typename Reader::Weight, TO>) {
        if (std::is_same_v<TX, float> && !norm) return Status::Ok();
        KUIPER_ASSIGN_OR_RETURN(ran, launch(reader_tag, x_tag, out_tag));
      }
      return Status::Ok();
    });
  }));
  return ran;
}

// A warp's two rows of w in tile b of a two-rows-a-warp GEMV (gemv_kernel, gemv_rows_kernel)
// and whether each exists: rows 2 g and 2 g + 1 of group g = b x kGemvWarps + warp, or for
// SwiGLU gate row g and up row g + up_offset (out's element g).
struct GemvWarpRows {
  int64_t group, row[2];
  bool valid[2];
};

__device__ __forceinline__ GemvWarpRows gemv_warp_rows(const GemvArgs& a, int64_t b, int warp) {
  GemvWarpRows t;
  t.group = b * kGemvWarps + warp;
  if (a.swiglu) {
    t.row[0] = t.group;
    t.row[1] = t.group + a.up_offset;
    t.valid[0] = t.valid[1] = t.group < a.N;
  } else {
    t.row[0] = 2 * t.group;
    t.row[1] = 2 * t.group + 1;
    t.valid[0] = t.row[0] < a.N;
    t.valid[1] = t.row[1] < a.N;
  }
  return t;
}

// Fills xs with x in fp32 (laid out per XsLayout<kVec> when `swizzled`, the main loop's chunks;
// in order for the scalar loop), times the RMSNorm weight when there is one, and each warp's
// share of sum(x^2) in sumsq[warp]; ends with a barrier. The 1 / rms factor is applied to the
// finished dot products instead (gemv_inv_rms), so staging is one pass: x and the norm weight are
// loaded together, and no second barrier waits for the block's sum before the main loop.
template <typename TX, int kVec>
__device__ void stage_x(const GemvArgs& a, bool swizzled, float* xs, float* sumsq) {
  using Layout = XsLayout<kVec>;
  const TX* x = static_cast<const TX*>(a.x);
  const int64_t K = a.K;
  const bool norm = a.norm != nullptr;
  float4* pieces = reinterpret_cast<float4*>(xs);
  float local = 0.0f;
  if (a.x_vectorized) {
    constexpr int kVecX = 16 / sizeof(TX);
    float f[kVecX];
    for (int64_t c = threadIdx.x; c < K / kVecX; c += kGemvThreads) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[c];
      const TX* v = reinterpret_cast<const TX*>(&raw);
#pragma unroll
      for (int j = 0; j < kVecX; ++j) {
        f[j] = to_float(v[j]);
        local += f[j] * f[j];
        if (norm) f[j] *= load_as_float(a.norm, a.norm_dtype, c * kVecX + j);
      }
#pragma unroll
      for (int j = 0; j < kVecX; j += 4) {
        const int64_t piece = c * (kVecX / 4) + j / 4;
        pieces[swizzled ? Layout::piece(piece) : piece] =
            make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
      }
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kGemvThreads) {
      const float v = to_float(x[k]);
      local += v * v;
      const int64_t at = swizzled ? Layout::piece(k / 4) * 4 + k % 4 : k;
      xs[at] = norm ? v * load_as_float(a.norm, a.norm_dtype, k) : v;
    }
  }
  if (norm) {
    local = warp_sum(local);
    if (threadIdx.x % 32 == 0) sumsq[threadIdx.x / 32] = local;
  }
  __syncthreads();
}

// 1 / sqrt(mean(x^2) + eps) from the warps' shares (the rmsnorm kernel's expression).
__device__ __forceinline__ float gemv_inv_rms(const GemvArgs& a, const float* sumsq) {
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kGemvWarps; ++i) total += sumsq[i];
  return rms_inverse(total, a.K, a.eps);
}

// Stores one row of x's outputs for a pair of w's rows (row[0] and row[1]; for SwiGLU the gate
// row and its up row, whose product goes to out[row[0]]) from their finished sums v0 and v1 (1 /
// rms applied), in every GEMV's epilogue. Every intermediate is rounded to TO where the unfused
// ops would store it (not at all for an fp32 out: a product past fp16's range reaches an fp32
// residual intact).
template <typename TO>
__device__ __forceinline__ void gemv_store_pair(const GemvArgs& a, TO* out, const int64_t (&row)[2],
                                                const bool (&valid)[2], float v0, float v1) {
  auto finish = [&](float v, int r) {
    if (a.bias != nullptr) v += load_as_float(a.bias, a.bias_dtype, row[r]);
    return to_float(from_float<TO>(v));
  };
  if (a.swiglu) {
    if (valid[0]) out[row[0]] = from_float<TO>(silu_times(finish(v0, 0), finish(v1, 1)));
    return;
  }
  const float v[2] = {v0, v1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    float value = finish(v[r], r);
    if (a.residual) value = to_float(out[row[r]]) + value;
    out[row[r]] = from_float<TO>(value);
  }
}

// A warp's two rows of w (the tile `t` names) and the next kLoads chunks a lane reads of each,
// loaded ahead of their use: how gemv_kernel and gemv_rows_kernel stream their weights.
template <typename Reader, int kLoads>
struct GemvPairLoads {
  GemvWarpRows t;
  typename Reader::Row rows[2];
  uint4 raw[2][kLoads] = {};
  typename Reader::Meta meta[2][kLoads] = {};

  // Points at tile `next`'s rows (a missing row reads row 0, never used).
  __device__ __forceinline__ void point(const Reader& reader, const GemvWarpRows& next) {
    t = next;
#pragma unroll
    for (int r = 0; r < 2; ++r) rows[r] = reader.row(t.valid[r] ? t.row[r] : 0);
  }
  // Chunks c0, c0 + 32, ... (kLoads of them) of both rows; those at or past `chunks`, and a
  // missing row's, keep what they held.
  __device__ __forceinline__ void load(const Reader& reader, int64_t c0, int64_t chunks) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t c = c0 + 32 * u;
        if (t.valid[r] && c < chunks) {
          raw[r][u] = __ldcs(Reader::chunk(rows[r], c));
          meta[r][u] = reader.meta(rows[r], c);
        }
      }
    }
  }
};

// A persistent grid over `tiles` tiles (a block's worth of rows: two a warp, or gate and up rows
// for SwiGLU): block b takes tiles b, b + gridDim.x, ... with x staged once, and a warp issues
// the first loads of its next tile's rows before it reduces and stores the tile it has finished,
// so the weights stream on between tiles.
template <typename Reader, typename TX, typename TO, int kGemvUnroll>
__global__ void __launch_bounds__(kGemvThreads, kGemvUnroll >= 8 ? 2 : 4)
    gemv_kernel(const GemvArgs a, int64_t tiles) {
  extern __shared__ __align__(16) float xs[];
  constexpr int kVec = Reader::kVec;
  const Reader reader(a.w);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  using Rows = GemvWarpRows;
  auto rows_of = [&](int64_t b) { return gemv_warp_rows(a, b, warp); };
  const int64_t K = a.K;
  const int64_t chunks = a.w_vectorized ? K / kVec : 0;
  GemvPairLoads<Reader, kGemvUnroll> w;
  w.point(reader, rows_of(blockIdx.x));
  const Rows& t = w.t;
  auto load = [&](int64_t c0) { w.load(reader, c0, chunks); };
  load(lane);  // weights only: safe before the previous kernel has finished
  grid_dependency_wait();
  grid_launch_dependents();
  __shared__ float sumsq[kGemvWarps];
  stage_x<TX, kVec>(a, a.w_vectorized, xs, sumsq);

  // Lane 0's stores of a finished tile.
  auto store = [&](const Rows& done, const float (&acc)[2]) {
    const float inv = a.norm != nullptr ? gemv_inv_rms(a, sumsq) : 1.0f;
    gemv_store_pair(a, static_cast<TO*>(a.out), done.row, done.valid, acc[0] * inv, acc[1] * inv);
  };

  for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    float acc[2] = {0.0f, 0.0f};
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kGemvUnroll) {
      if (c0 != lane) load(c0);
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) continue;
        // A missing row multiplies whatever raw holds into a sum never stored.
        float part[2];
        chunk_dot2<Reader>(w.raw[0][u], w.meta[0][u], w.raw[1][u], w.meta[1][u], xs, c, part);
        acc[0] += part[0];
        acc[1] += part[1];
      }
    }
    if (!a.w_vectorized) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (!t.valid[r]) continue;
        for (int64_t k = lane; k < K; k += 32) acc[r] += reader.at(w.rows[r], k) * xs[k];
      }
    }
    const Rows done = t;
    // The next tile's first loads, before this one's stores. (The 4-load form runs one wave, a
    // tile a block: the loads ahead would only cost it registers it has not got.)
    if (kGemvUnroll >= 8 && b + gridDim.x < tiles) {
      w.point(reader, rows_of(b + gridDim.x));
      load(lane);
    }
    acc[0] = warp_sum(acc[0]);
    acc[1] = warp_sum(acc[1]);
    if (lane == 0) store(done, acc);
    if (kGemvUnroll < 8) break;
  }
}

// Blocks of gemv_kernel<..., kUnroll> that fit on the current GPU at once with `smem` bytes of x.
template <typename Reader, typename TX, typename TO, int kUnroll>
Result<int64_t> gemv_fit(int64_t smem) {
  return resident_blocks<gemv_kernel<Reader, TX, TO, kUnroll>>(kGemvThreads,
                                                               static_cast<size_t>(smem));
}

template <typename Reader, typename TX, typename TO>
Status launch_gemv(const GemvArgs& a) {
  constexpr int64_t kMaxSmem = 200 * 1024;
  const int64_t smem = a.K * static_cast<int64_t>(sizeof(float));
  if (smem > kMaxSmem) {
    return Status::Error("GEMV: K = " + std::to_string(a.K) + " does not fit in shared memory");
  }
  // Past 48 KB (static shared memory included) a kernel must opt in.
  if (smem > 40 * 1024) {
    KUIPER_RETURN_IF_ERROR((allow_shared_memory<gemv_kernel<Reader, TX, TO, 8>>(kMaxSmem)));
    KUIPER_RETURN_IF_ERROR((allow_shared_memory<gemv_kernel<Reader, TX, TO, 4>>(kMaxSmem)));
  }
  const int64_t groups = a.swiglu ? a.N : (a.N + 1) / 2;  // a warp's rows
  const int64_t tiles = (groups + kGemvWarps - 1) / kGemvWarps;
  KUIPER_ASSIGN_OR_RETURN(const int64_t fit8, (gemv_fit<Reader, TX, TO, 8>(smem)));
  int64_t fit4 = 0;
  if (tiles > fit8) {
    KUIPER_ASSIGN_OR_RETURN(fit4, (gemv_fit<Reader, TX, TO, 4>(smem)));
  }
  const bool one_wave_of_4 = tiles > fit8 && tiles <= fit4;
  // An fp32 x (the fp16 models' residual stream into the norm forms) past one wave: a persistent
  // grid of as many blocks as fit, each taking the same number of tiles (give or take one for
  // the last), stages x once a block instead of once a tile. A 16-bit x, whose staging costs
  // half as much, keeps a block a tile and the hardware's dynamic balance. (H100, graph decode,
  // persistent against a tile a block: Qwen3-8B fp16 163.9 -> 165.6 tok/s and Qwen2.5-7B fp16
  // 175.8 -> 176.2, but Qwen2.5-7B bf16 179.3 -> 177.7 and Qwen3-8B bf16 166.6 -> 167.2.)
  const int64_t fit = std::max<int64_t>(one_wave_of_4 ? fit4 : fit8, 1);
  const int64_t per_block = sizeof(TX) == 4 ? (tiles + fit - 1) / fit : 1;
  const int64_t blocks = (tiles + per_block - 1) / per_block;
  KUIPER_LOG_TUNING("GEMV N " + std::to_string(a.N) + " K " + std::to_string(a.K) + ": " +
                    std::to_string(tiles) + " tiles on " + std::to_string(blocks) + " blocks, " +
                    (one_wave_of_4 ? "4" : "8") + " loads in flight a row (" +
                    std::to_string(fit8) + " blocks fit with 8)");
  const dim3 grid(static_cast<unsigned>(blocks));
  if (one_wave_of_4) {
    return launch_pdl(gemv_kernel<Reader, TX, TO, 4>, grid, dim3(kGemvThreads),
                      static_cast<size_t>(smem), "gemv kernel launch", a, tiles);
  }
  return launch_pdl(gemv_kernel<Reader, TX, TO, 8>, grid, dim3(kGemvThreads),
                    static_cast<size_t>(smem), "gemv kernel launch", a, tiles);
}

// The arguments of a product of x [T, K] and w into out [T, N] with op::linear's options
// (w_vectorized and x_vectorized are the launcher's to set).
inline GemvArgs gemv_args(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                          Tensor& out) {
  GemvArgs a{};
  a.w = weight_view(w);
  a.x = x.raw();
  a.norm = o.norm != nullptr ? o.norm->raw() : nullptr;
  a.norm_dtype = o.norm != nullptr ? o.norm->dtype() : DataType::kFp32;
  a.eps = static_cast<float>(o.eps);
  a.bias = o.bias != nullptr ? o.bias->raw() : nullptr;
  a.bias_dtype = o.bias != nullptr ? o.bias->dtype() : DataType::kFp32;
  a.out = out.raw();
  a.N = out.dim(1);
  a.K = x.dim(1);
  a.T = x.dim(0);
  a.up_offset = o.swiglu ? a.N : 0;
  a.residual = o.residual;
  a.swiglu = o.swiglu;
  a.fp8_activations = w.fp8_activations;
  return a;
}

// The GEMV for one row of x: out has x's type, or one of them is fp32 (the residual stream beside
// 16-bit activations; ops.h, op::linear). visit_reader(w, fn) calls fn(TypeTag<Reader>{}) with
// w's reader (weight_readers.cuh: visit_plain_reader or visit_quantized_reader).
template <typename VisitReader>
Status gemv(const Tensor& x, const op::Weight& w, const op::LinearOptions& o, Tensor& out,
            VisitReader&& visit_reader) {
  GemvArgs a = gemv_args(x, w, o, out);
  if (a.fp8_activations) {  // the callers round x themselves (quantized_matmul.cu)
    return Status::Error("GEMV: " + w.describe() + " takes FP8 activations, which it has not");
  }
  return visit_activation_pair(x.dtype(), out.dtype(), [&](auto x_tag, auto out_tag) {
    using TX = typename decltype(x_tag)::type;
    using TO = typename decltype(out_tag)::type;
    return visit_reader(w, [&](auto reader_tag) {
      using Reader = typename decltype(reader_tag)::type;
      a.w_vectorized = Reader::vectorizable(a.w);
      a.x_vectorized = a.K % (16 / sizeof(TX)) == 0 && aligned16(x.raw());
      return launch_gemv<Reader, TX, TO>(a);
    });
  });
}

}  // namespace kuiper::cuda
