// A Buffer is a span of memory on one device that either owns its allocation or keeps alive
// whatever it views (for example the mmapped model file).
#pragma once

#include <cstddef>
#include <memory>

#include "kuiper/base/allocator.h"

namespace kuiper {

class Buffer {
 public:
  static Result<std::shared_ptr<Buffer>> allocate(size_t bytes, DeviceType device);
  static std::shared_ptr<Buffer> view(void* data, size_t bytes, DeviceType device,
                                      std::shared_ptr<const void> owner);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  DeviceType device() const { return device_; }

 private:
  Buffer(void* data, size_t size, DeviceType device, Allocator* allocator,
         std::shared_ptr<const void> owner)
      : data_(data), size_(size), device_(device), allocator_(allocator), owner_(std::move(owner)) {}
  void* data_;
  size_t size_;
  DeviceType device_;
  Allocator* allocator_;  // null for views
  std::shared_ptr<const void> owner_;
};

}  // namespace kuiper
