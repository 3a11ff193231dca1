// op::layernorm (the vision tower's): the CPU reference against the formula in double, every
// backend against the CPU (warp- and block-per-row widths, every weight dtype, in place).
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Layernorm, CpuMatchesFormula) {
  for (int64_t D : {7, 128, 1000}) {
    for (bool in_place : {false, true}) {
      const int64_t R = 5;
      // An offset mean, so a kernel that skipped the centring would be far off.
      Tensor x = random_tensor({R, D}, 11, DataType::kFp32, 2.0f, 3.0f);
      Tensor w = random_tensor({D}, 12, DataType::kFp32, 0.5f, 1.0f);
      Tensor b = random_tensor({D}, 13, DataType::kFp32, 0.5f);
      Tensor ref = *Tensor::empty({R, D}, DataType::kFp32);
      for (int64_t r = 0; r < R; ++r) {
        const float* in = x.data<float>() + r * D;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < D; ++i) mean += in[i];
        mean /= D;
        for (int64_t i = 0; i < D; ++i) var += (in[i] - mean) * (in[i] - mean);
        var /= D;
        for (int64_t i = 0; i < D; ++i) {
          ref.data<float>()[r * D + i] = static_cast<float>(
              (in[i] - mean) / std::sqrt(var + 1e-6) * w.data<float>()[i] + b.data<float>()[i]);
        }
      }
      Tensor out = in_place ? x : poisoned({R, D}, DataType::kFp32);
      ASSERT_OK(op::layernorm(x, w, b, 1e-6, out));
      EXPECT_LE(rel_error(out, ref), 1e-6) << "D " << D << (in_place ? " in place" : "");
    }
  }
}

TEST(Layernorm, RejectsMismatchedWeight) {
  Tensor x = random_tensor({2, 8}, 16), w = random_tensor({8}, 17), b = random_tensor({7}, 18);
  Tensor out = poisoned({2, 8}, DataType::kFp32);
  Status s = op::layernorm(x, w, b, 1e-6, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layernorm"), std::string::npos);
}

std::vector<OpCase> layernorm_cases() {
  const int64_t R = 7;
  std::vector<OpCase> cases;
  // Warp-per-row widths (incl. odd), and block-per-row widths (merged tokens: 4 x hidden).
  for (int64_t D : {100, 128, 512, 1024, 4608}) {
    for (DataType w : kFloatTypes) {
      for (DataType act : kActivations) {
        const std::string name =
            "layernorm D " + std::to_string(D) + " w=" + dtype_name(w) + " x=" + dtype_name(act);
        const Tolerance tolerance{2e-5, 3e-3, 2.4e-2};
        cases.push_back(
            {name,
             {in({R, D}, act, 2.0f, 1.0f), in({D}, w, 0.5f, 1.0f), in({D}, w, 0.5f),
              out({R, D}, act)},
             [](std::vector<Tensor>& a) { return op::layernorm(a[0], a[1], a[2], 1e-6, a[3]); },
             tolerance});
        cases.push_back(
            {name + " in place",
             {in_out({R, D}, act, 2.0f, 1.0f), in({D}, w, 0.5f, 1.0f), in({D}, w, 0.5f)},
             [](std::vector<Tensor>& a) { return op::layernorm(a[0], a[1], a[2], 1e-6, a[0]); },
             tolerance});
      }
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Layernorm, layernorm_cases)

}  // namespace
}  // namespace kuiper::test
