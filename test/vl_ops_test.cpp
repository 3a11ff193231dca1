// Qwen3-VL's interleaved M-RoPE: the CPU kernel against a double-precision transcription of
// Hugging Face's rotary (three frequency tables, h and w interleaved over t), its reduction to
// ordinary RoPE when t = h = w, and the CUDA kernel against the CPU one on random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/op/ops.h"
#include "kuiper/tensor/tensor.h"
#include "support/assertions.h"

namespace kuiper {
namespace {

const std::vector<int64_t> kSections = {12, 10, 10};  // the fixture's, head_dim 64

Tensor random_fp32(std::vector<int64_t> shape, uint64_t seed) {
  Tensor t = *Tensor::empty(shape, DataType::kFp32);
  EXPECT_TRUE(op::fill_random(t, seed, 1.0f, 0.0f).ok());
  return t;
}

// [3, T] positions: rows t, h, w.
Tensor positions_of(std::vector<int32_t>& rows) {
  return Tensor::view(rows.data(), {3, static_cast<int64_t>(rows.size() / 3)}, DataType::kInt32,
                      DeviceType::kCpu);
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

TEST(MRope, CpuMatchesTheInterleavedReference) {
  const int64_t T = 5, heads = 3, d = 64;
  // Distinct axes, large positions among them, as an image grid after a long prompt gives.
  std::vector<int32_t> pos = {0, 3, 3, 3, 900,    // t
                              0, 3, 4, 5, 1200,   // h
                              0, 3, 5, 4, 1500};  // w
  Tensor x = random_fp32({T, heads, d}, 11);
  const std::vector<double> want = reference(x, pos, 5e6, kSections);
  Tensor y = *x.to(DeviceType::kCpu);
  ASSERT_OK(op::mrope(y, positions_of(pos), 5e6, kSections));
  EXPECT_LE(max_abs_diff(y, want), 2e-4);

  // The layout matters: a chunked (Qwen2-VL) layout or swapped axes would not match.
  std::vector<int32_t> swapped = {0, 3, 3, 3, 900, 0, 3, 5, 4, 1500, 0, 3, 4, 5, 1200};
  Tensor z = *x.to(DeviceType::kCpu);
  ASSERT_OK(op::mrope(z, positions_of(swapped), 5e6, kSections));
  EXPECT_GT(max_abs_diff(z, want), 1e-2);
}

TEST(MRope, EqualAxesAreOrdinaryRope) {
  const int64_t T = 6, heads = 2, d = 64;
  std::vector<int32_t> p = {0, 1, 7, 100, 4095, 40000};
  std::vector<int32_t> pos3;
  for (int r = 0; r < 3; ++r) pos3.insert(pos3.end(), p.begin(), p.end());
  Tensor x = random_fp32({T, heads, d}, 12);
  Tensor a = *x.to(DeviceType::kCpu), b = *x.to(DeviceType::kCpu);
  ASSERT_OK(op::mrope(a, positions_of(pos3), 1e6, kSections));
  ASSERT_OK(op::rope(b, Tensor::view(p.data(), {T}, DataType::kInt32, DeviceType::kCpu), 1e6));
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

// The fused attention-input op with rotary positions apart from the cache rows (how Qwen3-VL runs
// text tokens): RoPE at the rotary positions, rows written at the cache rows; rotary positions
// that do not fit the tokens are an error.
TEST(MRope, QkNormRopeCacheTakesRotaryPositionsApart) {
  const int64_t T = 2, H = 2, d = 8, rows = 6;
  std::vector<int32_t> cache_rows = {1, 4}, rotary = {100, 7};
  const Tensor pos = Tensor::view(cache_rows.data(), {T}, DataType::kInt32, DeviceType::kCpu);
  const Tensor rot = Tensor::view(rotary.data(), {T}, DataType::kInt32, DeviceType::kCpu);
  Tensor q = *Tensor::empty({T, H, d}, DataType::kFp32), k = *Tensor::empty({T, 1, d}, DataType::kFp32);
  Tensor v = *Tensor::empty({T, d}, DataType::kFp32);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (int64_t i = 0; i < k.numel(); ++i) k.data<float>()[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  for (int64_t i = 0; i < v.numel(); ++i) v.data<float>()[i] = static_cast<float>(i);
  Tensor kc = *Tensor::empty({rows, d}, DataType::kFp32), vc = *Tensor::empty({rows, d}, DataType::kFp32);
  std::fill(kc.data<float>(), kc.data<float>() + kc.numel(), 0.0f);
  std::fill(vc.data<float>(), vc.data<float>() + vc.numel(), 0.0f);
  Tensor rq = *q.to(DeviceType::kCpu), rk = *k.to(DeviceType::kCpu);
  ASSERT_OK(op::rope(rq, rot, 1e6));
  ASSERT_OK(op::rope(rk, rot, 1e6));
  ASSERT_OK(op::qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, pos, 1e6, kc, vc, &rot));
  for (int64_t i = 0; i < q.numel(); ++i) EXPECT_EQ(q.data<float>()[i], rq.data<float>()[i]);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      EXPECT_EQ(kc.data<float>()[cache_rows[t] * d + i], rk.data<float>()[t * d + i]);
      EXPECT_EQ(vc.data<float>()[cache_rows[t] * d + i], v.data<float>()[t * d + i]);
    }
  }
  const Tensor short_rot = Tensor::view(rotary.data(), {1}, DataType::kInt32, DeviceType::kCpu);
  EXPECT_FALSE(op::qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, pos, 1e6, kc, vc, &short_rot).ok());
}

TEST(MRope, BadArgumentsAreErrors) {
  Tensor x = random_fp32({2, 1, 64}, 13);
  std::vector<int32_t> pos = {0, 1, 0, 1, 0, 1};
  EXPECT_FALSE(op::mrope(x, positions_of(pos), 1e6, {12, 10}).ok());
  EXPECT_FALSE(op::mrope(x, positions_of(pos), 1e6, {12, 10, 12}).ok());
  std::vector<int32_t> short_pos = {0, 1, 0, 1};
  Tensor p2 = Tensor::view(short_pos.data(), {2, 2}, DataType::kInt32, DeviceType::kCpu);
  EXPECT_FALSE(op::mrope(x, p2, 1e6, kSections).ok());
}

TEST(CudaMRope, MatchesCpuOnRandomInputs) {
  SKIP_WITHOUT_CUDA();
  for (DataType act : {DataType::kFp32, DataType::kFp16}) {
    for (int64_t d : {64, 128}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " head_dim " + std::to_string(d));
      const std::vector<int64_t> sections =
          d == 64 ? kSections : std::vector<int64_t>{24, 20, 20};
      const int64_t T = 37, heads = 5;
      std::vector<int32_t> pos(static_cast<size_t>(3 * T));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>((i * 7919) % 5000);
      // Inputs rounded to the activation type so both sides see the same values.
      Tensor rounded = *Tensor::empty({T, heads, d}, act);
      ASSERT_OK(op::fill_random(rounded, 14 + d, 1.0f, 0.0f));
      Tensor ref = *Tensor::empty({T, heads, d}, DataType::kFp32);
      ASSERT_OK(convert_elements(rounded.raw(), act, ref.raw(), DataType::kFp32,
                                 static_cast<size_t>(ref.numel())));
      Tensor dx = *rounded.to(DeviceType::kCuda);
      ASSERT_OK(op::mrope(ref, positions_of(pos), 5e6, sections));
      Tensor dpos = *positions_of(pos).to(DeviceType::kCuda);
      ASSERT_OK(op::mrope(dx, dpos, 5e6, sections));
      Tensor back = *dx.to(DeviceType::kCpu);
      std::vector<float> got(static_cast<size_t>(back.numel()));
      ASSERT_OK(convert_elements(back.raw(), act, got.data(), DataType::kFp32, got.size()));
      double err = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, double(std::fabs(got[i] - ref.data<float>()[i])));
        scale = std::max(scale, double(std::fabs(ref.data<float>()[i])));
      }
      EXPECT_LE(err / scale, act == DataType::kFp32 ? 1e-5 : 2e-3);
    }
  }
}

}  // namespace
}  // namespace kuiper
