// Block-wise FP8 weights (128 x 128 scales, kuiper/op/weight.h) times many rows of 16-bit x on
// Hopper's FP8 tensor cores: cuBLASLt's block-scaled GEMM (sm_90 only), which takes the weight's
// scales as they are stored (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) and one fp32 scale per
// 128 columns of each row of x (VEC128_32F).
//
// The FP8 tensor cores multiply FP8 by FP8, so x goes into FP8 as well, 128 columns at a time. One
// FP8 code per value (x ~ s1 q1, s1 = the group's largest |x| / 448) keeps 4 significant bits:
// each value off by up to 2^-4 of itself, logits off by a few percent, far outside the op's
// contract (the product with the dequantized weights within 16-bit rounding). So x is split in
// two terms: q2 is the FP8 code of the remainder x - s1 q1 with its own scale s2, and
// x ~ s1 q1 + s2 q2 within 2^-8 of each value (2^-4 of a remainder that is itself within 2^-4;
// FP8's subnormals add up to 2^-22 of the group's largest), about the rounding of bf16. Each
// term is one GEMM over the same weight: the remainder's first, then the main term's adding onto
// it (beta = 1), so the large term is rounded once.
//
// Why two FP8 GEMMs rather than dequantizing (quantized_matmul.cu): that path moves 5 bytes a
// weight (1 read, 2 written and read again by a bf16 GEMM), these GEMMs 2 (the codes, read once
// by each), and each runs at about twice the bf16 rate. On the H100 at 512 rows, Qwen2.5-7B's
// gate|up took 246 us against 342 (bf16 weights: 188); measured in docs/PERFORMANCE.md
// ("Quantized weights"). Small weights keep the dequantizing path (kMinWeights).
//
// With FP8 activations (W8A8, weight.h: x rounded to FP8 is the product's definition, as
// transformers, vLLM and SGLang run block-wise FP8 checkpoints) x is one FP8 term, the group codes
// and scales that definition gives, and the product is one GEMM: 129 us for that gate|up, for
// every weight size (the threshold below is the two terms' cost).
#include <cuda_fp8.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/cublas_library.h"
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/fp8_activations.cuh"
#include "kuiper/op/kernels/cuda/primitives.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kGroup = kFp8Group;  // columns of x sharing a scale: the weight block's columns
constexpr int kMostTerms = 2;
// Smaller weights dequantize faster than two FP8 GEMMs run: the dequantizing path costs about a
// microsecond per million weights (3 bytes each through DRAM), the FP8 GEMMs a fixed amount more
// than they need on a grid of 128 x 128 tiles that does not fill the GPU. Measured on the H100
// (Qwen2.5-7B shapes, bf16 x, 512 and 16 rows, us, dequantizing / FP8): q_proj 3584 x 3584 36 /
// 38 and 25 / 31, qkv 4608 x 3584 46 / 58 and 30 / 31, down_proj 3584 x 18944 168 / 159 and 132 /
// 71, gate_up 18944 x 3584 172 / 143 and 134 / 75.
constexpr int64_t kMinWeights = int64_t{1} << 25;

// ---------------------------------------------------------------------------------------------
// 16-bit x into kTerms FP8 terms (fp8_activations.cuh's codes and scales; with one term, the
// FP8 activations). One warp per (row t, group g); lane l holds the group's columns
// [4 l, 4 l + 4). Term j of row t is row j T + t of `codes` [kTerms T, K]; its scale for group g
// is scales[(j G + g) T + t] (G = K / 128): cuBLASLt's VEC128 layout for a [T, K] operand, each
// term's T x G scales apart.
template <typename TX, int kTerms>
__global__ void split_fp8_kernel(const TX* __restrict__ x, int64_t T, int64_t K,
                                 uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int64_t groups = K / kGroup;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (item >= T * groups) return;  // whole warps: blockDim.x is a multiple of 32
  const int lane = threadIdx.x % 32;
  const int64_t t = item / groups, g = item % groups;
  const int64_t col = g * kGroup + 4 * lane;
  const uint2 raw = *reinterpret_cast<const uint2*>(x + t * K + col);  // 4 values, 8 bytes
  const TX* h = reinterpret_cast<const TX*>(&raw);
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = to_float(h[e]);
#pragma unroll
  for (int j = 0; j < kTerms; ++j) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(v[e]));
    amax = warp_max(amax);
    const float s = fp8_group_scale(amax), inv = fp8_group_inverse(amax);
    uint32_t packed = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_fp8_storage_t q = fp8_code(v[e], inv);
      v[e] = fmaf(-fp8_value(q), s, v[e]);  // the remainder, for the next term
      packed |= static_cast<uint32_t>(q) << (8 * e);
    }
    *reinterpret_cast<uint32_t*>(codes + (j * T + t) * K + col) = packed;
    if (lane == 0) scales[(j * groups + g) * T + t] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt

Status check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Error(std::string(what) + ": cuBLASLt status " +
                       std::to_string(static_cast<int>(s)));
}

template <typename V>
Status set_attribute(const CublasLibrary& lib, cublasLtMatmulDesc_t desc,
                     cublasLtMatmulDescAttributes_t attribute, const V& value, const char* what) {
  return check_lt(lib.cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
                  what);
}

struct LtContext {
  const CublasLibrary* lib = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
};

Result<LtContext> make_lt_context() {
  LtContext c;
  KUIPER_ASSIGN_OR_RETURN(c.lib, cublas_library());
  KUIPER_RETURN_IF_ERROR(check_lt(c.lib->cublasLtCreate(&c.handle), "cublasLtCreate"));
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(c.workspace, allocator->allocate(LtContext::kWorkspaceBytes));
  return c;
}

Result<LtContext> lt_context() {
  static PerDevice<LtContext> context;
  return context.get(make_lt_context);
}

// Whether the current device is sm_90 (the only one with these scale modes).
Result<bool> hopper() {
  static PerDevice<bool> is;
  return is.get([]() -> Result<bool> {
    int device = 0, major = 0, minor = 0;
    KUIPER_CUDA_CHECK(cudaGetDevice(&device));
    KUIPER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    KUIPER_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
  });
}

cudaDataType_t lt_type(DataType t) {
  switch (t) {
    case DataType::kFp16: return CUDA_R_16F;
    case DataType::kBf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// The descriptors of one product shape, made once and kept with cuBLASLt's choice of algorithm
// (or the fact that it has none, so the caller dequantizes instead).
struct LtPlan {
  bool supported = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Row-major out[T, N] is column-major out^T [N, T] = w (column-major K x N, transposed) times
// x^T (column-major K x T): A is the weight with its 128 x 128 scales, B a term of x with its
// 1 x 128 ones. The scale pointers are set per call.
Result<LtPlan> make_plan(const LtContext& lt, int64_t N, int64_t K, int64_t T, DataType out) {
  const CublasLibrary& lib = *lt.lib;
  const cublasLtHandle_t handle = lt.handle;
  const void* stand_in = lt.workspace;  // a device address for the scale pointers' checks
  LtPlan p;
  KUIPER_RETURN_IF_ERROR(
      check_lt(lib.cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc create"));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  KUIPER_RETURN_IF_ERROR(set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_TRANSA, ta, "transa"));
  KUIPER_RETURN_IF_ERROR(set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_TRANSB, tb, "transb"));
  KUIPER_RETURN_IF_ERROR(
      set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode, "A mode"));
  KUIPER_RETURN_IF_ERROR(
      set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode, "B mode"));
  KUIPER_RETURN_IF_ERROR(
      check_lt(lib.cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, N, K), "A layout"));
  KUIPER_RETURN_IF_ERROR(
      check_lt(lib.cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, T, K), "B layout"));
  KUIPER_RETURN_IF_ERROR(
      check_lt(lib.cublasLtMatrixLayoutCreate(&p.d, lt_type(out), N, T, N), "D layout"));
  // The heuristic looks at the scale pointers too (it finds nothing while they are null): any
  // 16-byte aligned device address stands in for the ones set per call.
  KUIPER_RETURN_IF_ERROR(
      set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, stand_in, "A scale pointer"));
  KUIPER_RETURN_IF_ERROR(
      set_attribute(lib, p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, stand_in, "B scale pointer"));
  cublasLtMatmulPreference_t pref = nullptr;
  KUIPER_RETURN_IF_ERROR(check_lt(lib.cublasLtMatmulPreferenceCreate(&pref), "preference"));
  const size_t workspace = LtContext::kWorkspaceBytes;
  lib.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace, sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = lib.cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.d, p.d,
                                                              pref, 1, &result, &found);
  lib.cublasLtMatmulPreferenceDestroy(pref);
  p.supported = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.supported) {
    p.algo = result.algo;
  } else {
    static std::once_flag told;
    std::call_once(told, [&] {
      std::fprintf(stderr,
                   "kuiper: cuBLASLt has no block-scaled FP8 GEMM for [%lld, %lld] x %lld rows "
                   "(status %d, %d found); FP8 weights are dequantized for such products\n",
                   static_cast<long long>(N), static_cast<long long>(K),
                   static_cast<long long>(T), static_cast<int>(s), found);
    });
  }
  return p;
}

// Precondition: the caller holds fp8_block_gemm's lock.
Result<LtPlan*> plan_for(const LtContext& lt, int64_t N, int64_t K, int64_t T, DataType out) {
  static std::map<std::tuple<cublasLtHandle_t, int64_t, int64_t, int64_t, DataType>, LtPlan> plans;
  const auto key = std::make_tuple(lt.handle, N, K, T, out);
  auto found = plans.find(key);
  if (found == plans.end()) {
    KUIPER_ASSIGN_OR_RETURN(LtPlan p, make_plan(lt, N, K, T, out));
    found = plans.emplace(key, p).first;
  }
  return &found->second;
}

}  // namespace

Result<bool> fp8_block_gemm(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.rows();
  if (w.format != op::WeightFormat::kFp8 || w.block_rows != kGroup || w.block_cols != kGroup) {
    return false;
  }
  if (x.dtype() == DataType::kFp32 || K % kGroup != 0 || N % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x.raw()) % 8 != 0) {
    return false;
  }
  // cuBLASLt wants 16-byte aligned operands and the weight's scale rows a multiple of 4 floats.
  if (w.scales.dim(1) % 4 != 0 || reinterpret_cast<uintptr_t>(w.values.raw()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.scales.raw()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out.raw()) % 16 != 0 || T > (int64_t{1} << 30)) {
    return false;
  }
  if (N * K < kMinWeights && !w.fp8_activations) return false;
  const int64_t terms = w.fp8_activations ? 1 : kMostTerms;
  KUIPER_ASSIGN_OR_RETURN(const bool sm90, hopper());
  if (!sm90) return false;
  KUIPER_ASSIGN_OR_RETURN(const LtContext lt, lt_context());
  // One caller at a time: the plans are shared and the scale pointers are set per call.
  static std::mutex launch_mutex;
  std::lock_guard<std::mutex> lock(launch_mutex);
  KUIPER_ASSIGN_OR_RETURN(LtPlan* plan, plan_for(lt, N, K, T, out.dtype()));
  if (!plan->supported) return false;

  const int64_t groups = K / kGroup;
  KUIPER_ASSIGN_OR_RETURN(Tensor codes,
                          Tensor::empty({terms * T, K}, DataType::kUint8, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(Tensor scales,
                          Tensor::empty({terms * groups, T}, DataType::kFp32, DeviceType::kCuda));
  KUIPER_RETURN_IF_ERROR(visit_activation(x.dtype(), [&](auto tag) -> Status {
    using TX = typename decltype(tag)::type;
    if constexpr (std::is_same_v<TX, float>) {
      return Status::Error("fp8 split: fp32 x");  // refused above
    } else {
      constexpr int kThreads = 256;
      const unsigned blocks = blocks_for(T * groups, kThreads / 32);
      if (terms == 1) {
        split_fp8_kernel<TX, 1><<<blocks, kThreads, 0, stream()>>>(
            x.data<TX>(), T, K, codes.data<uint8_t>(), scales.data<float>());
      } else {
        split_fp8_kernel<TX, kMostTerms><<<blocks, kThreads, 0, stream()>>>(
            x.data<TX>(), T, K, codes.data<uint8_t>(), scales.data<float>());
      }
      KUIPER_CUDA_CHECK_LAUNCH("fp8 split kernel");
      return Status::Ok();
    }
  }));
  if (bias != nullptr) KUIPER_RETURN_IF_ERROR(broadcast_bias(*bias, out));

  const float alpha = 1.0f;
  const void* w_scales = w.scales.raw();
  for (int64_t j = terms - 1; j >= 0; --j) {  // the remainder first, the main term onto it
    const float beta = (j < terms - 1 || bias != nullptr) ? 1.0f : 0.0f;
    const void* x_scales = scales.data<float>() + j * groups * T;
    KUIPER_RETURN_IF_ERROR(
        set_attribute(*lt.lib, plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales,
                      "A scale pointer"));
    KUIPER_RETURN_IF_ERROR(
        set_attribute(*lt.lib, plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales,
                      "B scale pointer"));
    KUIPER_RETURN_IF_ERROR(check_lt(
        lt.lib->cublasLtMatmul(lt.handle, plan->op, &alpha, w.values.raw(), plan->a,
                       codes.data<uint8_t>() + j * T * K, plan->b, &beta, out.raw(), plan->d,
                       out.raw(), plan->d, &plan->algo, lt.workspace, LtContext::kWorkspaceBytes,
                       stream()),
        "cublasLtMatmul (fp8 block-scaled)"));
  }
  return true;
}

}  // namespace kuiper::cuda
