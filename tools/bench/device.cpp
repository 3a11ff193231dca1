#include "tools/bench/device.h"

#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/base/cuda_runtime.h"
#include "tools/bench/timing.h"

namespace kuiper::bench {

Result<double> copy_bandwidth_gbs() {
  constexpr size_t kBytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  KUIPER_CUDA_CHECK(cudaMalloc(&a, kBytes));
  KUIPER_CUDA_CHECK(cudaMalloc(&b, kBytes));
  KUIPER_CUDA_CHECK(cudaMemset(a, 1, kBytes));
  cudaEvent_t start, stop;
  KUIPER_CUDA_CHECK(cudaEventCreate(&start));
  KUIPER_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> seconds;
  for (int i = 0; i < 12; ++i) {
    KUIPER_CUDA_CHECK(cudaEventRecord(start));
    KUIPER_CUDA_CHECK(cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice));
    KUIPER_CUDA_CHECK(cudaEventRecord(stop));
    KUIPER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KUIPER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) seconds.push_back(ms / 1e3);  // the first copies warm up
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaFree(a);
  (void)cudaFree(b);
  return 2.0 * kBytes / median(seconds) / 1e9;
}

json device_info() {
  json info;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    info["name"] = prop.name;
    info["sm_count"] = prop.multiProcessorCount;
    info["memory_gib"] = static_cast<double>(prop.totalGlobalMem) / kGiB;
    info["l2_mib"] = prop.l2CacheSize / (1024.0 * 1024.0);
  }
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) info["cuda_driver"] = driver;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info["cuda_runtime"] = runtime;
  return info;
}

size_t usable_bytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  const kuiper::cuda::MemoryStats s = kuiper::cuda::memory_stats();
  return free + (s.reserved - s.in_use);
}

double device_used_gib() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0.0;
  return static_cast<double>(total - free) / kGiB;
}

}  // namespace kuiper::bench
