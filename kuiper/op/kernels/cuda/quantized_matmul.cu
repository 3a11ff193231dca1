// Quantized weights on the GPU (kuiper/op/weight.h):
//
//  - up to 8 rows of x (decode, one sequence or a small batch): the tensor-core GEMV of
//    gemv_mma.cuh, which turns the packed weights into 16-bit pairs in registers as it streams
//    them, once for all the rows, in every fused form; up to 16 rows in launches of 8 where x's
//    rows leave room for that (kMmaGemvMaxBatch); where it does not apply (fp32 x, scale
//    groups narrower than its super-step), up to kRowwiseGemvMax rows one at a time through the
//    GEMV of gemv.cuh with the format's reader (weight_readers.cuh);
//  - many rows: a large block-wise FP8 weight on the FP8 tensor cores (fp8_block_gemm.cu, sm_90);
//    otherwise the weight is dequantized into a scratch matrix of x's dtype and multiplied by
//    cuBLAS (matmul.cu's path for plain weights);
//  - FP8 activations (weight.h): the tensor-core GEMV and the FP8 GEMM round x themselves; any
//    other path gets x rounded into a scratch of its dtype first (round_to_fp8_groups_kernel);
//  - op::dequantize (that dequantizing kernel) and op::quantize, bit for bit the CPU reference's
//    arithmetic (kernels/cpu/quantize.cpp): the same fp32 divisions, rint with ties to even, the
//    fp16 rounding of the integer scales and the E4M3 rounding of base/dtype.cpp.
#include <cmath>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/fp8_activations.cuh"
#include "kuiper/op/kernels/cuda/gemv.cuh"
#include "kuiper/op/kernels/cuda/gemv_mma.cuh"
#include "kuiper/op/kernels/cuda/weight_readers.cuh"

namespace kuiper::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Dequantize: out[N, K] = w's values. One thread per 16-byte chunk (kVec outputs, stored 16 bytes
// at a time) where the reader's chunks apply, else one per element.

template <typename Reader, typename TO>
__global__ void dequantize_chunks_kernel(const WeightView v, TO* __restrict__ out, int64_t N) {
  constexpr int kVec = Reader::kVec;
  const int64_t chunks = v.K / kVec;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * chunks) return;
  const int64_t n = i / chunks, c = i % chunks;
  const Reader reader(v);
  const typename Reader::Row row = reader.row(n);
  const uint4 raw = __ldcs(Reader::chunk(row, c));
  const typename Reader::Meta m = reader.meta(row, c);
  float w[kVec];
  unscaled<Reader>(raw, m, w);
  const float s = Reader::scale(m);
  // kVec * sizeof(TO) is a multiple of 16 for every reader and TO (kVec >= 8 for 16-bit TO).
  constexpr int kStores = kVec * static_cast<int>(sizeof(TO)) / 16;
  constexpr int kPerStore = 16 / static_cast<int>(sizeof(TO));
  uint4* dst = reinterpret_cast<uint4*>(out + n * v.K + c * kVec);
#pragma unroll
  for (int st = 0; st < kStores; ++st) {
    uint4 packed;
    TO* p = reinterpret_cast<TO*>(&packed);
#pragma unroll
    for (int j = 0; j < kPerStore; ++j) p[j] = from_float<TO>(w[st * kPerStore + j] * s);
    dst[st] = packed;
  }
}

template <typename Reader, typename TO>
__global__ void dequantize_elements_kernel(const WeightView v, TO* __restrict__ out, int64_t N) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * v.K) return;
  const Reader reader(v);
  out[i] = from_float<TO>(reader.at(reader.row(i / v.K), i % v.K));
}

Status dequantize_into(const op::Weight& w, Tensor& out) {
  const WeightView v = weight_view(w);
  const int64_t N = w.rows();
  if (N == 0 || v.K == 0) return Status::Ok();
  const auto visit = [&](auto&& fn) {
    return w.quantized() ? visit_quantized_reader(w, fn) : visit_plain_reader(w, fn);
  };
  return visit([&](auto reader_tag) {
    using Reader = typename decltype(reader_tag)::type;
    return visit_float(out.dtype(), [&](auto out_tag) {
      using TO = typename decltype(out_tag)::type;
      constexpr int kThreads = 256;
      if (Reader::vectorizable(v) && aligned16(out.raw())) {
        dequantize_chunks_kernel<Reader, TO>
            <<<blocks_for(N * (v.K / Reader::kVec), kThreads), kThreads, 0, stream()>>>(
                v, out.data<TO>(), N);
      } else {
        dequantize_elements_kernel<Reader, TO>
            <<<blocks_for(N * v.K, kThreads), kThreads, 0, stream()>>>(v, out.data<TO>(), N);
      }
      KUIPER_CUDA_CHECK_LAUNCH("dequantize kernel");
      return Status::Ok();
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Tile (weight.h): one thread a 16-byte unit of the row-major values, stored where the tiled
// layout puts it.

__global__ void tile_kernel(const uint4* __restrict__ rows, uint4* __restrict__ tiled, int64_t N,
                            int64_t R) {
  const int64_t units = R / 16;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * units) return;
  const int64_t n = i / units, b = (i % units) * 16;
  tiled[((n / 8) * 8 * R + (b / 64) * 512 + (n % 8) * 64 + b % 64) / 16] = rows[i];
}

}  // namespace

Status tile(op::Weight& w) {
  const int64_t N = w.values.dim(0), R = w.values.dim(1);
  KUIPER_ASSIGN_OR_RETURN(Tensor rows, Tensor::empty(w.values.shape(), w.values.dtype(),
                                                     w.values.device()));
  KUIPER_RETURN_IF_ERROR(rows.copy_from(w.values));
  constexpr int kThreads = 256;
  tile_kernel<<<blocks_for(N * (R / 16), kThreads), kThreads, 0, stream()>>>(
      rows.data<uint4>(), w.values.data<uint4>(), N, R);
  KUIPER_CUDA_CHECK_LAUNCH("tile kernel");
  KUIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));  // before the row-major copy is freed
  w.tiled = true;
  return Status::Ok();
}

namespace {

// ---------------------------------------------------------------------------------------------
// Quantize

// base/dtype.cpp's float_to_fp8_e4m3, statement for statement: nearest, ties to even, saturating
// at 448 (the hardware conversion agrees on finite values but the reference is the definition).
__device__ uint8_t float_to_fp8_e4m3_device(float f) {
  const uint8_t sign = signbit(f) ? 0x80u : 0x00u;
  if (isnan(f)) return sign | 0x7fu;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7eu;
  if (a < 0.015625f) return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  int e = 0;
  const float m = frexpf(a, &e);
  int exp = e - 1 + 7;
  int mant = static_cast<int>(rintf((2.0f * m - 1.0f) * 8.0f));
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7eu;
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

constexpr int kQuantizeThreads = 256;

// kFp8: one block per scale block: its amax, then its codes (the second pass reads the block from
// L1/L2).
template <typename TW>
__global__ void quantize_fp8_kernel(const TW* __restrict__ w, const WeightView v, int64_t N,
                                    uint8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ float shared[kQuantizeThreads / 32];
  const int64_t K = v.K;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * v.block_rows;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * v.block_cols;
  const int64_t rows = min(v.block_rows, N - n0), cols = min(v.block_cols, K - k0);
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * cols; i += kQuantizeThreads) {
    amax = fmaxf(amax, fabsf(to_float(w[(n0 + i / cols) * K + k0 + i % cols])));
  }
  amax = block_reduce<kQuantizeThreads, true>(amax, shared);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) scales[blockIdx.y * v.scale_cols + blockIdx.x] = scale;
  for (int64_t i = threadIdx.x; i < rows * cols; i += kQuantizeThreads) {
    const int64_t at = (n0 + i / cols) * K + k0 + i % cols;
    codes[at] = float_to_fp8_e4m3_device(to_float(w[at]) / scale);
  }
}

// kInt8 / kInt4: one warp per group of a row; for kInt4 each lane packs column pairs into bytes.
template <typename TW, int kBits>
__global__ void quantize_int_kernel(const TW* __restrict__ w, const WeightView v, int64_t N,
                                    uint8_t* __restrict__ codes, __half* __restrict__ scales,
                                    uint8_t* __restrict__ zeros) {
  constexpr float kQmax = kBits == 8 ? 255.0f : 15.0f;
  const int lane = threadIdx.x % 32;
  const int64_t item =
      static_cast<int64_t>(blockIdx.x) * (kQuantizeThreads / 32) + threadIdx.x / 32;
  if (item >= N * v.scale_cols) return;
  const int64_t n = item / v.scale_cols, g = item % v.scale_cols;
  const int64_t group = v.block_cols;
  const TW* x = w + n * v.K + g * group;
  float lo = 0.0f, hi = 0.0f;
  for (int64_t k = lane; k < group; k += 32) {
    const float f = to_float(x[k]);
    lo = fminf(lo, f);
    hi = fmaxf(hi, f);
  }
  lo = -warp_max(-lo);
  hi = warp_max(hi);
  __half s16 = __float2half_rn((hi - lo) / kQmax);
  if (__half2float(s16) == 0.0f) s16 = __float2half_rn(1.0f);
  const float s = __half2float(s16);
  const float z = fminf(fmaxf(rintf(-lo / s), 0.0f), kQmax);
  if (lane == 0) {
    scales[item] = s16;
    zeros[item] = static_cast<uint8_t>(z);
  }
  const auto code = [&](int64_t k) {
    return static_cast<uint32_t>(fminf(fmaxf(rintf(to_float(x[k]) / s) + z, 0.0f), kQmax));
  };
  uint8_t* out = codes + n * v.row_bytes;
  if constexpr (kBits == 8) {
    for (int64_t k = lane; k < group; k += 32) out[g * group + k] = static_cast<uint8_t>(code(k));
  } else {
    for (int64_t p = lane; p < group / 2; p += 32) {
      out[(g * group) / 2 + p] = static_cast<uint8_t>(code(2 * p) | (code(2 * p + 1) << 4));
    }
  }
}

Status quantize_into(const Tensor& w, op::Weight& out) {
  const WeightView v = weight_view(out);
  const int64_t N = out.rows();
  if (N == 0 || v.K == 0) return Status::Ok();
  return visit_float(w.dtype(), [&](auto tag) {
    using TW = typename decltype(tag)::type;
    if (out.format == op::WeightFormat::kFp8) {
      const dim3 grid(static_cast<unsigned>(out.scales.dim(1)),
                      static_cast<unsigned>(out.scales.dim(0)));
      quantize_fp8_kernel<TW><<<grid, kQuantizeThreads, 0, stream()>>>(
          w.data<TW>(), v, N, out.values.data<uint8_t>(), out.scales.data<float>());
    } else {
      const unsigned blocks = blocks_for(N * v.scale_cols, kQuantizeThreads / 32);
      auto* scales = static_cast<__half*>(out.scales.raw());
      if (out.format == op::WeightFormat::kInt8) {
        quantize_int_kernel<TW, 8><<<blocks, kQuantizeThreads, 0, stream()>>>(
            w.data<TW>(), v, N, out.values.data<uint8_t>(), scales, out.zeros.data<uint8_t>());
      } else {
        quantize_int_kernel<TW, 4><<<blocks, kQuantizeThreads, 0, stream()>>>(
            w.data<TW>(), v, N, out.values.data<uint8_t>(), scales, out.zeros.data<uint8_t>());
      }
    }
    KUIPER_CUDA_CHECK_LAUNCH("quantize kernel");
    return Status::Ok();
  });
}

// ---------------------------------------------------------------------------------------------
// FP8 activations where the product cannot round x itself: out[T, K] = x rounded to FP8 a group
// at a time (weight.h), each value float(q) * s in x's dtype. One warp per (row, group).

template <typename TX>
__global__ void round_to_fp8_groups_kernel(const TX* __restrict__ x, int64_t T, int64_t K,
                                           TX* __restrict__ out) {
  constexpr int kPerLane = kFp8Group / 32;
  const int64_t groups = K / kFp8Group;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (item >= T * groups) return;  // whole warps: blockDim.x is a multiple of 32
  const int lane = threadIdx.x % 32;
  const int64_t at = (item / groups) * K + (item % groups) * kFp8Group + lane;
  float v[kPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    v[e] = to_float(x[at + 32 * e]);
    amax = fmaxf(amax, fabsf(v[e]));
  }
  amax = warp_max(amax);
  const float s = fp8_group_scale(amax), inv = fp8_group_inverse(amax);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    out[at + 32 * e] = from_float<TX>(fp8_value(fp8_code(v[e], inv)) * s);
  }
}

Result<Tensor> round_to_fp8_groups(const Tensor& x) {
  KUIPER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(x.shape(), x.dtype(), DeviceType::kCuda));
  const int64_t T = x.dim(0), K = x.dim(1);
  KUIPER_RETURN_IF_ERROR(visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    constexpr int kThreads = 256;
    round_to_fp8_groups_kernel<TX>
        <<<blocks_for(T * (K / kFp8Group), kThreads / 32), kThreads, 0, stream()>>>(
            x.data<TX>(), T, K, out.data<TX>());
    KUIPER_CUDA_CHECK_LAUNCH("FP8 activation rounding kernel");
    return Status::Ok();
  }));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Products

// Up to this many rows of x, one GEMV per row (the packed weights read once a row, in every fused
// form) beats dequantizing the whole matrix and one GEMM. Measured on the H100 with Qwen3-8B
// shapes and bf16 x (kuiper-bench --matmul-only --quantize F: rowwise_us against dequantize_us
// plus the bf16 GEMM's small_batch_us), 4 rows: FP8 gate/up 88 us against 58 + 38, q_proj 15
// against 21 + 17, down 121 against 58 + 40; int4 gate/up 87 against 80 + 38; at 8 rows the GEMM
// path wins everywhere but the 4096 x 4096 matrices.
constexpr int64_t kRowwiseGemvMax = 4;

Result<bool> quantized_gemv_mma(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                                Tensor& out) {
  return gemv_mma(x, w, o, out, [](const op::Weight& weight, auto&& fn) {
    return visit_quantized_reader(weight, fn);
  });
}

Status quantized_gemv(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                      Tensor& out) {
  for (int64_t t = 0; t < x.dim(0); ++t) {
    Tensor x_row = x.rows(t, 1), out_row = out.rows(t, 1);
    KUIPER_RETURN_IF_ERROR(gemv(x_row, w, o, out_row, [](const op::Weight& weight, auto&& fn) {
      return visit_quantized_reader(weight, fn);
    }));
  }
  return Status::Ok();
}

}  // namespace

Status quantized_matmul(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out) {
  const int64_t T = x.dim(0);
  if (T == 0 || w.rows() == 0) return Status::Ok();
  op::LinearOptions o;
  o.bias = bias;
  KUIPER_ASSIGN_OR_RETURN(const bool mma, quantized_gemv_mma(x, w, o, out));
  if (mma) return Status::Ok();
  if (w.fp8_activations) {  // one FP8 GEMM where there is one, else x rounded first
    KUIPER_ASSIGN_OR_RETURN(const bool fp8, fp8_block_gemm(x, w, bias, out));
    if (fp8) return Status::Ok();
    KUIPER_ASSIGN_OR_RETURN(const Tensor rounded, round_to_fp8_groups(x));
    op::Weight as_given = w;
    as_given.fp8_activations = false;
    return quantized_matmul(rounded, as_given, bias, out);
  }
  if (T <= kRowwiseGemvMax) return quantized_gemv(x, w, o, out);
  // Many rows of a large block-wise FP8 weight: the FP8 tensor cores (fp8_block_gemm.cu), where
  // the GPU has cuBLASLt's block-scaled GEMM.
  KUIPER_ASSIGN_OR_RETURN(const bool fp8, fp8_block_gemm(x, w, bias, out));
  if (fp8) return Status::Ok();
  // Many rows otherwise: dequantize to x's dtype, then the plain path (cuBLAS on tensor cores for
  // 16-bit x). The scratch matrix comes from the caching allocator, so repeated calls reuse it.
  // Measured on the H100 at T = 512 (Qwen3-8B shapes, bf16 x): FP8 375-412 TFLOP/s against bf16
  // cuBLAS's 685-733, the dequantization (58 us of 129 for gate/up, near copy bandwidth: 1 byte
  // read and 2 written per weight) being the difference.
  KUIPER_ASSIGN_OR_RETURN(Tensor plain,
                          Tensor::empty({w.rows(), w.cols()}, x.dtype(), DeviceType::kCuda));
  KUIPER_RETURN_IF_ERROR(dequantize_into(w, plain));
  return cuda::matmul(x, op::Weight(plain), bias, out);
}

Result<bool> quantized_linear(const Tensor& x, const op::Weight& w,
                              const op::LinearOptions& options, Tensor& out) {
  if (x.dim(0) == 0 || out.dim(1) == 0) return true;
  KUIPER_ASSIGN_OR_RETURN(const bool mma, quantized_gemv_mma(x, w, options, out));
  if (mma) return true;
  // Many rows, or x to be rounded to FP8 after the norm: the composition, whose matmuls
  // dequantize each row range once.
  if (x.dim(0) > kRowwiseGemvMax || w.fp8_activations) return false;
  KUIPER_RETURN_IF_ERROR(quantized_gemv(x, w, options, out));
  return true;
}

Status dequantize(const op::Weight& w, Tensor& out) { return dequantize_into(w, out); }

Status quantize(const Tensor& w, op::Weight& out) { return quantize_into(w, out); }

}  // namespace kuiper::cuda
