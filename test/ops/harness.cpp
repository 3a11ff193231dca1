#include "ops/harness.h"

#include <functional>

#include "support/tensors.h"

namespace kuiper::test {

namespace {

uint64_t next_seed() {
  static uint64_t seed = 1234;
  return ++seed;
}

// The host values of an argument: none for an output, its ints, or random fp32 values rounded
// to its dtype.
Tensor host_values(const OpArg& a) {
  if (a.role == Role::kOut) return Tensor();
  if (a.dtype == DataType::kInt32) return int_tensor(a.ints, a.shape);
  Tensor values = random_tensor(a.shape, next_seed(), DataType::kFp32, a.scale, a.offset);
  if (a.plant) a.plant(values.data<float>(), values.numel());
  return rounded(values, a.dtype);
}

// The argument on `device`: the host values in dtype (fp32 on the CPU reference, which computes
// in fp32 on exactly the backend's values), or poison where the op only writes it.
Tensor make_arg(const OpArg& a, const Tensor& values, DeviceType device) {
  const DataType dtype =
      device == DeviceType::kCpu && a.dtype != DataType::kInt32 ? DataType::kFp32 : a.dtype;
  if (a.role == Role::kOut) return poisoned(a.shape, dtype, device);
  return upload(values, dtype, device);
}

std::vector<Tensor> make_args(const OpCase& c, const std::vector<Tensor>& values,
                              DeviceType device) {
  std::vector<Tensor> args;
  for (size_t i = 0; i < c.args.size(); ++i) args.push_back(make_arg(c.args[i], values[i], device));
  return args;
}

}  // namespace

OpArg in(std::vector<int64_t> shape, DataType dtype, float scale, float offset) {
  OpArg a;
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.scale = scale;
  a.offset = offset;
  return a;
}

OpArg out(std::vector<int64_t> shape, DataType dtype) {
  OpArg a = in(std::move(shape), dtype);
  a.role = Role::kOut;
  return a;
}

OpArg in_out(std::vector<int64_t> shape, DataType dtype, float scale, float offset) {
  OpArg a = in(std::move(shape), dtype, scale, offset);
  a.role = Role::kInOut;
  return a;
}

OpArg ints(std::vector<int32_t> values, std::vector<int64_t> shape) {
  OpArg a;
  a.shape = std::move(shape);
  a.dtype = DataType::kInt32;
  a.ints = std::move(values);
  return a;
}

std::function<void(float* values, int64_t n)> plant_at(int64_t index, float value) {
  return [index, value](float* values, int64_t n) {
    ASSERT_LT(index, n) << "planted beyond the argument";
    values[index] = value;
  };
}

double Tolerance::of(DataType dtype) const {
  switch (dtype) {
    case DataType::kFp32:
      return fp32;
    case DataType::kFp16:
      return fp16;
    case DataType::kBf16:
      return bf16;
    default:
      return 0.0;
  }
}

void expect_backend_matches_cpu(const std::vector<OpCase>& cases, DeviceType device) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> values;
    for (const OpArg& a : c.args) values.push_back(host_values(a));
    std::vector<Tensor> ref = make_args(c, values, DeviceType::kCpu);
    std::vector<Tensor> got = make_args(c, values, device);
    ASSERT_OK(c.run(ref));
    ASSERT_OK(c.run(got));
    for (size_t i = 0; i < c.args.size(); ++i) {
      if (c.args[i].role == Role::kIn) continue;
      const OpArg& a = c.args[i];
      const double allowed = a.tolerance >= 0 ? a.tolerance : c.tolerance.of(a.dtype);
      const Difference d = compare(got[i], ref[i]);
      EXPECT_EQ(d.non_finite, 0) << "argument " << i << ": elements left unwritten (NaN)";
      EXPECT_LE(d.rel, allowed) << "argument " << i << " (" << got[i].describe()
                                << "): max abs error " << d.max_abs;
    }
  }
}

}  // namespace kuiper::test
