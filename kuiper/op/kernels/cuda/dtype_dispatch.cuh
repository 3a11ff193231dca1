// What every CUDA kernel file shares: element conversions to and from fp32 (all arithmetic is
// fp32) and the host-side switch from a runtime DataType to a kernel template argument, so each
// kernel is written once as a template and instantiated per element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "kuiper/base/cuda_runtime.h"
#include "kuiper/base/dtype.h"

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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T>
struct TypeTag {
  using type = T;
};

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

// Activations are fp32 or fp16 (ops.cpp has checked); the switch is kept narrow so that each
// kernel is instantiated only for the types it can meet.
template <typename Fn>
Status visit_activation(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFp32: return fn(TypeTag<float>{});
    case DataType::kFp16: return fn(TypeTag<__half>{});
    default: return Status::Error(std::string("no CUDA kernel for activations of ") +
                                  dtype_name(t));
  }
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Programmatic dependent launch (PDL, sm_90): a kernel launched by launch_pdl may start while the
// previous kernel on the stream is still running. Before it reads anything that kernel writes
// (or writes anything it reads) it must call grid_dependency_wait(), which returns once the
// previous grid has completed and its memory is visible. grid_launch_dependents() lets the next
// PDL kernel start early; every kernel here calls it only after its own wait, so when a kernel
// starts, every kernel before the one just before it has finished: before its wait a kernel may
// read what only those wrote (weights, older KV cache rows), and anything the kernel just before
// may write only after the wait (or as a guess checked after it, as the flash2 decode does with
// the position). Both are no-ops when the kernel was launched without PDL.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// PDL is on unless the environment sets KUIPER_NO_PDL (for A/B timing).
inline bool pdl_enabled() {
  static const bool enabled = std::getenv("KUIPER_NO_PDL") == nullptr;
  return enabled;
}

// kernel<<<grid, block, smem, stream()>>>(args...) with PDL allowed; a failed launch is returned
// (and cleared, so the next launch check does not report it again).
template <typename... Params, typename... Args>
Status launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  const char* what, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl_enabled() ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (launched != cudaSuccess) {
    (void)cudaGetLastError();
    return check(launched, what);
  }
  return Status::Ok();
}

}  // namespace kuiper::cuda
