// GPU primitives every CUDA kernel file may use: shuffle and block reductions, the type tag of
// the dtype dispatch, per-device facts read once (SM count, the shared-memory opt-in) and the
// launch with or without programmatic dependent launch (PDL).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kuiper/base/cuda_runtime.h"

namespace kuiper::cuda {

// ---- reductions ----

// Sum / max over aligned groups of kWidth lanes (xor shuffles never leave the group), so
// sub-warp groups that each own one item reduce independently; every lane gets the result.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int kWidth>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return group_sum<32>(v); }
__device__ __forceinline__ float warp_max(float v) { return group_max<32>(v); }

// Reduces one value per thread to a block-wide result that every thread receives. `shared`
// holds kThreads / 32 floats; the leading barrier lets a block reuse it for the next reduction.
template <int kThreads, bool kMax>
__device__ float block_reduce(float v, float* shared) {
  constexpr int kWarps = kThreads / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}

// ---- the model's scalar formulas, one expression each (the CPU reference's forms) ----

// RMSNorm's 1 / sqrt(mean(x^2) + eps) from the sum of n squares.
__device__ __forceinline__ float rms_inverse(float sum_sq, int64_t n, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(n) + eps);
}

// SwiGLU's silu(g) * u, silu(g) = g / (1 + e^-g).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// ---- host: dispatch tags and per-device facts ----

// Carries a CUDA element type through a generic lambda: fn(TypeTag<T>{}).
template <typename T>
struct TypeTag {
  using type = T;
};

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// A value computed once per device, on the first call by any thread made with that device
// current; a failed computation is not kept, so the next call tries again.
template <typename T>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;
  template <typename Make>
  Result<T> get(Make&& make) {
    int device = 0;
    KUIPER_CUDA_CHECK(cudaGetDevice(&device));
    if (device < 0 || device >= kMaxDevices) {
      return Status::Error("CUDA device " + std::to_string(device) + " beyond the " +
                           std::to_string(kMaxDevices) + " supported");
    }
    Slot& slot = slots_[device];
    if (slot.ready.load(std::memory_order_acquire)) return slot.value;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!slot.ready.load(std::memory_order_relaxed)) {
      KUIPER_ASSIGN_OR_RETURN(slot.value, make());
      slot.ready.store(true, std::memory_order_release);
    }
    return slot.value;
  }

 private:
  struct Slot {
    std::atomic<bool> ready{false};
    T value{};
  };
  std::mutex mutex_;
  Slot slots_[kMaxDevices];
};

// Multiprocessors of the current device.
inline Result<int> sm_count() {
  static PerDevice<int> count;
  return count.get([]() -> Result<int> {
    int device = 0, n = 0;
    KUIPER_CUDA_CHECK(cudaGetDevice(&device));
    KUIPER_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    if (n <= 0) return Status::Error("CUDA device reports no multiprocessors");
    return n;
  });
}

// Whether the current device launches thread block clusters (compute capability 9.0 and up).
inline Result<bool> cluster_launch() {
  static PerDevice<bool> can;
  return can.get([]() -> Result<bool> {
    int device = 0, major = 0;
    KUIPER_CUDA_CHECK(cudaGetDevice(&device));
    KUIPER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9;
  });
}

// Raises kKernel's dynamic shared-memory limit to `bytes` (above 48 KB needs it), once per
// device; later calls keep the first limit. The kernel is a template argument, not a
// function-pointer parameter: instantiations that share a signature (flash1_kernel<float, 64>
// and <float, 128>) must each get their own call.
template <auto kKernel>
Status allow_shared_memory(size_t bytes) {
  static PerDevice<bool> raised;
  const Result<bool> done = raised.get([bytes]() -> Result<bool> {
    KUIPER_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
    return true;
  });
  // A successful Result's status() is not Ok (it says "no value"): ask ok() first.
  return done.ok() ? Status::Ok() : done.status();
}

// Blocks of kKernel that run at once on the current device (SMs times the blocks an SM holds,
// at least one an SM) with `threads` threads and `smem` bytes of dynamic shared memory: an
// occupancy query, cached per device and size.
template <auto kKernel>
Result<int64_t> resident_blocks(int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, size_t>, int64_t> fits;
  int device = 0;
  KUIPER_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = fits.find({device, smem});
  if (found != fits.end()) return found->second;
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  int per_sm = 0;
  KUIPER_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem));
  const int64_t fit = static_cast<int64_t>(sms) * (per_sm > 1 ? per_sm : 1);
  fits.emplace(std::make_pair(device, smem), fit);
  return fit;
}

// ---- asynchronous copies into shared memory (sm_80+) ----

// Copies 16 bytes global -> shared (dst: a shared-space address) without passing through
// registers; with valid == false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- programmatic dependent launch ----

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

// kernel<<<grid, block, smem, stream()>>>(args...), with PDL allowed when `pdl` and the grid in
// thread block clusters of `cluster` blocks when it is above 1 (sm_90: cluster_launch()); a
// failed launch is returned (and cleared, so the next launch check does not report it again).
template <typename... Params, typename... Args>
Status launch_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          bool pdl, int cluster, const char* what, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  cudaLaunchAttribute attribute[2];
  unsigned n = 0;
  if (pdl) {
    attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attribute[n].id = cudaLaunchAttributeClusterDimension;
    attribute[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute[n].val.clusterDim.y = 1;
    attribute[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attribute;
  config.numAttrs = n;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (launched != cudaSuccess) {
    (void)cudaGetLastError();
    return check(launched, what);
  }
  return Status::Ok();
}

// launch_in_clusters() without clusters.
template <typename... Params, typename... Args>
Status launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, bool pdl,
              const char* what, Args&&... args) {
  return launch_in_clusters(kernel, grid, block, smem, pdl, 1, what, std::forward<Args>(args)...);
}

// launch() with PDL: the GEMV and the fused attention-input kernel, measured faster with it
// (matmul.cu gives the figures).
template <typename... Params, typename... Args>
Status launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  const char* what, Args&&... args) {
  return launch(kernel, grid, block, smem, true, what, std::forward<Args>(args)...);
}

}  // namespace kuiper::cuda
