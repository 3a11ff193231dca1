// Tensor: a shaped, typed view into a Buffer on one device. Row-major, contiguous.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kuiper/base/buffer.h"

namespace kuiper {

class Tensor {
 public:
  Tensor() = default;

  // A new, uninitialised tensor owning its memory.
  static Result<Tensor> empty(std::vector<int64_t> shape, DataType dtype,
                              DeviceType device = DeviceType::kCpu);
  // A tensor over memory someone else owns; `owner` is kept alive as long as the view lives.
  static Tensor view(void* data, std::vector<int64_t> shape, DataType dtype, DeviceType device,
                     std::shared_ptr<const void> owner = nullptr);

  bool defined() const { return buffer_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + ndim() : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DataType dtype() const { return dtype_; }
  DeviceType device() const { return buffer_ ? buffer_->device() : DeviceType::kCpu; }

  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // Rows [begin, begin+count) along dimension 0, sharing memory.
  Tensor rows(int64_t begin, int64_t count) const;
  // Same memory, new shape with the same element count.
  Result<Tensor> reshape(std::vector<int64_t> shape) const;
  // A copy on `device` (and same dtype).
  Result<Tensor> to(DeviceType device) const;
  // Copies the contents of src (same shape and dtype, any device) into this tensor.
  Status copy_from(const Tensor& src);
  // copy_from for a source on this tensor's device, without waiting: a CUDA copy is queued on the
  // engine stream (ordered after the work queued before it, before the work queued after it).
  Status queue_copy_from(const Tensor& src);

  std::string describe() const;  // "fp32[4,128]@cpu"

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;  // bytes into buffer_
  std::vector<int64_t> shape_;
  DataType dtype_ = DataType::kFp32;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[4,128]"

}  // namespace kuiper
