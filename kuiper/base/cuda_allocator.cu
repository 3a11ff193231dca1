// The CUDA caching allocator. cudaMalloc and cudaFree synchronise the device and cost tens of
// microseconds, so blocks are never given back on release: they go to a free list keyed by their
// rounded size and the next request of that bucket takes them. cudaMalloc runs only on a miss,
// cudaFree only when CUDA reports out-of-memory (the cache is emptied and the request retried).
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/base/cuda_runtime.h"

namespace kuiper {

namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // below: 512-byte granules
constexpr size_t kSmallGranule = 512;            // cudaMalloc aligns to 256; keep that
constexpr size_t kLargeStepCap = size_t{2} << 20;

size_t round_up(size_t v, size_t step) { return (v + step - 1) / step * step; }

// The bucket a request falls in. Above 1 MiB the step is 1/16 of the power of two below the size
// (at most 6.25% slack, so activations of nearby sizes share blocks) but never more than 2 MiB
// (an 8B model's hundreds of 100 MB weights would otherwise waste gigabytes).
size_t bucket_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < kSmallLimit) return round_up(bytes, kSmallGranule);
  size_t power = kSmallLimit;
  while (power * 2 <= bytes) power *= 2;
  return round_up(bytes, std::min(power / 16, kLargeStepCap));
}

class CudaCachingAllocator final : public Allocator {
 public:
  DeviceType device() const override { return DeviceType::kCuda; }

  Result<void*> allocate(size_t bytes) override {
    const size_t size = bucket_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<void*>& free_list = free_[size];
    void* p = nullptr;
    if (!free_list.empty()) {
      p = free_list.back();
      free_list.pop_back();
    } else {
      cudaError_t err = cudaMalloc(&p, size);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached_blocks();
        err = cudaMalloc(&p, size);
      }
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return Status::Error("cannot allocate " + std::to_string(bytes) + " bytes on the GPU (" +
                             std::to_string(stats_.in_use >> 20) + " MiB in use): " +
                             cudaGetErrorString(err));
      }
      stats_.reserved += size;
    }
    stats_.in_use += size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return p;
  }

  void release(void* ptr, size_t bytes) override {
    const size_t size = bucket_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(ptr);
    stats_.in_use -= size;
  }

  cuda::MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak = stats_.in_use;
  }

  Result<size_t> free_bytes() override {
    size_t free = 0, total = 0;
    KUIPER_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const cuda::MemoryStats s = stats();
    return free + (s.reserved - s.in_use);
  }

  void release_cached() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_blocks();
  }

 private:
  // Called with mutex_ held, after an out-of-memory error or on request (never on the hot path).
  void release_cached_blocks() {
    (void)cudaDeviceSynchronize();
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        if (cudaFree(p) == cudaSuccess) stats_.reserved -= size;
      }
      blocks.clear();
    }
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  cuda::MemoryStats stats_;
};

// Never destroyed: Buffers held by static objects release into it during exit, after which
// the CUDA context itself may already be gone.
CudaCachingAllocator& instance() {
  static CudaCachingAllocator* allocator = new CudaCachingAllocator();
  return *allocator;
}

}  // namespace

Allocator* cuda_caching_allocator() { return &instance(); }

namespace cuda {
MemoryStats memory_stats() { return instance().stats(); }
void reset_peak_memory() { instance().reset_peak(); }
}  // namespace cuda

}  // namespace kuiper
