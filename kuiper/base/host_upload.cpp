#include "kuiper/base/host_upload.h"

#include <cstring>

#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

namespace kuiper {

#ifdef KUIPER_WITH_CUDA

HostUpload::~HostUpload() {
  for (Buffer& b : buffers_) {
    // A copy still queued reads the buffer: let it run before the memory goes.
    if (b.copied != nullptr) {
      (void)cudaEventSynchronize(static_cast<cudaEvent_t>(b.copied));
      (void)cudaEventDestroy(static_cast<cudaEvent_t>(b.copied));
    }
    if (b.host != nullptr) (void)cudaFreeHost(b.host);
  }
}

Status HostUpload::copy(void* dst, DeviceType device, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (device == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Buffer& b = buffers_[next_];
  next_ = 1 - next_;
  if (b.copied == nullptr) {
    cudaEvent_t event = nullptr;
    KUIPER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    b.copied = event;
  } else {
    KUIPER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b.copied)));  // it was read
  }
  if (b.capacity < bytes) {
    if (b.host != nullptr) KUIPER_CUDA_CHECK(cudaFreeHost(b.host));
    b.host = nullptr;
    b.capacity = 0;
    const size_t capacity = bytes < 4096 ? 4096 : 2 * bytes;
    KUIPER_CUDA_CHECK(cudaMallocHost(&b.host, capacity));
    b.capacity = capacity;
  }
  std::memcpy(b.host, src, bytes);
  const cudaStream_t stream = cuda::stream();
  KUIPER_CUDA_CHECK(cudaMemcpyAsync(dst, b.host, bytes, cudaMemcpyHostToDevice, stream));
  KUIPER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(b.copied), stream));
  return Status::Ok();
}

#else

HostUpload::~HostUpload() = default;

Status HostUpload::copy(void* dst, DeviceType device, const void* src, size_t bytes) {
  if (device != DeviceType::kCpu) return Status::Error("this build of Kuiper has no CUDA support");
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return Status::Ok();
}

#endif  // KUIPER_WITH_CUDA

}  // namespace kuiper
