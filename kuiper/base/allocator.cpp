#include "kuiper/base/allocator.h"

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

namespace kuiper {

namespace {

// 64-byte alignment: a cache line, and enough for any SIMD load the CPU kernels use.
class CpuAllocator final : public Allocator {
 public:
  DeviceType device() const override { return DeviceType::kCpu; }
  Result<void*> allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return Status::Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    }
    return p;
  }
  void release(void* ptr, size_t) override { std::free(ptr); }
};

}  // namespace

#ifdef KUIPER_WITH_CUDA
Allocator* cuda_caching_allocator();  // kuiper/base/cuda_allocator.cu
#endif

Result<Allocator*> allocator_for(DeviceType device) {
  static CpuAllocator cpu;
  if (device == DeviceType::kCpu) return static_cast<Allocator*>(&cpu);
#ifdef KUIPER_WITH_CUDA
  if (!cuda_available()) return Status::Error("no usable CUDA device");
  return cuda_caching_allocator();
#else
  return Status::Error("this build of Kuiper has no CUDA support (rebuild with nvcc present)");
#endif
}

bool cuda_available() {
#ifdef KUIPER_WITH_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

Status copy_bytes(void* dst, DeviceType dst_device, const void* src, DeviceType src_device,
                  size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst_device == DeviceType::kCpu && src_device == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#ifdef KUIPER_WITH_CUDA
  // On the engine stream, then waited for: the copy is ordered after every queued kernel and
  // the data is usable (or the host buffer reusable) when this returns.
  KUIPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::stream()));
  KUIPER_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  return Status::Ok();
#else
  return Status::Error("this build of Kuiper has no CUDA support");
#endif
}

Status copy_bytes_queued(void* dst, const void* src, DeviceType device, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (device == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#ifdef KUIPER_WITH_CUDA
  KUIPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
  return Status::Ok();
#else
  return Status::Error("this build of Kuiper has no CUDA support");
#endif
}

}  // namespace kuiper
