#include "kuiper/tensor/tensor.h"

namespace kuiper {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

int64_t Tensor::numel() const { return product(shape_); }

Result<Tensor> Tensor::empty(std::vector<int64_t> shape, DataType dtype, DeviceType device) {
  for (int64_t d : shape) {
    if (d < 0) return Status::Error("negative dimension in shape " + shape_string(shape));
  }
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  KUIPER_ASSIGN_OR_RETURN(t.buffer_, Buffer::allocate(t.nbytes(), device));
  return t;
}

Tensor Tensor::view(void* data, std::vector<int64_t> shape, DataType dtype, DeviceType device,
                    std::shared_ptr<const void> owner) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.buffer_ = Buffer::view(data, t.nbytes(), device, std::move(owner));
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  Tensor t = *this;
  int64_t row_elems = shape_.empty() ? 1 : numel() / shape_[0];
  t.offset_ += static_cast<size_t>(begin * row_elems) * dtype_size(dtype_);
  t.shape_[0] = count;
  return t;
}

Result<Tensor> Tensor::reshape(std::vector<int64_t> shape) const {
  if (product(shape) != numel()) {
    return Status::Error("cannot reshape " + describe() + " to " + shape_string(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Result<Tensor> Tensor::to(DeviceType device) const {
  KUIPER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(shape_, dtype_, device));
  KUIPER_RETURN_IF_ERROR(t.copy_from(*this));
  return t;
}

Status Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_) {
    return Status::Error("copy from " + src.describe() + " into " + describe());
  }
  return copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

Status Tensor::queue_copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_ || src.device() != device()) {
    return Status::Error("queued copy from " + src.describe() + " into " + describe());
  }
  return copy_bytes_queued(raw(), src.raw(), device(), nbytes());
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_) + "@" + device_name(device());
}

}  // namespace kuiper
