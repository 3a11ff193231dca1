// op::swiglu: the CPU reference against silu(g) * u in double, every backend against the CPU.
#include <gtest/gtest.h>

#include <cmath>

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

std::vector<OpCase> swiglu_cases() {
  std::vector<OpCase> cases;
  for (int64_t n : {1, 1001, 3 * 4096}) {
    for (DataType act : kActivations) {
      cases.push_back({"swiglu " + std::to_string(n) + " " + dtype_name(act),
                       {in({n}, act, 4.0f), in({n}, act), out({n}, act)},
                       [](std::vector<Tensor>& a) { return op::swiglu(a[0], a[1], a[2]); }});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Swiglu, swiglu_cases)

}  // namespace
}  // namespace kuiper::test
