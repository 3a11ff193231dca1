// op::gelu: the CPU reference against both formulas in double (and they differ, so a mix-up
// shows), every backend against the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Gelu, CpuErfAndTanhMatchTheirFormulas) {
  Tensor x = random_tensor({3, 301}, 12, DataType::kFp32, 6.0f);
  for (op::GeluKind kind : {op::GeluKind::kErf, op::GeluKind::kTanh}) {
    Tensor out = poisoned(x.shape(), DataType::kFp32);
    ASSERT_OK(op::gelu(x, kind, out));
    double worst = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.data<float>()[i];
      const double ref =
          kind == op::GeluKind::kErf
              ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
              : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      worst = std::max(worst, std::fabs(out.data<float>()[i] - ref));
    }
    EXPECT_LE(worst, 2e-6) << (kind == op::GeluKind::kErf ? "erf" : "tanh");
  }
  // The two differ by up to ~1e-3 near |x| = 2: a test that mixed them up would see it.
  Tensor a = poisoned(x.shape(), DataType::kFp32), b = poisoned(x.shape(), DataType::kFp32);
  ASSERT_OK(op::gelu(x, op::GeluKind::kErf, a));
  ASSERT_OK(op::gelu(x, op::GeluKind::kTanh, b));
  EXPECT_GT(rel_error(a, b), 1e-5);
}

std::vector<OpCase> gelu_cases() {
  std::vector<OpCase> cases;
  for (DataType act : kActivations) {
    for (op::GeluKind kind : {op::GeluKind::kErf, op::GeluKind::kTanh}) {
      cases.push_back(
          {std::string("gelu ") + dtype_name(act) + (kind == op::GeluKind::kErf ? " erf" : " tanh"),
           {in({9, 1001}, act, 6.0f), out({9, 1001}, act)},
           [kind](std::vector<Tensor>& a) { return op::gelu(a[0], kind, a[1]); },
           {2e-5, 3e-3, 2.4e-2}});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Gelu, gelu_cases)

}  // namespace
}  // namespace kuiper::test
