// op::rope_2d (the vision tower's 2-D rotary embedding): the CPU reference against Hugging
// Face's form in double, every backend against the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

// Hugging Face's form: freqs = outer(pos, inv_freq) for inv_freq of length d/4, one row of
// angles = cat(freqs[row], freqs[col]), emb = cat(angles, angles), x*cos(emb) +
// rotate_half(x)*sin(emb).
TEST(Rope2d, CpuMatchesHuggingFaceForm) {
  for (int64_t d : {16, 72, 80}) {
    const int64_t T = 6, heads = 3, quarter = d / 4, half = d / 2;
    const std::vector<int32_t> pos = {0, 0, 0, 1, 1, 0, 5, 9, 13, 2, 31, 47};
    Tensor x = random_tensor({T, heads, d}, 13 + d);
    Tensor ref = *Tensor::empty(x.shape(), DataType::kFp32);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> emb(static_cast<size_t>(d));
      for (int64_t j = 0; j < quarter; ++j) {
        const double inv = 1.0 / std::pow(10000.0, double(2 * j) / double(half));
        emb[j] = pos[2 * t] * inv;
        emb[quarter + j] = pos[2 * t + 1] * inv;
      }
      for (int64_t c = 0; c < half; ++c) emb[half + c] = emb[c];
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = x.data<float>() + (t * heads + h) * d;
        for (int64_t c = 0; c < d; ++c) {
          const double rotated = c < half ? -in[c + half] : in[c - half];
          ref.data<float>()[(t * heads + h) * d + c] =
              static_cast<float>(in[c] * std::cos(emb[c]) + rotated * std::sin(emb[c]));
        }
      }
    }
    ASSERT_OK(op::rope_2d(x, int_tensor(pos, {T, 2}), 10000.0));
    EXPECT_LE(rel_error(x, ref), 2e-6) << "head_dim " << d;
  }
  Tensor bad = random_tensor({2, 1, 6}, 14);  // d % 4 != 0
  EXPECT_FALSE(op::rope_2d(bad, int_tensor({0, 0, 0, 0}, {2, 2}), 10000.0).ok());
}

std::vector<OpCase> rope_2d_cases() {
  const int64_t T = 50, heads = 4;
  std::vector<int32_t> pos;
  for (int64_t t = 0; t < T; ++t) {
    pos.push_back(static_cast<int32_t>(t / 7));
    pos.push_back(static_cast<int32_t>((t * 13) % 97));
  }
  std::vector<OpCase> cases;
  for (int64_t d : {64, 72, 80, 128}) {
    for (DataType act : kActivations) {
      cases.push_back({"rope_2d head_dim " + std::to_string(d) + " " + dtype_name(act),
                       {in_out({T, heads, d}, act), ints(pos, {T, 2})},
                       [](std::vector<Tensor>& a) { return op::rope_2d(a[0], a[1], 10000.0); },
                       {2e-5, 3e-3, 2.4e-2}});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Rope2d, rope_2d_cases)

}  // namespace
}  // namespace kuiper::test
