#include "kuiper/base/buffer.h"

namespace kuiper {

Result<std::shared_ptr<Buffer>> Buffer::allocate(size_t bytes, DeviceType device) {
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(device));
  KUIPER_ASSIGN_OR_RETURN(void* data, allocator->allocate(bytes));
  return std::shared_ptr<Buffer>(new Buffer(data, bytes, device, allocator, nullptr));
}

std::shared_ptr<Buffer> Buffer::view(void* data, size_t bytes, DeviceType device,
                                     std::shared_ptr<const void> owner) {
  return std::shared_ptr<Buffer>(new Buffer(data, bytes, device, nullptr, std::move(owner)));
}

Buffer::~Buffer() {
  if (allocator_ != nullptr) allocator_->release(data_, size_);
}

}  // namespace kuiper
