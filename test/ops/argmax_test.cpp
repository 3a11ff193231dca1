// op::argmax: the first index of the row maximum, on the CPU reference and every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Argmax, CpuFindsEachRowsMaximum) {
  Tensor logits = random_tensor({2, 50}, 9);
  logits.data<float>()[17] = 9.0f;
  logits.data<float>()[50 + 49] = 9.0f;
  Tensor idx = poisoned({2}, DataType::kInt32);
  ASSERT_OK(op::argmax(logits, idx));
  EXPECT_EQ(idx.data<int32_t>()[0], 17);
  EXPECT_EQ(idx.data<int32_t>()[1], 49);
}

TEST(Argmax, CpuTakesTheFirstOnTies) {
  Tensor logits = random_tensor({1, 10}, 10);
  logits.data<float>()[3] = 5.0f;
  logits.data<float>()[8] = 5.0f;
  Tensor idx = poisoned({1}, DataType::kInt32);
  ASSERT_OK(op::argmax(logits, idx));
  EXPECT_EQ(idx.data<int32_t>()[0], 3);
}

TEST(Argmax, CpuSkipsNanAndNegativeInfinity) {
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<float> v = {nan, -1.0f, 3.0f, nan,   // the largest after a NaN first
                          -inf, -inf, -2.0f, nan,  // the only finite value
                          nan, -inf, -inf, nan};   // none finite: 0
  Tensor rows = Tensor::view(v.data(), {3, 4}, DataType::kFp32, DeviceType::kCpu);
  Tensor idx = poisoned({3}, DataType::kInt32);
  ASSERT_OK(op::argmax(rows, idx));
  EXPECT_EQ(idx.data<int32_t>()[0], 2);
  EXPECT_EQ(idx.data<int32_t>()[1], 2);
  EXPECT_EQ(idx.data<int32_t>()[2], 0);
}

// Qwen's vocabulary; row 1 holds a tie (the first index must win), row 2 its maximum last.
std::vector<OpCase> argmax_cases() {
  const int64_t R = 3, V = 151936;
  std::vector<OpCase> cases;
  for (DataType act : kActivations) {
    OpArg logits = in({R, V}, act, 8.0f);
    logits.plant = [V](float* v, int64_t) {
      v[V + 7] = 100.0f;
      v[V + 900] = 100.0f;
      v[2 * V + V - 1] = 100.0f;
    };
    cases.push_back({std::string("argmax ") + dtype_name(act),
                     {logits, out({R}, DataType::kInt32)},
                     [](std::vector<Tensor>& a) { return op::argmax(a[0], a[1]); }});
    // NaN first, then a row of -inf with a NaN (index 0: no finite value).
    const int64_t W = 3000;
    OpArg odd = in({2, W}, act, 8.0f);
    odd.plant = [W](float* v, int64_t) {
      v[0] = std::nanf("");
      v[W - 2] = 100.0f;
      for (int64_t i = W; i < 2 * W; ++i) v[i] = -INFINITY;
      v[W + 5] = std::nanf("");
    };
    cases.push_back({std::string("argmax non-finite ") + dtype_name(act),
                     {odd, out({2}, DataType::kInt32)},
                     [](std::vector<Tensor>& a) { return op::argmax(a[0], a[1]); }});
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Argmax, argmax_cases)

}  // namespace
}  // namespace kuiper::test
