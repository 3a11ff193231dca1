// Allocators hand out raw device or host memory; Buffer owns what they hand out.
#pragma once

#include <cstddef>
#include <string>

#include "kuiper/base/dtype.h"
#include "kuiper/base/status.h"

namespace kuiper {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DeviceType device() const = 0;
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void release(void* ptr, size_t bytes) = 0;
  // Gives memory cached for reuse back to the system (a caching allocator's free blocks; may
  // synchronise the device). For after a load that freed many blocks no later request will reuse,
  // e.g. weights copied into stacks. Nothing to do for an allocator that caches nothing.
  virtual void release_cached() {}
  // Bytes the device could still hand out: its free memory plus what this allocator caches
  // unused. An error where the allocator cannot tell (the CPU's heap).
  virtual Result<size_t> free_bytes() {
    return Status::Error(std::string("free memory of the ") + device_name(device()) +
                         " is not known");
  }
};

// The process-wide allocator of a device. CUDA is an error in a build without CUDA or on a
// machine without a usable GPU.
Result<Allocator*> allocator_for(DeviceType device);

// Copies bytes between any two devices (cudaMemcpy when either side is CUDA).
Status copy_bytes(void* dst, DeviceType dst_device, const void* src, DeviceType src_device,
                  size_t bytes);

// Copies bytes within one device without waiting: on CUDA the copy is queued on the engine
// stream, ordered after the work queued before it and before the work queued after it.
Status copy_bytes_queued(void* dst, const void* src, DeviceType device, size_t bytes);

// Whether this build has CUDA and a GPU is usable (tests use it to skip with a reason).
bool cuda_available();

}  // namespace kuiper
