// x rounded to FP8 for the product of FP8 weights with FP8 activations (W8A8: kuiper/op/weight.h,
// fp8_activations): a group's scale and a value's code, as the CPU reference forms them
// (kernels/cpu/quantize.cpp, round_to_fp8_groups). The hardware conversion agrees with
// base/dtype.cpp's float_to_fp8_e4m3 on finite values: nearest, ties to even, saturating at 448.
// The FP8 GEMM of many rows (fp8_block_gemm.cu) and the tensor-core GEMV (gemv_mma.cuh) both
// form x's codes and scales through these, so a row's codes are the same in either.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kuiper/op/weight.h"

namespace kuiper::cuda {

constexpr float kE4m3Max = 448.0f;
constexpr int kFp8Group = static_cast<int>(op::kFp8ActivationGroup);

// The scale of a group whose largest |x| is amax, and the factor that takes its values to codes
// (a multiply a value rather than a division: the staging of x is on the GEMV's critical path).
__device__ __forceinline__ float fp8_group_scale(float amax) {
  return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}
__device__ __forceinline__ float fp8_group_inverse(float amax) {
  return amax > 0.0f ? kE4m3Max / amax : 1.0f;
}

// The E4M3 code of v in a group of inverse scale inv; two at once (v0 in the low byte).
__device__ __forceinline__ __nv_fp8_storage_t fp8_code(float v, float inv) {
  return __nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ __nv_fp8x2_storage_t fp8x2_code(float v0, float v1, float inv) {
  return __nv_cvt_float2_to_fp8x2(make_float2(v0 * inv, v1 * inv), __NV_SATFINITE, __NV_E4M3);
}

// A code's value (exact in fp16, bf16 and fp32).
__device__ __forceinline__ float fp8_value(__nv_fp8_storage_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}

}  // namespace kuiper::cuda
