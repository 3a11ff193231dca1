// op::add: the CPU reference is the fp32 sum; every backend matches it, in the aliasing form
// the residual uses too, and with a 16-bit b added into an fp32 a.
#include <gtest/gtest.h>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

// Also in place, as the residual stream adds into itself.
TEST(Add, CpuIsTheElementwiseSumAlsoInPlace) {
  const Tensor a = random_tensor({4, 6}, 7, DataType::kFp32, 4.0f), b = random_tensor({4, 6}, 8);
  Tensor sum = poisoned({4, 6}, DataType::kFp32),
         acc = upload(a, DataType::kFp32, DeviceType::kCpu);
  ASSERT_OK(op::add(a, b, sum));
  ASSERT_OK(op::add(acc, b, acc));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float want = a.data<float>()[i] + b.data<float>()[i];
    EXPECT_EQ(sum.data<float>()[i], want);
    EXPECT_EQ(acc.data<float>()[i], want);
  }
}

std::vector<OpCase> add_cases() {
  std::vector<OpCase> cases;
  for (int64_t n : {1, 1001, 3 * 4096}) {
    for (DataType act : kActivations) {
      const std::string name = "add " + std::to_string(n) + " " + dtype_name(act);
      cases.push_back({name,
                       {in({n}, act, 4.0f), in({n}, act), out({n}, act)},
                       [](std::vector<Tensor>& a) { return op::add(a[0], a[1], a[2]); }});
      cases.push_back({name + " into a",
                       {in_out({n}, act, 4.0f), in({n}, act)},
                       [](std::vector<Tensor>& a) { return op::add(a[0], a[1], a[0]); }});
    }
    // 16-bit b (vision features) into the fp32 residual a, which holds a value past fp16's
    // range: the fp32 sum of the same values, exactly.
    for (DataType act : {DataType::kFp16, DataType::kBf16}) {
      const std::string name = "add " + std::to_string(n) + " fp32 + " + dtype_name(act);
      OpArg residual = in({n}, DataType::kFp32, 4.0f);
      residual.plant = plant_at(0, kBeyondFp16);
      OpArg sum = out({n}, DataType::kFp32);
      sum.tolerance = 0.0;
      cases.push_back({name,
                       {residual, in({n}, act), sum},
                       [](std::vector<Tensor>& a) { return op::add(a[0], a[1], a[2]); }});
      residual.role = Role::kInOut;
      residual.tolerance = 0.0;
      cases.push_back({name + " into a",
                       {residual, in({n}, act)},
                       [](std::vector<Tensor>& a) { return op::add(a[0], a[1], a[0]); }});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Add, add_cases)

}  // namespace
}  // namespace kuiper::test
