// op::rope: the CPU reference against the rotation by pos * theta^(-2i/d) in double, every
// backend against the CPU (head dims of the fast kernels and an odd small one, large angles).
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Rope, CpuRotatesHalvesByPositionAngle) {
  const int64_t T = 3, heads = 2, d = 8;
  const double theta = 10000.0;
  Tensor x = random_tensor({T, heads, d}, 4), orig = *x.to(DeviceType::kCpu);
  const std::vector<int32_t> positions = {0, 5, 1000};
  ASSERT_OK(op::rope(x, int_tensor(positions, {T}), theta));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = orig.data<float>() + (t * heads + h) * d;
      const float* b = x.data<float>() + (t * heads + h) * d;
      for (int64_t i = 0; i < d / 2; ++i) {
        double angle = positions[t] * std::pow(theta, -2.0 * i / d);
        EXPECT_NEAR(b[i], a[i] * std::cos(angle) - a[i + d / 2] * std::sin(angle), 2e-4);
        EXPECT_NEAR(b[i + d / 2], a[i + d / 2] * std::cos(angle) + a[i] * std::sin(angle), 2e-4);
      }
    }
  }
}

std::vector<OpCase> rope_cases() {
  std::vector<OpCase> cases;
  for (int64_t d : {64, 128, 6}) {
    for (DataType act : kActivations) {
      // Large angles: host and device sin/cos may round differently in the last bit.
      cases.push_back({"rope head_dim " + std::to_string(d) + " " + dtype_name(act),
                       {in_out({6, 3, d}, act), ints({0, 1, 7, 100, 4095, 40000}, {6})},
                       [](std::vector<Tensor>& a) { return op::rope(a[0], a[1], 1e6); },
                       {1e-5, 2e-3}});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Rope, rope_cases)

}  // namespace
}  // namespace kuiper::test
