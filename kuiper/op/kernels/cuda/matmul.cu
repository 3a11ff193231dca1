// out[T, N] = x[T, K] @ w[N, K]^T (+ bias), three paths:
//
//  - T == 1 (decode): the hand-written GEMV (gemv.cuh, shared with the quantized weights), which
//    also runs op::linear's fused forms (RMSNorm of x, SwiGLU over stacked gate/up rows,
//    residual add).
//  - T == 2 and a plain 16-bit w: the two-row GEMV (gemv_rows.cuh), every fused form.
//  - 3 to 8 rows and a plain 16-bit w: the multi-row tensor-core GEMV (gemv_rows_mma.cuh), every
//    fused form; past about 7000 columns each tile is split over several blocks, each staging its
//    part of x's rows (split_k.cuh).
//  - T > 1 with x and w of one type: cublasGemmEx, tensor cores for fp16 and bf16 (fp32
//    accumulation), plain fp32 arithmetic for fp32 (no TF32, so fp32 results keep reference
//    accuracy).
//  - T > 1 with mixed types (fp32 x and fp16/bf16 w, or fp16 x and bf16 w and the reverse): a
//    shared-memory tiled kernel. The model never takes it (it stores matrices in the activation
//    type); it keeps every combination the op layer accepts correct.

#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/cublas_library.h"
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/gemv.cuh"
#include "kuiper/op/kernels/cuda/gemv_rows.cuh"
#include "kuiper/op/kernels/cuda/gemv_rows_mma.cuh"

namespace kuiper::cuda {

namespace {

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

// broadcast_bias (cuda_kernels.h).
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
  KUIPER_ASSIGN_OR_RETURN(const CublasLibrary* cublas, cublas_library());
  cublasHandle_t h = nullptr;
  KUIPER_RETURN_IF_ERROR(check_cublas(cublas->cublasCreate(&h), "cublasCreate"));
  KUIPER_RETURN_IF_ERROR(check_cublas(cublas->cublasSetStream(h, stream()), "cublasSetStream"));
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(void* workspace, allocator->allocate(kWorkspaceBytes));
  KUIPER_RETURN_IF_ERROR(check_cublas(cublas->cublasSetWorkspace(h, workspace, kWorkspaceBytes),
                                      "cublasSetWorkspace"));
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

}  // namespace

Status broadcast_bias(const Tensor& bias, Tensor& out) {
  const int64_t T = out.dim(0), N = out.dim(1);
  return visit_activation(out.dtype(), [&](auto tag) {
    using TO = typename decltype(tag)::type;
    broadcast_bias_kernel<TO><<<blocks_for(T * N, 256), 256, 0, stream()>>>(
        bias.raw(), bias.dtype(), out.data<TO>(), T, N);
    KUIPER_CUDA_CHECK_LAUNCH("bias broadcast kernel");
    return Status::Ok();
  });
}

namespace {

// accumulate: out += x w^T (beta = 1), the residual form; no bias then.
Status gemm_cublas(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                   bool accumulate = false) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  KUIPER_ASSIGN_OR_RETURN(cublasHandle_t handle, cublas_handle());
  KUIPER_ASSIGN_OR_RETURN(const CublasLibrary* cublas, cublas_library());
  float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr) {
    KUIPER_RETURN_IF_ERROR(broadcast_bias(*bias, out));
    beta = 1.0f;
  }
  // Row-major out[T, N] is column-major out^T[N, T] = w[N, K] (column-major K x N, transposed)
  // times x^T (column-major K x T).
  const float alpha = 1.0f;
  return check_cublas(
      cublas->cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                           static_cast<int>(T), static_cast<int>(K), &alpha, w.raw(),
                           cuda_type(w.dtype()), static_cast<int>(K), x.raw(),
                           cuda_type(x.dtype()), static_cast<int>(K), &beta, out.raw(),
                           cuda_type(out.dtype()), static_cast<int>(N), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

// The GEMV of a plain weight.
Status plain_gemv(const Tensor& x, const op::Weight& w, const op::LinearOptions& o, Tensor& out) {
  return gemv(x, w, o, out,
              [](const op::Weight& weight, auto&& fn) { return visit_plain_reader(weight, fn); });
}

// Two rows of x and a plain 16-bit weight through the two-row GEMV (gemv_rows.cuh); false where
// it does not apply.
Result<bool> plain_gemv_rows(const Tensor& x, const op::Weight& w, const op::LinearOptions& o,
                             Tensor& out) {
  return gemv_rows(x, w, o, out, [](const op::Weight& weight, auto&& fn) {
    return visit_plain_reader(weight, fn);
  });
}

// 3 to 8 rows of x and a plain 16-bit weight through the multi-row tensor-core GEMV
// (gemv_rows_mma.cuh); false where it does not apply.
Result<bool> plain_gemv_rows_mma(const Tensor& x, const op::Weight& w,
                                 const op::LinearOptions& o, Tensor& out) {
  return gemv_rows_mma(x, w, o, out, [](const op::Weight& weight, auto&& fn) {
    return visit_plain_reader(weight, fn);
  });
}

}  // namespace

Status matmul(const Tensor& x, const op::Weight& weight, const Tensor* bias, Tensor& out) {
  if (weight.quantized()) return quantized_matmul(x, weight, bias, out);
  const Tensor& w = weight.values;
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  if (T == 0 || N == 0) return Status::Ok();
  if (T == 1) {
    op::LinearOptions o;
    o.bias = bias;
    return plain_gemv(x, weight, o, out);
  }
  if (T == kRowsGemvRows || (T >= kRowsMmaMinRows && T <= kRowsMmaMaxRows)) {
    op::LinearOptions o;
    o.bias = bias;
    KUIPER_ASSIGN_OR_RETURN(const bool ran, T == kRowsGemvRows
                                                ? plain_gemv_rows(x, weight, o, out)
                                                : plain_gemv_rows_mma(x, weight, o, out));
    if (ran) return Status::Ok();
  }
  if (x.dtype() == w.dtype()) return gemm_cublas(x, w, bias, out);
  const void* bias_ptr = bias != nullptr ? bias->raw() : nullptr;
  const DataType bias_dtype = bias != nullptr ? bias->dtype() : DataType::kFp32;
  return visit_activation(x.dtype(), [&](auto x_tag) {
    using TX = typename decltype(x_tag)::type;
    return visit_float(w.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      // out is x's type or fp32; both cases share one template, picked here.
      auto launch = [&](auto out_tag) {
        using TO = typename decltype(out_tag)::type;
        const dim3 grid(blocks_for(N, kTile), blocks_for(T, kTile));
        gemm_tiled_kernel<TX, TW, TO><<<grid, dim3(kTile, kTile), 0, stream()>>>(
            x.data<TX>(), w.data<TW>(), bias_ptr, bias_dtype, out.data<TO>(), T, N, K);
        KUIPER_CUDA_CHECK_LAUNCH("tiled matmul kernel");
        return Status::Ok();
      };
      if (out.dtype() == DataType::kFp32) return launch(TypeTag<float>{});
      return launch(TypeTag<TX>{});
    });
  });
}

Result<bool> linear(const Tensor& x, const op::Weight& weight, const op::LinearOptions& o,
                    Tensor& out) {
  if (weight.quantized()) return quantized_linear(x, weight, o, out);
  const Tensor& w = weight.values;
  const int64_t T = x.dim(0);
  if (T == 0 || out.dim(1) == 0) return true;
  if (T == 1) {
    KUIPER_RETURN_IF_ERROR(plain_gemv(x, weight, o, out));
    return true;
  }
  if (T == kRowsGemvRows || (T >= kRowsMmaMinRows && T <= kRowsMmaMaxRows)) {
    KUIPER_ASSIGN_OR_RETURN(const bool ran, T == kRowsGemvRows
                                                ? plain_gemv_rows(x, weight, o, out)
                                                : plain_gemv_rows_mma(x, weight, o, out));
    if (ran) return true;
  }
  // Many rows: only the residual form has a cheaper path than the composition (cuBLAS adds the
  // product into out with beta = 1, in fp32 for an fp32 out).
  if (o.residual && o.norm == nullptr && o.bias == nullptr && !o.swiglu &&
      x.dtype() == w.dtype()) {
    KUIPER_RETURN_IF_ERROR(gemm_cublas(x, w, nullptr, out, /*accumulate=*/true));
    return true;
  }
  return false;
}

bool linear_fuses(int64_t T, int64_t K, const op::Weight& w) {
  if (T == 1) return true;
  if (w.quantized() || dtype_size(w.values.dtype()) != 2) return false;
  return gemv_rows_fits(T, K) || gemv_rows_mma_fits(T, K, w.values.dim(0));
}

}  // namespace kuiper::cuda
