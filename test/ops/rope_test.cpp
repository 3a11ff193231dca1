// op::rope: the CPU reference against the rotation by pos * theta^(-2i/d) in double (and by
// YaRN's blended frequencies, scaled by its attention factor), every backend against the CPU
// (head dims of the fast kernels and an odd small one, large angles, with and without YaRN).
#include <gtest/gtest.h>

#include <algorithm>
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

// YaRN (Qwen3's factor 4 over 32768 positions, an attention factor apart from 1): frequency i
// blends theta^(-2i/d) and a quarter of it by the ramp between low and high, and cos and sin
// carry the attention factor.
TEST(Rope, CpuYarnBlendsFrequenciesAndScales) {
  const int64_t T = 3, heads = 2, d = 64;
  const op::RopeParams yarn = op::yarn_rope(1e6, d, 4.0, 32768, 32, 1, 1.25, true);
  ASSERT_EQ(yarn.low, 11);  // frequencies that turn more than 32 times over 32768 positions
  ASSERT_EQ(yarn.high, 20);  // less than once
  Tensor x = random_tensor({T, heads, d}, 5), orig = *x.to(DeviceType::kCpu);
  const std::vector<int32_t> positions = {0, 5, 1000};
  ASSERT_OK(op::rope(x, int_tensor(positions, {T}), yarn));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = orig.data<float>() + (t * heads + h) * d;
      const float* b = x.data<float>() + (t * heads + h) * d;
      for (int64_t i = 0; i < d / 2; ++i) {
        const double extrapolated = std::pow(1e6, -2.0 * i / d);
        const double ramp = std::min(std::max((i - 11.0) / 9.0, 0.0), 1.0);
        const double angle = positions[t] * extrapolated * (ramp / 4.0 + (1.0 - ramp));
        const double c = 1.25 * std::cos(angle), s = 1.25 * std::sin(angle);
        EXPECT_NEAR(b[i], a[i] * c - a[i + d / 2] * s, 2e-4);
        EXPECT_NEAR(b[i + d / 2], a[i + d / 2] * c + a[i] * s, 2e-4);
      }
    }
  }
}

std::vector<OpCase> rope_cases() {
  std::vector<OpCase> cases;
  for (int64_t d : {64, 128, 6}) {
    for (DataType act : kActivations) {
      for (bool yarn : {false, true}) {
        const op::RopeParams rope =
            yarn ? op::yarn_rope(1e6, d, 4.0, 32768, 32, 1, 1.25, true) : op::RopeParams(1e6);
        // Large angles: host and device sin/cos may round differently in the last bit.
        cases.push_back({"rope head_dim " + std::to_string(d) + " " + dtype_name(act) +
                             (yarn ? " yarn" : ""),
                         {in_out({6, 3, d}, act), ints({0, 1, 7, 100, 4095, 40000}, {6})},
                         [rope](std::vector<Tensor>& a) { return op::rope(a[0], a[1], rope); },
                         {1e-5, 2e-3}});
      }
    }
  }
  return cases;
}

TEST(Rope, BadRotaryParametersAreErrors) {
  Tensor x = random_tensor({1, 1, 8}, 6);
  const Tensor pos = int_tensor({3}, {1});
  EXPECT_FALSE(op::rope(x, pos, 0.0).ok());
  op::RopeParams empty_ramp = op::yarn_rope(1e6, 8, 4.0, 32768, 32, 1, 1.0, true);
  empty_ramp.high = empty_ramp.low;
  EXPECT_FALSE(op::rope(x, pos, empty_ramp).ok());
}

KUIPER_OP_BACKEND_TEST(Rope, rope_cases)

}  // namespace
}  // namespace kuiper::test
