// Tensor helpers for the tests: random inputs, poisoned outputs, host <-> device copies and the
// comparison of a result with its reference. A helper that cannot do its job fails the running
// test (ADD_FAILURE, with the Status message) and returns an empty or partial tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "kuiper/tensor/tensor.h"

namespace kuiper::test {

// A host fp32 tensor of offset + scale * u, u uniform in [-1, 1) from op::fill_random's hash of
// (seed, index), rounded to `as` and back so that a reference given it sees exactly the values a
// device tensor of that dtype holds.
Tensor random_tensor(const std::vector<int64_t>& shape, uint64_t seed,
                     DataType as = DataType::kFp32, float scale = 1.0f, float offset = 0.0f);

// The host fp32 tensor rounded to `dtype` and back.
Tensor rounded(const Tensor& host, DataType dtype);

// A host int32 tensor holding `values`.
Tensor int_tensor(const std::vector<int32_t>& values, const std::vector<int64_t>& shape);

// A tensor on `device` with every byte 0xff: NaN in fp32, fp16 and bf16, -1 in int32. An element
// a kernel forgets to write then fails any comparison.
Tensor poisoned(const std::vector<int64_t>& shape, DataType dtype,
                DeviceType device = DeviceType::kCpu);

// A host tensor (fp32, or int32 copied as is) converted to `dtype` on `device`.
Tensor upload(const Tensor& host, DataType dtype, DeviceType device);

// Any float tensor as a host fp32 tensor.
Tensor to_host_fp32(const Tensor& t);

// Any float tensor's elements as fp32 values on the host (empty when it cannot be read); the
// second form fails the test with the error of a failed result.
std::vector<float> host_floats(const Tensor& t);
std::vector<float> host_floats(const Result<Tensor>& t);

// How far a result is from its reference, element by element over same-sized tensors of any
// float dtype or int32 on any device.
struct Difference {
  double max_abs = 0.0;    // max |out - ref|
  double rel = 0.0;        // max_abs / max |ref|
  int64_t non_finite = 0;  // elements of out or ref that are NaN or infinite (poison left)
};
Difference compare(const Tensor& out, const Tensor& ref);

// compare(out, ref).rel, or infinity when an element is not finite.
double rel_error(const Tensor& out, const Tensor& ref);

}  // namespace kuiper::test
