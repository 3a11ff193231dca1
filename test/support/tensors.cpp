#include "support/tensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kuiper/op/ops.h"

namespace kuiper::test {

namespace {

// The tensor's elements as doubles (float dtypes widened, int32 as is), read on the host.
std::vector<double> host_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DataType::kInt32) {
    Result<Tensor> host = t.to(DeviceType::kCpu);
    if (!host.ok()) {
      ADD_FAILURE() << host.status().message();
      return v;
    }
    for (size_t i = 0; i < v.size(); ++i) v[i] = host->data<int32_t>()[i];
    return v;
  }
  const Tensor f = to_host_fp32(t);
  for (size_t i = 0; i < v.size() && f.defined(); ++i) v[i] = f.data<float>()[i];
  return v;
}

}  // namespace

Tensor random_tensor(const std::vector<int64_t>& shape, uint64_t seed, DataType as, float scale,
                     float offset) {
  Result<Tensor> t = Tensor::empty(shape, DataType::kFp32);
  if (!t.ok()) {
    ADD_FAILURE() << "random_tensor: " << t.status().message();
    return Tensor();
  }
  const Status s = op::fill_random(*t, seed, scale, offset);
  if (!s.ok()) ADD_FAILURE() << "random_tensor: " << s.message();
  return rounded(*t, as);
}

Tensor rounded(const Tensor& host, DataType dtype) {
  Result<Tensor> narrow = Tensor::empty(host.shape(), dtype);
  Result<Tensor> back = Tensor::empty(host.shape(), DataType::kFp32);
  if (!narrow.ok() || !back.ok()) {
    ADD_FAILURE() << "rounded: " << (narrow.ok() ? back : narrow).status().message();
    return Tensor();
  }
  const size_t n = static_cast<size_t>(host.numel());
  Status s = convert_elements(host.raw(), DataType::kFp32, narrow->raw(), dtype, n);
  if (s.ok()) s = convert_elements(narrow->raw(), dtype, back->raw(), DataType::kFp32, n);
  if (!s.ok()) ADD_FAILURE() << "rounded: " << s.message();
  return *back;
}

Tensor int_tensor(const std::vector<int32_t>& values, const std::vector<int64_t>& shape) {
  Result<Tensor> t = Tensor::empty(shape, DataType::kInt32);
  if (!t.ok() || t->numel() != static_cast<int64_t>(values.size())) {
    ADD_FAILURE() << "int_tensor: " << values.size() << " values for shape " << shape_string(shape);
    return Tensor();
  }
  if (!values.empty()) std::memcpy(t->raw(), values.data(), values.size() * sizeof(int32_t));
  return *t;
}

Tensor poisoned(const std::vector<int64_t>& shape, DataType dtype, DeviceType device) {
  Result<Tensor> host = Tensor::empty(shape, dtype);
  if (!host.ok()) {
    ADD_FAILURE() << "poisoned: " << host.status().message();
    return Tensor();
  }
  std::memset(host->raw(), 0xff, host->nbytes());
  if (device == DeviceType::kCpu) return *host;
  Result<Tensor> moved = host->to(device);
  if (!moved.ok()) ADD_FAILURE() << "poisoned: " << moved.status().message();
  return moved.ok() ? *moved : Tensor();
}

Tensor upload(const Tensor& host, DataType dtype, DeviceType device) {
  Result<Tensor> converted = Tensor::empty(host.shape(), dtype);
  if (!converted.ok()) {
    ADD_FAILURE() << "upload: " << converted.status().message();
    return Tensor();
  }
  const Status s = host.dtype() == dtype
                       ? converted->copy_from(host)
                       : convert_elements(host.raw(), host.dtype(), converted->raw(), dtype,
                                          static_cast<size_t>(host.numel()));
  if (!s.ok()) {
    ADD_FAILURE() << "upload: " << s.message();
    return Tensor();
  }
  if (device == DeviceType::kCpu) return *converted;
  Result<Tensor> moved = converted->to(device);
  if (!moved.ok()) ADD_FAILURE() << "upload: " << moved.status().message();
  return moved.ok() ? *moved : Tensor();
}

Tensor to_host_fp32(const Tensor& t) {
  Result<Tensor> host = t.to(DeviceType::kCpu);
  Result<Tensor> f = Tensor::empty(t.shape(), DataType::kFp32);
  if (!host.ok() || !f.ok()) {
    ADD_FAILURE() << "to_host_fp32: " << (host.ok() ? f : host).status().message();
    return Tensor();
  }
  const Status s = convert_elements(host->raw(), host->dtype(), f->raw(), DataType::kFp32,
                                    static_cast<size_t>(f->numel()));
  if (!s.ok()) ADD_FAILURE() << "to_host_fp32: " << s.message();
  return *f;
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor f = to_host_fp32(t);
  if (!f.defined()) return {};
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

std::vector<float> host_floats(const Result<Tensor>& t) {
  if (!t.ok()) {
    ADD_FAILURE() << "host_floats: " << t.status().message();
    return {};
  }
  return host_floats(*t);
}

Difference compare(const Tensor& out, const Tensor& ref) {
  Difference d;
  if (out.numel() != ref.numel()) {
    ADD_FAILURE() << "compare: " << out.describe() << " against " << ref.describe();
    d.non_finite = 1;
    return d;
  }
  const std::vector<double> o = host_values(out), r = host_values(ref);
  double max_ref = 1e-30;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!std::isfinite(o[i]) || !std::isfinite(r[i])) {
      ++d.non_finite;
      continue;
    }
    d.max_abs = std::max(d.max_abs, std::fabs(o[i] - r[i]));
    max_ref = std::max(max_ref, std::fabs(r[i]));
  }
  d.rel = d.max_abs / max_ref;
  return d;
}

double rel_error(const Tensor& out, const Tensor& ref) {
  const Difference d = compare(out, ref);
  return d.non_finite > 0 ? std::numeric_limits<double>::infinity() : d.rel;
}

}  // namespace kuiper::test
