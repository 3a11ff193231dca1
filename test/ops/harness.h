// The one backend harness of the op tests (after llama.cpp's tests/test-backend-ops.cpp): an op
// case names its arguments (shape, dtype on the backend, how its values are made, whether the
// op writes it) and how to call the op; the harness makes random inputs, runs the case on the
// CPU reference (fp32, every float argument holding the values the backend's dtype holds) and on
// the backend under test with every output first poisoned with NaN, and compares each written
// argument within a per-dtype tolerance. Each test/ops/<op>_test.cpp lists its cases (every
// dtype and shape class its kernels handle) and registers them with KUIPER_OP_BACKEND_TEST.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kuiper/tensor/tensor.h"
#include "support/assertions.h"

namespace kuiper::test {

constexpr DataType kFloatTypes[] = {DataType::kFp32, DataType::kFp16, DataType::kBf16};
constexpr DataType kActivations[] = {DataType::kFp32, DataType::kFp16, DataType::kBf16};

// What the op does with an argument: reads it, writes it (made poisoned), or both (in place).
enum class Role { kIn, kOut, kInOut };

struct OpArg {
  std::vector<int64_t> shape;
  DataType dtype = DataType::kFp32;  // on the backend under test
  Role role = Role::kIn;
  float scale = 1.0f;  // float values: offset + scale * u, u uniform in [-1, 1)
  float offset = 0.0f;
  std::vector<int32_t> ints;  // int32 arguments: these values (ids, positions, bounds)
  // Changes the fp32 values after they are drawn and before they are rounded to dtype (a
  // planted maximum, say).
  std::function<void(float* values, int64_t n)> plant;
  double tolerance = -1.0;  // >= 0: this argument's own (0 for a copy) instead of the case's
};

// The argument helpers the cases are written with.
OpArg in(std::vector<int64_t> shape, DataType dtype, float scale = 1.0f, float offset = 0.0f);
OpArg out(std::vector<int64_t> shape, DataType dtype);
OpArg in_out(std::vector<int64_t> shape, DataType dtype, float scale = 1.0f, float offset = 0.0f);
OpArg ints(std::vector<int32_t> values, std::vector<int64_t> shape);

// Past fp16's largest value (65504), as Qwen2's residual stream reaches: planted in the fp32
// residuals and products of the mixed-dtype cases, which must come out finite and exact.
constexpr float kBeyondFp16 = 8e4f;

// An OpArg::plant that sets element `index` to `value`.
std::function<void(float* values, int64_t n)> plant_at(int64_t index, float value);

// The max |out - ref| / max |ref| allowed for a written argument, by its dtype. By default fp32
// results agree to rounding and accumulation order, and 16-bit results carry one rounding to
// their type (fp16 2^-11, bf16 2^-8) and some fp32 accumulation-order noise on top; int32
// results (indices) must be equal. A case that loosens fp16 loosens bf16 eightfold (its ulp).
struct Tolerance {
  double fp32 = 2e-5;
  double fp16 = 2e-3;
  double bf16 = 1.6e-2;
  double of(DataType dtype) const;
};

struct OpCase {
  std::string name;  // the op and what varies: "rmsnorm [7,133] w=bf16 x=fp16 in place"
  std::vector<OpArg> args;
  // Calls the op on the arguments, all on one device, in the order of `args`.
  std::function<Status(std::vector<Tensor>& args)> run;
  Tolerance tolerance;
};

// Runs every case on `device` and on the CPU reference and compares what they write.
void expect_backend_matches_cpu(const std::vector<OpCase>& cases, DeviceType device);

}  // namespace kuiper::test

// Registers an op's cases: Suite.CudaMatchesCpu runs them on the GPU, skipping (and saying why)
// where there is none; Suite.CasesRunOnCpu runs them on the CPU against itself, so that CI
// without a GPU still checks that every case is well formed and the reference writes every
// output.
#define KUIPER_OP_BACKEND_TEST(Suite, cases)                                          \
  TEST(Suite, CudaMatchesCpu) {                                                       \
    SKIP_WITHOUT_CUDA();                                                              \
    ::kuiper::test::expect_backend_matches_cpu(cases(), ::kuiper::DeviceType::kCuda); \
  }                                                                                   \
  TEST(Suite, CasesRunOnCpu) {                                                        \
    ::kuiper::test::expect_backend_matches_cpu(cases(), ::kuiper::DeviceType::kCpu);  \
  }
