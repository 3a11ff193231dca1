// out[T, N] = x[T, K] @ w[N, K]^T (+ bias), three paths:
//
//  - T == 1 (decode): a hand-written GEMV. Decode is bound by reading the weights once, so the
//    kernel is built to stream them at memory bandwidth: one warp per output row, 16-byte
//    streaming loads (L1 bypassed: each weight byte is used once), several loads in flight per
//    lane before the first multiply, fp32 accumulation, a warp-shuffle reduction. x is tiny and
//    stays in L1/L2 for the whole grid.
//  - T > 1 with x and w of one type: cublasGemmEx, tensor cores for fp16 (fp32 accumulation),
//    plain fp32 arithmetic for fp32 (no TF32, so fp32 results keep reference accuracy).
//  - T > 1 with mixed types (fp32 x and fp16/bf16 w, or fp16 x and bf16 w): a shared-memory tiled
//    kernel. The model never takes it (it stores matrices in the activation type); it keeps
//    every combination the op layer accepts correct.
#include <cublas_v2.h>

#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// GEMV

constexpr int kGemvWarps = 4;   // rows per block; small blocks keep k/v projections (1024 rows)
                                // spread over every SM
constexpr int kGemvUnroll = 8;  // 16-byte weight loads in flight per lane: a 4096-wide fp16
                                // row is two round trips to memory

// n consecutive elements of T at p (16-byte aligned as a group), widened to fp32 in f.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes % 8 == 0, "vector groups are 8 or 16k bytes");
  if constexpr (kBytes % 16 == 0) {
    uint4 raw[kBytes / 16];
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) raw[i] = reinterpret_cast<const uint4*>(p)[i];
    const T* v = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < N; ++j) f[j] = to_float(v[j]);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < N; ++j) f[j] = to_float(v[j]);
  }
}

template <typename TW, typename TX>
__device__ __forceinline__ float dot_chunk(uint4 w_raw, const TX* x) {
  constexpr int kVec = 16 / sizeof(TW);
  const TW* w = reinterpret_cast<const TW*>(&w_raw);
  float xf[kVec];
  load_floats<TX, kVec>(x, xf);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) s += to_float(w[j]) * xf[j];
  return s;
}

// `vectorized` is uniform per launch: rows and x are 16-byte aligned and K a multiple of the
// vector width. Otherwise (odd K in tests, unaligned views) the scalar loop runs.
template <typename TW, typename TX, typename TO>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const TW* __restrict__ w, const TX* __restrict__ x, const void* bias,
                DataType bias_dtype, TO* __restrict__ out, int64_t N, int64_t K, bool vectorized) {
  constexpr int kVec = 16 / sizeof(TW);
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  if (row >= N) return;
  const TW* w_row = w + row * K;
  float acc = 0.0f;
  if (vectorized) {
    const uint4* wv = reinterpret_cast<const uint4*>(w_row);
    const int64_t chunks = K / kVec;
    int64_t c = lane;
    for (; c + 32 * (kGemvUnroll - 1) < chunks; c += 32 * kGemvUnroll) {
      uint4 raw[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) raw[u] = __ldcs(wv + c + 32 * u);
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) acc += dot_chunk<TW, TX>(raw[u], x + (c + 32 * u) * kVec);
    }
    for (; c < chunks; c += 32) acc += dot_chunk<TW, TX>(__ldcs(wv + c), x + c * kVec);
  } else {
    for (int64_t i = lane; i < K; i += 32) acc += to_float(w_row[i]) * to_float(x[i]);
  }
  acc = warp_sum(acc);
  if (lane == 0) {
    if (bias != nullptr) acc += load_as_float(bias, bias_dtype, row);
    out[row] = from_float<TO>(acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Tiled fallback for mixed types: a 16x16 output tile per block, K in steps of 16 through shared
// memory, one output per thread.

constexpr int kTile = 16;

template <typename TX, typename TW, typename TO>
__global__ void gemm_tiled_kernel(const TX* __restrict__ x, const TW* __restrict__ w,
                                  const void* bias, DataType bias_dtype, TO* __restrict__ out,
                                  int64_t T, int64_t N, int64_t K) {
  __shared__ float xs[kTile][kTile + 1];  // +1: column reads hit distinct banks
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const int64_t w_row = static_cast<int64_t>(blockIdx.x) * kTile + ty;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    xs[ty][tx] = (t < T && k0 + tx < K) ? to_float(x[t * K + k0 + tx]) : 0.0f;
    ws[ty][tx] = (w_row < N && k0 + tx < K) ? to_float(w[w_row * K + k0 + tx]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += xs[ty][kk] * ws[tx][kk];
    __syncthreads();
  }
  if (t < T && n < N) {
    if (bias != nullptr) acc += load_as_float(bias, bias_dtype, n);
    out[t * N + n] = from_float<TO>(acc);
  }
}

// Before a cuBLAS product with bias: out[t, n] = bias[n], then the product adds with beta = 1,
// so the bias joins the fp32 accumulation and fp16 outputs are rounded once.
template <typename TO>
__global__ void broadcast_bias_kernel(const void* bias, DataType bias_dtype, TO* out, int64_t T,
                                      int64_t N) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * N) return;
  out[i] = from_float<TO>(load_as_float(bias, bias_dtype, i % N));
}

// ---------------------------------------------------------------------------------------------
// cuBLAS

const char* cublas_error_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

Status check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Error(std::string(what) + ": " + cublas_error_name(s));
}

// Creates the process's cuBLAS handle, bound to the engine stream with a workspace of our own
// (cuBLAS needs one given explicitly to be captured in a CUDA graph).
Status create_cublas(cublasHandle_t* out) {
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t h = nullptr;
  KUIPER_RETURN_IF_ERROR(check_cublas(cublasCreate(&h), "cublasCreate"));
  KUIPER_RETURN_IF_ERROR(check_cublas(cublasSetStream(h, stream()), "cublasSetStream"));
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(void* workspace, allocator->allocate(kWorkspaceBytes));
  KUIPER_RETURN_IF_ERROR(
      check_cublas(cublasSetWorkspace(h, workspace, kWorkspaceBytes), "cublasSetWorkspace"));
  *out = h;
  return Status::Ok();
}

Result<cublasHandle_t> cublas_handle() {
  static cublasHandle_t handle = nullptr;
  static const Status created = create_cublas(&handle);  // once, thread-safe
  if (!created.ok()) return created;
  return handle;
}

cudaDataType_t cuda_type(DataType t) {
  switch (t) {
    case DataType::kFp16: return CUDA_R_16F;
    case DataType::kBf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

Status gemm_cublas(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  KUIPER_ASSIGN_OR_RETURN(cublasHandle_t handle, cublas_handle());
  float beta = 0.0f;
  if (bias != nullptr) {
    KUIPER_RETURN_IF_ERROR(visit_activation(out.dtype(), [&](auto tag) {
      using TO = typename decltype(tag)::type;
      broadcast_bias_kernel<TO><<<blocks_for(T * N, 256), 256, 0, stream()>>>(
          bias->raw(), bias->dtype(), out.data<TO>(), T, N);
      KUIPER_CUDA_CHECK_LAUNCH("bias broadcast kernel");
      return Status::Ok();
    }));
    beta = 1.0f;
  }
  // Row-major out[T, N] is column-major out^T[N, T] = w[N, K] (column-major K x N, transposed)
  // times x^T (column-major K x T).
  const float alpha = 1.0f;
  return check_cublas(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T),
                   static_cast<int>(K), &alpha, w.raw(), cuda_type(w.dtype()), static_cast<int>(K),
                   x.raw(), cuda_type(x.dtype()), static_cast<int>(K), &beta, out.raw(),
                   cuda_type(out.dtype()), static_cast<int>(N), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  if (T == 0 || N == 0) return Status::Ok();
  const void* bias_ptr = bias != nullptr ? bias->raw() : nullptr;
  const DataType bias_dtype = bias != nullptr ? bias->dtype() : DataType::kFp32;
  if (T > 1 && x.dtype() == w.dtype()) return gemm_cublas(x, w, bias, out);
  return visit_activation(x.dtype(), [&](auto x_tag) {
    using TX = typename decltype(x_tag)::type;
    return visit_float(w.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      // out is x's type or fp32; both cases share one template, picked here.
      auto launch = [&](auto out_tag) {
        using TO = typename decltype(out_tag)::type;
        if (T == 1) {
          constexpr int64_t kVec = 16 / sizeof(TW);
          const bool vectorized = K % kVec == 0 && aligned16(w.raw()) && aligned16(x.raw());
          gemv_kernel<TW, TX, TO><<<blocks_for(N, kGemvWarps), kGemvWarps * 32, 0, stream()>>>(
              w.data<TW>(), x.data<TX>(), bias_ptr, bias_dtype, out.data<TO>(), N, K,
              vectorized);
          KUIPER_CUDA_CHECK_LAUNCH("gemv kernel");
        } else {
          const dim3 grid(blocks_for(N, kTile), blocks_for(T, kTile));
          gemm_tiled_kernel<TX, TW, TO><<<grid, dim3(kTile, kTile), 0, stream()>>>(
              x.data<TX>(), w.data<TW>(), bias_ptr, bias_dtype, out.data<TO>(), T, N, K);
          KUIPER_CUDA_CHECK_LAUNCH("tiled matmul kernel");
        }
        return Status::Ok();
      };
      if (out.dtype() == DataType::kFp32) return launch(TypeTag<float>{});
      return launch(TypeTag<TX>{});
    });
  });
}

}  // namespace kuiper::cuda
