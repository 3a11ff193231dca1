// What every CUDA kernel file shares: element conversions to and from fp32 (all arithmetic is
// fp32) and the host-side switch from a runtime DataType to a kernel template argument, so each
// kernel is written once as a template and instantiated per element type. The GPU primitives
// (reductions, PDL launch, per-device facts) are in primitives.cuh, included here for every
// kernel file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "kuiper/base/cuda_runtime.h"
#include "kuiper/base/dtype.h"
#include "kuiper/op/kernels/cuda/primitives.cuh"

namespace kuiper::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Reads element i of a float tensor whose type is only known at run time (biases: one read per
// output row, not worth a template argument).
__device__ __forceinline__ float load_as_float(const void* p, DataType t, int64_t i) {
  switch (t) {
    case DataType::kFp16: return __half2float(static_cast<const __half*>(p)[i]);
    case DataType::kBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Calls fn(TypeTag<T>{}) with T the CUDA type of a float dtype (fp32, fp16, bf16).
template <typename Fn>
Status visit_float(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFp32: return fn(TypeTag<float>{});
    case DataType::kFp16: return fn(TypeTag<__half>{});
    case DataType::kBf16: return fn(TypeTag<__nv_bfloat16>{});
    default: return Status::Error(std::string("no CUDA kernel for ") + dtype_name(t));
  }
}

// Activations are fp32, fp16 or bf16 (ops.cpp has checked).
template <typename Fn>
Status visit_activation(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFp32: return fn(TypeTag<float>{});
    case DataType::kFp16: return fn(TypeTag<__half>{});
    case DataType::kBf16: return fn(TypeTag<__nv_bfloat16>{});
    default: return Status::Error(std::string("no CUDA kernel for activations of ") +
                                  dtype_name(t));
  }
}

// Calls fn(TypeTag<TA>{}, TypeTag<TB>{}) for two activation types that are equal or of which one
// is fp32: the fp32 residual stream beside 16-bit activations (ops.h lists the ops that mix).
// fp16 with bf16 is refused.
template <typename Fn>
Status visit_activation_pair(DataType a, DataType b, Fn&& fn) {
  if (a != b && a != DataType::kFp32 && b != DataType::kFp32) {
    return Status::Error(std::string("no CUDA kernel for activations of ") + dtype_name(a) +
                         " with " + dtype_name(b));
  }
  return visit_activation(a, [&](auto a_tag) {
    using TA = typename decltype(a_tag)::type;
    if constexpr (std::is_same_v<TA, float>) {
      return visit_activation(b, [&](auto b_tag) { return fn(a_tag, b_tag); });
    } else {
      if (b == DataType::kFp32) return fn(a_tag, TypeTag<float>{});
      return fn(a_tag, a_tag);
    }
  });
}

}  // namespace kuiper::cuda
