// op::mrope, Qwen3-VL's interleaved M-RoPE: the CPU reference against a double-precision
// transcription of Hugging Face's rotary (three frequency tables, h and w interleaved over t),
// its reduction to ordinary RoPE when t = h = w (plain and YaRN), and every backend against the
// CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

const std::vector<int64_t> kSections = {12, 10, 10};  // the fixture's, head_dim 64

// [3, T] positions: rows t, h, w.
Tensor positions_of(const std::vector<int32_t>& rows) {
  return int_tensor(rows, {3, static_cast<int64_t>(rows.size() / 3)});
}

// The reference, following transformers' Qwen3VLTextRotaryEmbedding: freqs[axis][t][j] for each
// axis, then freqs_t[..., offset:3*section:3] overwritten by axis h (offset 1) and w (offset 2);
// cos/sin of cat(freqs, freqs); x * cos + rotate_half(x) * sin. In double.
std::vector<double> reference(const Tensor& x, const std::vector<int32_t>& pos, double theta,
                              const std::vector<int64_t>& sections) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> freq(static_cast<size_t>(half));
    for (int64_t j = 0; j < half; ++j) {
      const double inv = 1.0 / std::pow(theta, double(2 * j) / double(d));
      freq[j] = pos[0 * T + t] * inv;
    }
    for (int axis : {1, 2}) {
      for (int64_t j = axis; j < 3 * sections[axis]; j += 3) {
        const double inv = 1.0 / std::pow(theta, double(2 * j) / double(d));
        freq[j] = pos[axis * T + t] * inv;
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = x.data<float>() + (t * heads + h) * d;
      double* o = out.data() + (t * heads + h) * d;
      for (int64_t i = 0; i < d; ++i) {
        const double f = freq[i % half];
        const double rot = i < half ? -double(v[i + half]) : double(v[i - half]);
        o[i] = v[i] * std::cos(f) + rot * std::sin(f);
      }
    }
  }
  return out;
}

double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<float>()[i] - b[i]));
  return m;
}

TEST(Mrope, CpuMatchesTheInterleavedReference) {
  const int64_t T = 5, heads = 3, d = 64;
  // Distinct axes, large positions among them, as an image grid after a long prompt gives.
  const std::vector<int32_t> pos = {0, 3, 3, 3, 900,    // t
                                    0, 3, 4, 5, 1200,   // h
                                    0, 3, 5, 4, 1500};  // w
  Tensor x = random_tensor({T, heads, d}, 11);
  const std::vector<double> want = reference(x, pos, 5e6, kSections);
  Tensor y = *x.to(DeviceType::kCpu);
  ASSERT_OK(op::mrope(y, positions_of(pos), 5e6, kSections));
  EXPECT_LE(max_abs_diff(y, want), 2e-4);

  // The layout matters: a chunked (Qwen2-VL) layout or swapped axes would not match.
  const std::vector<int32_t> swapped = {0, 3, 3, 3, 900, 0, 3, 5, 4, 1500, 0, 3, 4, 5, 1200};
  Tensor z = *x.to(DeviceType::kCpu);
  ASSERT_OK(op::mrope(z, positions_of(swapped), 5e6, kSections));
  EXPECT_GT(max_abs_diff(z, want), 1e-2);
}

TEST(Mrope, EqualAxesAreOrdinaryRope) {
  const int64_t T = 6, heads = 2, d = 64;
  const std::vector<int32_t> p = {0, 1, 7, 100, 4095, 40000};
  std::vector<int32_t> pos3;
  for (int r = 0; r < 3; ++r) pos3.insert(pos3.end(), p.begin(), p.end());
  Tensor x = random_tensor({T, heads, d}, 12);
  for (const op::RopeParams& rope :
       {op::RopeParams(1e6), op::yarn_rope(1e6, d, 4.0, 32768, 32, 1, 1.25, true)}) {
    Tensor a = *x.to(DeviceType::kCpu), b = *x.to(DeviceType::kCpu);
    ASSERT_OK(op::mrope(a, positions_of(pos3), rope, kSections));
    ASSERT_OK(op::rope(b, int_tensor(p, {T}), rope));
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  }
}

TEST(Mrope, BadArgumentsAreErrors) {
  Tensor x = random_tensor({2, 1, 64}, 13);
  const std::vector<int32_t> pos = {0, 1, 0, 1, 0, 1};
  EXPECT_FALSE(op::mrope(x, positions_of(pos), 1e6, {12, 10}).ok());
  EXPECT_FALSE(op::mrope(x, positions_of(pos), 1e6, {12, 10, 12}).ok());
  EXPECT_FALSE(op::mrope(x, int_tensor({0, 1, 0, 1}, {2, 2}), 1e6, kSections).ok());
}

std::vector<OpCase> mrope_cases() {
  std::vector<OpCase> cases;
  for (DataType act : kActivations) {
    for (int64_t d : {64, 128}) {
      const std::vector<int64_t> sections = d == 64 ? kSections : std::vector<int64_t>{24, 20, 20};
      const int64_t T = 37;
      std::vector<int32_t> pos(static_cast<size_t>(3 * T));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>((i * 7919) % 5000);
      for (bool yarn : {false, true}) {
        const op::RopeParams rope =
            yarn ? op::yarn_rope(5e6, d, 4.0, 262144, 32, 1, 1.25, true) : op::RopeParams(5e6);
        cases.push_back(
            {"mrope head_dim " + std::to_string(d) + " " + dtype_name(act) + (yarn ? " yarn" : ""),
             {in_out({T, 5, d}, act), ints(pos, {3, T})},
             [sections, rope](std::vector<Tensor>& a) {
               return op::mrope(a[0], a[1], rope, sections);
             },
             {1e-5, 2e-3}});
      }
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Mrope, mrope_cases)

}  // namespace
}  // namespace kuiper::test
