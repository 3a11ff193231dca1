// op::swiglu: the CPU reference against silu(g) * u in double, every backend against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Swiglu, CpuIsSiluOfGateTimesUp) {
  Tensor g = random_tensor({4, 6}, 5, DataType::kFp32, 4.0f), u = random_tensor({4, 6}, 6);
  Tensor out = poisoned({4, 6}, DataType::kFp32);
  ASSERT_OK(op::swiglu(g, u, out));
  for (int i = 0; i < 24; ++i) {
    double gv = g.data<float>()[i];
    EXPECT_NEAR(out.data<float>()[i], gv / (1 + std::exp(-gv)) * u.data<float>()[i], 1e-5);
  }
}

// The stacked form is the separate one over each row's halves.
TEST(Swiglu, CpuStackedIsSeparateOverTheHalves) {
  const int64_t T = 3, N = 5;
  Tensor gu = random_tensor({T, 2 * N}, 7, DataType::kFp32, 4.0f);
  Tensor g = *Tensor::empty({T, N}, DataType::kFp32), u = *Tensor::empty({T, N}, DataType::kFp32);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < N; ++j) {
      g.data<float>()[t * N + j] = gu.data<float>()[t * 2 * N + j];
      u.data<float>()[t * N + j] = gu.data<float>()[t * 2 * N + N + j];
    }
  }
  Tensor want = poisoned({T, N}, DataType::kFp32), got = poisoned({T, N}, DataType::kFp32);
  ASSERT_OK(op::swiglu(g, u, want));
  ASSERT_OK(op::swiglu(gu, got));
  for (int64_t i = 0; i < T * N; ++i) EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]);
  Tensor two_rows = g.rows(0, 2);
  EXPECT_FALSE(op::swiglu(gu, two_rows).ok());  // the rows differ
  EXPECT_FALSE(op::swiglu(g, u).ok());          // 2 N columns wanted, not N
}

std::vector<OpCase> swiglu_cases() {
  std::vector<OpCase> cases;
  for (int64_t n : {1, 1001, 3 * 4096}) {
    for (DataType act : kActivations) {
      cases.push_back({"swiglu " + std::to_string(n) + " " + dtype_name(act),
                       {in({n}, act, 4.0f), in({n}, act), out({n}, act)},
                       [](std::vector<Tensor>& a) { return op::swiglu(a[0], a[1], a[2]); }});
    }
  }
  // stacked gate|up rows: one row, a batch, an odd width
  for (const auto& [T, N] : {std::pair<int64_t, int64_t>{1, 12288}, {64, 1000}, {7, 3}}) {
    for (DataType act : kActivations) {
      cases.push_back({"swiglu stacked [" + std::to_string(T) + "," + std::to_string(2 * N) + "] " +
                           dtype_name(act),
                       {in({T, 2 * N}, act, 4.0f), out({T, N}, act)},
                       [](std::vector<Tensor>& a) { return op::swiglu(a[0], a[1]); }});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Swiglu, swiglu_cases)

}  // namespace
}  // namespace kuiper::test
