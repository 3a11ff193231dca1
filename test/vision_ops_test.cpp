// The vision tower's ops: the CPU kernels against double-precision formulas written the way
// Hugging Face states them, and the CUDA kernels against the CPU ones on the same random inputs
// (fp32 and fp16 activations, outputs poisoned with NaN first).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/op/ops.h"
#include "kuiper/tensor/tensor.h"

#include "support/assertions.h"

namespace kuiper {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f,
                     float offset = 0.0f) {
  Tensor t = Tensor::empty(std::move(shape), DataType::kFp32).value();
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = offset + dist(rng);
  return t;
}

Tensor poisoned(std::vector<int64_t> shape, DataType dtype = DataType::kFp32,
                DeviceType device = DeviceType::kCpu) {
  Tensor host = Tensor::empty(std::move(shape), dtype).value();
  std::memset(host.raw(), 0xff, host.nbytes());  // NaN in every float type
  return device == DeviceType::kCpu ? host : host.to(device).value();
}

Tensor int_tensor(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(std::move(shape), DataType::kInt32).value();
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

// The host tensor rounded to `dtype` and back, so the reference sees what the device gets.
Tensor rounded(const Tensor& host, DataType dtype) {
  Tensor narrow = Tensor::empty(host.shape(), dtype).value();
  Tensor back = Tensor::empty(host.shape(), DataType::kFp32).value();
  const size_t n = static_cast<size_t>(host.numel());
  EXPECT_TRUE(convert_elements(host.raw(), DataType::kFp32, narrow.raw(), dtype, n).ok());
  EXPECT_TRUE(convert_elements(narrow.raw(), dtype, back.raw(), DataType::kFp32, n).ok());
  return back;
}

Tensor to_device(const Tensor& host, DataType dtype) {
  Tensor narrow = Tensor::empty(host.shape(), dtype).value();
  EXPECT_TRUE(convert_elements(host.raw(), DataType::kFp32, narrow.raw(), dtype,
                               static_cast<size_t>(host.numel()))
                  .ok());
  return narrow.to(DeviceType::kCuda).value();
}

Tensor to_host_fp32(const Tensor& t) {
  Tensor host = t.to(DeviceType::kCpu).value();
  Tensor f = Tensor::empty(t.shape(), DataType::kFp32).value();
  EXPECT_TRUE(convert_elements(host.raw(), host.dtype(), f.raw(), DataType::kFp32,
                               static_cast<size_t>(f.numel()))
                  .ok());
  return f;
}

// max |out - ref| / max |ref|; a NaN anywhere (an element never written) gives infinity.
double rel_error(const Tensor& out, const Tensor& ref) {
  double max_diff = 0, max_ref = 1e-30;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double o = out.data<float>()[i], r = ref.data<float>()[i];
    if (std::isnan(o)) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(o - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  return max_diff / max_ref;
}

double tolerance(DataType act) { return act == DataType::kFp32 ? 2e-5 : 3e-3; }

// ---- CPU kernels against the formulas ----

TEST(VisionOps, LayerNormMatchesFormula) {
  std::mt19937 rng(11);
  for (int64_t D : {7, 128, 1000}) {
    for (bool in_place : {false, true}) {
      const int64_t R = 5;
      // An offset mean, so a kernel that skipped the centring would be far off.
      Tensor x = random_tensor({R, D}, rng, 2.0f, 3.0f);
      Tensor w = random_tensor({D}, rng, 0.5f, 1.0f), b = random_tensor({D}, rng, 0.5f);
      Tensor ref = Tensor::empty({R, D}, DataType::kFp32).value();
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
      Tensor out = in_place ? x : poisoned({R, D});
      ASSERT_OK(op::layernorm(x, w, b, 1e-6, out));
      EXPECT_LE(rel_error(out, ref), 1e-6) << "D " << D << (in_place ? " in place" : "");
    }
  }
}

TEST(VisionOps, GeluErfAndTanh) {
  std::mt19937 rng(12);
  Tensor x = random_tensor({3, 301}, rng, 6.0f);
  for (op::GeluKind kind : {op::GeluKind::kErf, op::GeluKind::kTanh}) {
    Tensor out = poisoned(x.shape());
    ASSERT_OK(op::gelu(x, kind, out));
    double worst = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.data<float>()[i];
      const double ref = kind == op::GeluKind::kErf
                             ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                             : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      worst = std::max(worst, std::fabs(out.data<float>()[i] - ref));
    }
    EXPECT_LE(worst, 2e-6) << (kind == op::GeluKind::kErf ? "erf" : "tanh");
  }
  // The two differ by up to ~1e-3 near |x| = 2: a test that mixed them up would see it.
  Tensor a = poisoned(x.shape()), b = poisoned(x.shape());
  ASSERT_OK(op::gelu(x, op::GeluKind::kErf, a));
  ASSERT_OK(op::gelu(x, op::GeluKind::kTanh, b));
  EXPECT_GT(rel_error(a, b), 1e-5);
}

// Hugging Face's form: freqs = outer(pos, inv_freq) for inv_freq of length d/4, one row of
// angles = cat(freqs[row], freqs[col]), emb = cat(angles, angles), x*cos(emb) + rotate_half(x)*sin(emb).
TEST(VisionOps, Rope2dMatchesHuggingFaceForm) {
  std::mt19937 rng(13);
  for (int64_t d : {16, 72, 80}) {
    const int64_t T = 6, heads = 3, quarter = d / 4, half = d / 2;
    const std::vector<int32_t> pos = {0, 0, 0, 1, 1, 0, 5, 9, 13, 2, 31, 47};
    Tensor positions = int_tensor(pos, {T, 2});
    Tensor x = random_tensor({T, heads, d}, rng);
    Tensor ref = Tensor::empty(x.shape(), DataType::kFp32).value();
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
    ASSERT_OK(op::rope_2d(x, positions, 10000.0));
    EXPECT_LE(rel_error(x, ref), 2e-6) << "head_dim " << d;
  }
  Tensor bad = random_tensor({2, 1, 6}, rng);  // d % 4 != 0
  EXPECT_FALSE(op::rope_2d(bad, int_tensor({0, 0, 0, 0}, {2, 2}), 10000.0).ok());
}

// Softmax attention within each sequence, in double, from the definition.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<int32_t>& cu, int64_t heads) {
  const int64_t width = q.dim(1), d = width / heads;
  Tensor ref = Tensor::empty(q.shape(), DataType::kFp32).value();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> w;
        double max_w = -INFINITY, sum = 0;
        for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += double(q.data<float>()[t * width + h * d + c]) * k.data<float>()[j * width + h * d + c];
          }
          w.push_back(dot / std::sqrt(double(d)));
          max_w = std::max(max_w, w.back());
        }
        for (double& x : w) sum += (x = std::exp(x - max_w));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
            o += w[j - cu[s]] * v.data<float>()[j * width + h * d + c];
          }
          ref.data<float>()[t * width + h * d + c] = static_cast<float>(o / sum);
        }
      }
    }
  }
  return ref;
}

TEST(VisionOps, VarlenAttentionStaysWithinEachSequence) {
  std::mt19937 rng(14);
  const int64_t heads = 3, d = 24, T = 40;
  const std::vector<int32_t> cu = {0, 5, 5, 17, 40};  // an empty sequence too
  Tensor q = random_tensor({T, heads * d}, rng, 2.0f), k = random_tensor({T, heads * d}, rng, 2.0f);
  Tensor v = random_tensor({T, heads * d}, rng);
  Tensor out = poisoned(q.shape());
  ASSERT_OK(op::varlen_attention(q, k, v, int_tensor(cu, {5}), heads, out));
  EXPECT_LE(rel_error(out, attention_reference(q, k, v, cu, heads)), 1e-6);
  // One sequence over everything is a different answer: the boundaries matter.
  Tensor whole = poisoned(q.shape());
  ASSERT_OK(op::varlen_attention(q, k, v, int_tensor({0, int32_t(T)}, {2}), heads, whole));
  EXPECT_LE(rel_error(whole, attention_reference(q, k, v, {0, int32_t(T)}, heads)), 1e-6);
  EXPECT_GT(rel_error(whole, out), 1e-3);
}

TEST(VisionOps, VarlenAttentionRejectsBadBounds) {
  std::mt19937 rng(15);
  Tensor q = random_tensor({10, 8}, rng), out = poisoned({10, 8});
  for (const std::vector<int32_t>& cu :
       {std::vector<int32_t>{0, 9}, std::vector<int32_t>{1, 10}, std::vector<int32_t>{0, 6, 4, 10}}) {
    Status s = op::varlen_attention(q, q, q, int_tensor(cu, {int64_t(cu.size())}), 2, out);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("cu_seqlens"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(op::varlen_attention(q, q, q, int_tensor({0, 10}, {2}), 3, out).ok());  // 8 % 3
}

TEST(VisionOps, LayerNormRejectsMismatchedWeight) {
  std::mt19937 rng(16);
  Tensor x = random_tensor({2, 8}, rng), w = random_tensor({8}, rng), b = random_tensor({7}, rng);
  Tensor out = poisoned({2, 8});
  Status s = op::layernorm(x, w, b, 1e-6, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layernorm"), std::string::npos);
}

// ---- CUDA against the CPU reference ----

constexpr DataType kActivations[] = {DataType::kFp32, DataType::kFp16};

TEST(CudaVisionOps, LayerNorm) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(21);
  // Warp-per-row widths (incl. odd), and block-per-row widths (merged tokens: 4 x hidden).
  for (int64_t D : {100, 128, 512, 1024, 4608}) {
    for (DataType w_t : {DataType::kFp32, DataType::kBf16, DataType::kFp16}) {
      for (DataType act : kActivations) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE("D " + std::to_string(D) + " " + dtype_name(w_t) + " weight, " +
                       dtype_name(act) + (in_place ? ", in place" : ""));
          const int64_t R = 7;
          Tensor x = rounded(random_tensor({R, D}, rng, 2.0f, 1.0f), act);
          Tensor w = rounded(random_tensor({D}, rng, 0.5f, 1.0f), w_t);
          Tensor b = rounded(random_tensor({D}, rng, 0.5f), w_t);
          Tensor ref = poisoned({R, D});
          ASSERT_OK(op::layernorm(x, w, b, 1e-6, ref));
          Tensor dx = to_device(x, act);
          Tensor out = in_place ? dx : poisoned({R, D}, act, DeviceType::kCuda);
          ASSERT_OK(op::layernorm(dx, to_device(w, w_t), to_device(b, w_t), 1e-6, out));
          EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));
        }
      }
    }
  }
}

TEST(CudaVisionOps, Gelu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(22);
  for (DataType act : kActivations) {
    for (op::GeluKind kind : {op::GeluKind::kErf, op::GeluKind::kTanh}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + (kind == op::GeluKind::kErf ? " erf" : " tanh"));
      Tensor x = rounded(random_tensor({9, 1001}, rng, 6.0f), act);
      Tensor ref = poisoned(x.shape());
      ASSERT_OK(op::gelu(x, kind, ref));
      Tensor out = poisoned(x.shape(), act, DeviceType::kCuda);
      ASSERT_OK(op::gelu(to_device(x, act), kind, out));
      EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));
    }
  }
}

TEST(CudaVisionOps, Rope2d) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(23);
  for (int64_t d : {64, 72, 80, 128}) {
    for (DataType act : kActivations) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", " + dtype_name(act));
      const int64_t T = 50, heads = 4;
      std::vector<int32_t> pos;
      for (int64_t t = 0; t < T; ++t) {
        pos.push_back(static_cast<int32_t>(t / 7));
        pos.push_back(static_cast<int32_t>((t * 13) % 97));
      }
      Tensor positions = int_tensor(pos, {T, 2});
      Tensor x = rounded(random_tensor({T, heads, d}, rng), act);
      Tensor dx = to_device(x, act);
      ASSERT_OK(op::rope_2d(x, positions, 10000.0));
      ASSERT_OK(op::rope_2d(dx, positions.to(DeviceType::kCuda).value(), 10000.0));
      EXPECT_LE(rel_error(to_host_fp32(dx), x), tolerance(act));
    }
  }
}

TEST(CudaVisionOps, VarlenAttention) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(24);
  struct Case {
    int64_t heads, d;
    std::vector<int32_t> cu;
  };
  // Head dims of the real towers (64, 72) and the kernel's limits; sequences that straddle the
  // kernel's 8-query blocks and 32-key tiles, an empty one, and one long image of many tiles.
  const std::vector<Case> cases = {{2, 64, {0, 13, 13, 50, 83}},
                                   {3, 72, {0, 280}},
                                   {1, 128, {0, 1, 2, 40, 41}},
                                   {4, 40, {0, 7, 64, 65, 130}}};
  for (const Case& c : cases) {
    for (DataType act : kActivations) {
      SCOPED_TRACE("heads " + std::to_string(c.heads) + " d " + std::to_string(c.d) + ", " +
                   dtype_name(act));
      const int64_t T = c.cu.back(), W = c.heads * c.d;
      Tensor q = rounded(random_tensor({T, W}, rng, 2.0f), act);
      Tensor k = rounded(random_tensor({T, W}, rng, 2.0f), act);
      Tensor v = rounded(random_tensor({T, W}, rng), act);
      Tensor cu = int_tensor(c.cu, {int64_t(c.cu.size())});
      Tensor ref = poisoned({T, W});
      ASSERT_OK(op::varlen_attention(q, k, v, cu, c.heads, ref));
      Tensor out = poisoned({T, W}, act, DeviceType::kCuda);
      ASSERT_OK(op::varlen_attention(to_device(q, act), to_device(k, act), to_device(v, act),
                                     cu.to(DeviceType::kCuda).value(), c.heads, out));
      EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));
    }
  }
}

TEST(CudaVisionOps, VarlenAttentionRefusesHeadDimPastItsLimit) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(25);
  Tensor q = to_device(random_tensor({4, 256}, rng), DataType::kFp32);
  Tensor out = poisoned({4, 256}, DataType::kFp32, DeviceType::kCuda);
  Tensor cu = int_tensor({0, 4}, {2}).to(DeviceType::kCuda).value();
  Status s = op::varlen_attention(q, q, q, cu, 1, out);  // head_dim 256
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kuiper
