#include "kuiper/base/pending_read.h"

#include <cstring>

#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

namespace kuiper {

PendingRead::~PendingRead() {
  (void)wait();  // the copy must not land in freed memory
  release();
}

#ifdef KUIPER_WITH_CUDA

void PendingRead::release() {
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (host_ != nullptr) (void)cudaFreeHost(host_);
  event_ = host_ = nullptr;
  capacity_ = 0;
}

Status PendingRead::start(const void* src, DeviceType device, size_t bytes) {
  KUIPER_RETURN_IF_ERROR(wait().status());
  from_cpu_ = device == DeviceType::kCpu;
  if (from_cpu_) {
    cpu_.assign(static_cast<const unsigned char*>(src),
                static_cast<const unsigned char*>(src) + bytes);
    return Status::Ok();
  }
  if (bytes > capacity_) {
    if (host_ != nullptr) KUIPER_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    capacity_ = 0;
    KUIPER_CUDA_CHECK(cudaMallocHost(&host_, bytes));
    capacity_ = bytes;
  }
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    KUIPER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
  }
  KUIPER_CUDA_CHECK(
      cudaMemcpyAsync(host_, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()));
  KUIPER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda::stream()));
  pending_ = true;
  return Status::Ok();
}

Result<const void*> PendingRead::wait() {
  if (from_cpu_) return static_cast<const void*>(cpu_.data());
  if (pending_) {
    pending_ = false;
    KUIPER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  }
  return static_cast<const void*>(host_);
}

#else

void PendingRead::release() {}

Status PendingRead::start(const void* src, DeviceType device, size_t bytes) {
  if (device != DeviceType::kCpu) return Status::Error("this build of Kuiper has no CUDA support");
  from_cpu_ = true;
  cpu_.assign(static_cast<const unsigned char*>(src),
              static_cast<const unsigned char*>(src) + bytes);
  return Status::Ok();
}

Result<const void*> PendingRead::wait() { return static_cast<const void*>(cpu_.data()); }

#endif

}  // namespace kuiper
