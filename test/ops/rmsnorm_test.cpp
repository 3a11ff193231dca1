// op::rmsnorm: the CPU reference against the double-precision formula, every backend against
// the CPU (rows and per-head rows, every weight dtype, in place and not).
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Rmsnorm, CpuMatchesFormulaPerRowAndPerHead) {
  Tensor x = random_tensor({3, 4, 16}, 3), w = random_tensor({16}, 4);
  Tensor out = poisoned({3, 4, 16}, DataType::kFp32);
  ASSERT_OK(op::rmsnorm(x, w, 1e-6, out));
  for (int64_t r = 0; r < 12; ++r) {
    double ss = 0;
    for (int i = 0; i < 16; ++i) ss += std::pow(x.data<float>()[r * 16 + i], 2);
    double inv = 1.0 / std::sqrt(ss / 16 + 1e-6);
    for (int i = 0; i < 16; ++i) {
      EXPECT_NEAR(out.data<float>()[r * 16 + i],
                  w.data<float>()[i] * x.data<float>()[r * 16 + i] * inv, 1e-5);
    }
  }
}

std::vector<OpCase> rmsnorm_cases() {
  // [R, D] rows (warp and block per row; a block row held in registers, and one too long for
  // them, which the CUDA kernel reads twice), and the per-head form: x [T, heads, d] over d.
  const std::vector<std::vector<int64_t>> shapes = {
      {7, 133}, {1, 4096}, {3, 1500}, {2, 8200}, {3, 5, 64}};
  std::vector<OpCase> cases;
  for (const auto& shape : shapes) {
    for (DataType w : kFloatTypes) {
      for (DataType act : kActivations) {
        const std::string name =
            "rmsnorm " + shape_string(shape) + " w=" + dtype_name(w) + " x=" + dtype_name(act);
        cases.push_back(
            {name,
             {in(shape, act, 2.0f), in({shape.back()}, w, 0.5f, 1.0f), out(shape, act)},
             [](std::vector<Tensor>& a) { return op::rmsnorm(a[0], a[1], 1e-6, a[2]); }});
        cases.push_back(
            {name + " in place",
             {in_out(shape, act, 2.0f), in({shape.back()}, w, 0.5f, 1.0f)},
             [](std::vector<Tensor>& a) { return op::rmsnorm(a[0], a[1], 1e-6, a[0]); }});
      }
    }
  }
  // The fp32 residual stream, holding a value past fp16's range, normalised into 16-bit
  // activations; and 16-bit rows normalised into fp32.
  for (const auto& shape : shapes) {
    for (DataType act : {DataType::kFp16, DataType::kBf16}) {
      const auto run = [](std::vector<Tensor>& a) { return op::rmsnorm(a[0], a[1], 1e-6, a[2]); };
      OpArg residual = in(shape, DataType::kFp32, 2.0f);
      residual.plant = plant_at(0, kBeyondFp16);
      cases.push_back({"rmsnorm " + shape_string(shape) + " x=fp32 (8e4 planted) out=" +
                           dtype_name(act),
                       {residual, in({shape.back()}, act, 0.5f, 1.0f), out(shape, act)},
                       run});
      cases.push_back({"rmsnorm " + shape_string(shape) + " x=" + dtype_name(act) + " out=fp32",
                       {in(shape, act, 2.0f), in({shape.back()}, act, 0.5f, 1.0f),
                        out(shape, DataType::kFp32)},
                       run});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Rmsnorm, rmsnorm_cases)

TEST(Rmsnorm, CpuRefusesA16BitOut) {
  const Tensor x = random_tensor({2, 8}, 6), w = random_tensor({8}, 5);
  Tensor half = poisoned({2, 8}, DataType::kFp16);
  const Status s = op::rmsnorm(x, w, 1e-6, half);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rmsnorm"), std::string::npos) << s.message();
}

TEST(Rmsnorm, CudaRefusesFp16IntoBf16) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = upload(random_tensor({2, 8}, 6), DataType::kFp16, DeviceType::kCuda);
  const Tensor w = upload(random_tensor({8}, 5), DataType::kFp32, DeviceType::kCuda);
  Tensor out = poisoned({2, 8}, DataType::kBf16, DeviceType::kCuda);
  const Status s = op::rmsnorm(x, w, 1e-6, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot normalise"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kuiper::test
