// out[T, N] = x[T, K] @ w[N, K]^T (+ bias), three paths:
//
//  - T == 1 (decode): a hand-written GEMV (see the GEMV section), which also runs op::linear's
//    fused forms (RMSNorm of x, SwiGLU over stacked gate/up rows, residual add).
//  - T > 1 with x and w of one type: cublasGemmEx, tensor cores for fp16 and bf16 (fp32
//    accumulation), plain fp32 arithmetic for fp32 (no TF32, so fp32 results keep reference
//    accuracy).
//  - T > 1 with mixed types (fp32 x and fp16/bf16 w, or fp16 x and bf16 w and the reverse): a
//    shared-memory tiled kernel. The model never takes it (it stores matrices in the activation
//    type); it keeps every combination the op layer accepts correct.
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <utility>

#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/tuning_log.h"

namespace kuiper::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// GEMV
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
//    wait (138 -> 146 tok/s).
// Fused forms (op::linear): the RMSNorm of x (every block stages x times the norm weight and
// scales the dot products by 1 / rms at the end; the normalised x is not rounded to the
// activation type as the rmsnorm kernel would store it), SwiGLU over stacked [gate; up] rows (the
// warp's two rows are gate row n and up row n), and a residual add into out. x is read as TX and
// out written as TO: fp32 x (the residual stream) into 16-bit out for the norm forms, 16-bit x
// into an fp32 residual out, whose sum then sees the product in fp32.

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
// kUnroll, a template argument: 16-byte loads in flight per lane and row. 8 (126 registers, 2
// blocks per SM) everywhere, except where a launch has between one and two SM-fuls of such
// blocks (q/k/v: 384 blocks, 264 fit at once on an H100): there the 4-load form, capped at 64
// registers so that 4 blocks fit per SM, runs it in one wave instead of 1.45.

struct GemvArgs {
  const void* w;
  const void* x;
  const void* norm;  // RMSNorm weight [K] or null
  DataType norm_dtype;
  float eps;
  const void* bias;  // [rows of w] or null
  DataType bias_dtype;
  void* out;  // [N]; with residual it also holds the residual
  int64_t N;  // outputs
  int64_t K;
  int64_t up_offset;  // swiglu: first up row (= N); 0 otherwise
  bool w_vectorized;  // w rows 16-byte aligned and K a multiple of the vector width
  bool x_vectorized;
  bool residual;
  bool swiglu;
};

// Dot product of one 16-byte chunk of weights with the fp32 x values it meets (16-byte aligned).
template <typename TW>
__device__ __forceinline__ float dot_chunk(uint4 w_raw, const float* xs) {
  constexpr int kVec = 16 / sizeof(TW);
  const TW* w = reinterpret_cast<const TW*>(&w_raw);
  float xf[kVec];
#pragma unroll
  for (int i = 0; i < kVec / 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(xs)[i];
    xf[4 * i] = v.x;
    xf[4 * i + 1] = v.y;
    xf[4 * i + 2] = v.z;
    xf[4 * i + 3] = v.w;
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) s += to_float(w[j]) * xf[j];
  return s;
}

// Fills xs[0, K) with x in fp32, times the RMSNorm weight when there is one, and each warp's
// share of sum(x^2) in sumsq[warp]; ends with a barrier. The 1 / rms factor is applied to the
// finished dot products instead (gemv_inv_rms), so staging is one pass: x and the norm weight are
// loaded together, and no second barrier waits for the block's sum before the main loop.
template <typename TX>
__device__ void stage_x(const GemvArgs& a, float* xs, float* sumsq) {
  const TX* x = static_cast<const TX*>(a.x);
  const int64_t K = a.K;
  const bool norm = a.norm != nullptr;
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
        reinterpret_cast<float4*>(xs + c * kVecX)[j / 4] = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
      }
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kGemvThreads) {
      const float v = to_float(x[k]);
      local += v * v;
      xs[k] = norm ? v * load_as_float(a.norm, a.norm_dtype, k) : v;
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
  return 1.0f / sqrtf(total / static_cast<float>(a.K) + a.eps);
}

template <typename TW, typename TX, typename TO, int kGemvUnroll>
__global__ void __launch_bounds__(kGemvThreads, kGemvUnroll >= 8 ? 2 : 4)
    gemv_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) float xs[];
  constexpr int kVec = 16 / sizeof(TW);
  const int lane = threadIdx.x % 32;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  // The warp's two rows of w and whether each exists.
  int64_t row[2];
  bool valid[2];
  if (a.swiglu) {
    row[0] = group;
    row[1] = group + a.up_offset;
    valid[0] = valid[1] = group < a.N;
  } else {
    row[0] = 2 * group;
    row[1] = 2 * group + 1;
    valid[0] = row[0] < a.N;
    valid[1] = row[1] < a.N;
  }
  const TW* w = static_cast<const TW*>(a.w);
  const int64_t K = a.K;
  const int64_t chunks = a.w_vectorized ? K / kVec : 0;
  const uint4* wv[2] = {reinterpret_cast<const uint4*>(w + (valid[0] ? row[0] : 0) * K),
                        reinterpret_cast<const uint4*>(w + (valid[1] ? row[1] : 0) * K)};
  uint4 raw[2][kGemvUnroll];
  auto load = [&](int64_t c0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (valid[r] && c < chunks) raw[r][u] = __ldcs(wv[r] + c);
      }
    }
  };
  load(lane);  // weights only: safe before the previous kernel has finished
  grid_dependency_wait();
  grid_launch_dependents();
  __shared__ float sumsq[kGemvWarps];
  stage_x<TX>(a, xs, sumsq);

  float acc[2] = {0.0f, 0.0f};
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kGemvUnroll) {
    if (c0 != lane) load(c0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (valid[r] && c < chunks) acc[r] += dot_chunk<TW>(raw[r][u], xs + c * kVec);
      }
    }
  }
  if (!a.w_vectorized) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!valid[r]) continue;
      const TW* w_row = w + row[r] * K;
      for (int64_t k = lane; k < K; k += 32) acc[r] += to_float(w_row[k]) * xs[k];
    }
  }
  acc[0] = warp_sum(acc[0]);
  acc[1] = warp_sum(acc[1]);
  if (lane != 0) return;
  if (a.norm != nullptr) {
    const float inv = gemv_inv_rms(a, sumsq);
    acc[0] *= inv;
    acc[1] *= inv;
  }
  TO* out = static_cast<TO*>(a.out);
  // Every intermediate is rounded to TO where the unfused ops would store it (not at all for an
  // fp32 out: a product past fp16's range reaches an fp32 residual intact).
  auto finish = [&](int r) {
    float v = acc[r];
    if (a.bias != nullptr) v += load_as_float(a.bias, a.bias_dtype, row[r]);
    return to_float(from_float<TO>(v));
  };
  if (a.swiglu) {
    if (!valid[0]) return;
    const float g = finish(0), u = finish(1);
    out[group] = from_float<TO>(g / (1.0f + expf(-g)) * u);
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    float v = finish(r);
    if (a.residual) v = to_float(out[row[r]]) + v;
    out[row[r]] = from_float<TO>(v);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks of gemv_kernel<..., kUnroll> that fit on the current GPU at once with `smem` bytes of x:
// an occupancy query, cached per device and size.
template <typename TW, typename TX, typename TO, int kUnroll>
Result<int64_t> gemv_fit(int64_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, int64_t>, int64_t> fits;
  int device = 0;
  KUIPER_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = fits.find({device, smem});
  if (found != fits.end()) return found->second;
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  int per_sm = 0;
  KUIPER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, gemv_kernel<TW, TX, TO, kUnroll>, kGemvThreads, static_cast<size_t>(smem)));
  const int64_t fit = static_cast<int64_t>(sms) * per_sm;
  fits.emplace(std::make_pair(device, smem), fit);
  return fit;
}

template <typename TW, typename TX, typename TO, int kUnroll>
Status launch_gemv_unrolled(const GemvArgs& a, int64_t blocks, int64_t smem) {
  return launch_pdl(gemv_kernel<TW, TX, TO, kUnroll>, dim3(static_cast<unsigned>(blocks)),
                    dim3(kGemvThreads), static_cast<size_t>(smem), "gemv kernel launch", a);
}

template <typename TW, typename TX, typename TO>
Status launch_gemv(const GemvArgs& a) {
  constexpr int64_t kMaxSmem = 200 * 1024;
  const int64_t smem = a.K * static_cast<int64_t>(sizeof(float));
  if (smem > kMaxSmem) {
    return Status::Error("GEMV: K = " + std::to_string(a.K) + " does not fit in shared memory");
  }
  // Past 48 KB (static shared memory included) a kernel must opt in.
  if (smem > 40 * 1024) {
    KUIPER_RETURN_IF_ERROR((allow_shared_memory<gemv_kernel<TW, TX, TO, 8>>(kMaxSmem)));
    KUIPER_RETURN_IF_ERROR((allow_shared_memory<gemv_kernel<TW, TX, TO, 4>>(kMaxSmem)));
  }
  const int64_t groups = a.swiglu ? a.N : (a.N + 1) / 2;
  const int64_t blocks = (groups + kGemvWarps - 1) / kGemvWarps;
  KUIPER_ASSIGN_OR_RETURN(const int64_t fit8, (gemv_fit<TW, TX, TO, 8>(smem)));
  int64_t fit4 = 0;
  if (blocks > fit8) {
    KUIPER_ASSIGN_OR_RETURN(fit4, (gemv_fit<TW, TX, TO, 4>(smem)));
  }
  const bool one_wave_of_4 = blocks > fit8 && blocks <= fit4;
  KUIPER_LOG_TUNING("GEMV N " + std::to_string(a.N) + " K " + std::to_string(a.K) + ": " +
                    std::to_string(blocks) + " blocks, " + (one_wave_of_4 ? "4" : "8") +
                    " loads in flight a row (" + std::to_string(fit8) + " blocks fit with 8)");
  if (one_wave_of_4) return launch_gemv_unrolled<TW, TX, TO, 4>(a, blocks, smem);
  return launch_gemv_unrolled<TW, TX, TO, 8>(a, blocks, smem);
}

// The GEMV for one row of x, dispatched on the three element types: out has x's type, or one of
// them is fp32 (the residual stream beside 16-bit activations; ops.h, op::linear).
Status gemv(const Tensor& x, const Tensor& w, const op::LinearOptions& o, Tensor& out) {
  GemvArgs a{};
  a.w = w.raw();
  a.x = x.raw();
  a.norm = o.norm != nullptr ? o.norm->raw() : nullptr;
  a.norm_dtype = o.norm != nullptr ? o.norm->dtype() : DataType::kFp32;
  a.eps = static_cast<float>(o.eps);
  a.bias = o.bias != nullptr ? o.bias->raw() : nullptr;
  a.bias_dtype = o.bias != nullptr ? o.bias->dtype() : DataType::kFp32;
  a.out = out.raw();
  a.N = out.dim(1);
  a.K = x.dim(1);
  a.up_offset = o.swiglu ? a.N : 0;
  a.residual = o.residual;
  a.swiglu = o.swiglu;
  return visit_activation_pair(x.dtype(), out.dtype(), [&](auto x_tag, auto out_tag) {
    using TX = typename decltype(x_tag)::type;
    using TO = typename decltype(out_tag)::type;
    return visit_float(w.dtype(), [&](auto w_tag) {
      using TW = typename decltype(w_tag)::type;
      a.w_vectorized = a.K % (16 / sizeof(TW)) == 0 && aligned16(w.raw());
      a.x_vectorized = a.K % (16 / sizeof(TX)) == 0 && aligned16(x.raw());
      return launch_gemv<TW, TX, TO>(a);
    });
  });
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

// accumulate: out += x w^T (beta = 1), the residual form; no bias then.
Status gemm_cublas(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                   bool accumulate = false) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  KUIPER_ASSIGN_OR_RETURN(cublasHandle_t handle, cublas_handle());
  float beta = accumulate ? 1.0f : 0.0f;
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

}  // namespace

Status matmul(const Tensor& x, const op::Weight& weight, const Tensor* bias, Tensor& out) {
  if (weight.quantized()) return quantized_matmul(x, weight, bias, out);
  const Tensor& w = weight.values;
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  if (T == 0 || N == 0) return Status::Ok();
  if (T == 1) {
    op::LinearOptions o;
    o.bias = bias;
    return gemv(x, w, o, out);
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
    KUIPER_RETURN_IF_ERROR(gemv(x, w, o, out));
    return true;
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

}  // namespace kuiper::cuda
