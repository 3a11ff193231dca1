// The CPU kernels are the reference for everything else, so they are checked here against
// straightforward double-precision formulas on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kuiper/op/attention.h"
#include "kuiper/op/ops.h"

namespace kuiper {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), DataType::kFp32).value();
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

Tensor poisoned(std::vector<int64_t> shape, DataType dtype = DataType::kFp32) {
  Tensor t = Tensor::empty(std::move(shape), dtype).value();
  std::fill(static_cast<char*>(t.raw()), static_cast<char*>(t.raw()) + t.nbytes(), '\xff');
  return t;
}

TEST(CpuOps, MatmulReadsEveryWeightDtypeAndAddsBias) {
  std::mt19937 rng(1);
  const int64_t T = 5, K = 37, N = 70;  // sizes that are not multiples of the blocking
  Tensor x = random_tensor({T, K}, rng), w = random_tensor({N, K}, rng);
  Tensor bias = random_tensor({N}, rng);
  for (DataType wt : {DataType::kFp32, DataType::kFp16, DataType::kBf16}) {
    Tensor wc = Tensor::empty({N, K}, wt).value();
    ASSERT_TRUE(convert_elements(w.raw(), DataType::kFp32, wc.raw(), wt, N * K).ok());
    Tensor widened = Tensor::empty({N, K}, DataType::kFp32).value();
    ASSERT_TRUE(convert_elements(wc.raw(), wt, widened.raw(), DataType::kFp32, N * K).ok());
    Tensor out = poisoned({T, N});
    ASSERT_TRUE(op::matmul(x, wc, &bias, out).ok());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < N; ++n) {
        double ref = bias.data<float>()[n];
        for (int64_t k = 0; k < K; ++k) {
          ref += double(x.data<float>()[t * K + k]) * widened.data<float>()[n * K + k];
        }
        EXPECT_NEAR(out.data<float>()[t * N + n], ref, 1e-5) << dtype_name(wt);
      }
    }
  }
}

TEST(CpuOps, MatmulRejectsMismatchedShapes) {
  std::mt19937 rng(2);
  Tensor x = random_tensor({2, 8}, rng), w = random_tensor({4, 9}, rng), out = poisoned({2, 4});
  Status s = op::matmul(x, w, nullptr, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("matmul"), std::string::npos);
}

TEST(CpuOps, RmsNormPerRowAndPerHead) {
  std::mt19937 rng(3);
  Tensor x = random_tensor({3, 4, 16}, rng), w = random_tensor({16}, rng);
  Tensor out = poisoned({3, 4, 16});
  ASSERT_TRUE(op::rmsnorm(x, w, 1e-6, out).ok());
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

TEST(CpuOps, RopeRotatesHalvesByPositionAngle) {
  std::mt19937 rng(4);
  const int64_t T = 3, heads = 2, d = 8;
  const double theta = 10000.0;
  Tensor x = random_tensor({T, heads, d}, rng), orig = x.to(DeviceType::kCpu).value();
  Tensor pos = Tensor::empty({T}, DataType::kInt32).value();
  const int32_t positions[T] = {0, 5, 1000};
  for (int t = 0; t < T; ++t) pos.data<int32_t>()[t] = positions[t];
  ASSERT_TRUE(op::rope(x, pos, theta).ok());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = orig.data<float>() + (t * heads + h) * d;
      const float* b = x.data<float>() + (t * heads + h) * d;
      for (int64_t i = 0; i < d / 2; ++i) {
        double angle = positions[t] * std::pow(theta, -2.0 * i / d);
        EXPECT_NEAR(b[i], a[i] * std::cos(angle) - a[i + d / 2] * std::sin(angle), 2e-4);
        EXPECT_NEAR(b[i + d / 2], a[i + d / 2] * std::cos(angle) + a[i] * std::sin(angle), 2e-4);
      }
    }
  }
}

TEST(CpuOps, SwigluAddArgmaxEmbedding) {
  std::mt19937 rng(5);
  Tensor g = random_tensor({4, 6}, rng, 4.0f), u = random_tensor({4, 6}, rng);
  Tensor out = poisoned({4, 6});
  ASSERT_TRUE(op::swiglu(g, u, out).ok());
  for (int i = 0; i < 24; ++i) {
    double gv = g.data<float>()[i];
    EXPECT_NEAR(out.data<float>()[i], gv / (1 + std::exp(-gv)) * u.data<float>()[i], 1e-5);
  }
  ASSERT_TRUE(op::add(g, u, out).ok());
  EXPECT_FLOAT_EQ(out.data<float>()[7], g.data<float>()[7] + u.data<float>()[7]);

  Tensor logits = random_tensor({2, 50}, rng);
  logits.data<float>()[17] = 9.0f;
  logits.data<float>()[50 + 49] = 9.0f;
  Tensor idx = poisoned({2}, DataType::kInt32);
  ASSERT_TRUE(op::argmax(logits, idx).ok());
  EXPECT_EQ(idx.data<int32_t>()[0], 17);
  EXPECT_EQ(idx.data<int32_t>()[1], 49);

  Tensor table = Tensor::empty({10, 4}, DataType::kBf16).value();
  for (int i = 0; i < 40; ++i) table.data<uint16_t>()[i] = float_to_bf16(static_cast<float>(i));
  Tensor ids = Tensor::empty({2}, DataType::kInt32).value();
  ids.data<int32_t>()[0] = 7;
  ids.data<int32_t>()[1] = 2;
  Tensor emb = poisoned({2, 4});
  ASSERT_TRUE(op::embedding(table, ids, emb).ok());
  EXPECT_EQ(emb.data<float>()[0], 28.0f);
  EXPECT_EQ(emb.data<float>()[5], 9.0f);
}

// Naive attention in double precision over explicit per-query key ranges.
void reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t start,
                         std::vector<double>& out) {
  const int64_t T = q.dim(0), H = q.dim(1), d = q.dim(2), KVH = k.dim(1);
  out.assign(static_cast<size_t>(T * H * d), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KVH), len = start + t + 1;
      std::vector<double> s(static_cast<size_t>(len));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) {
          dot += double(q.data<float>()[(t * H + h) * d + i]) * k.data<float>()[(j * KVH + kvh) * d + i];
        }
        s[j] = dot / std::sqrt(double(d));
        mx = std::max(mx, s[j]);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t i = 0; i < d; ++i) {
          out[(t * H + h) * d + i] += s[j] / sum * v.data<float>()[(j * KVH + kvh) * d + i];
        }
      }
    }
  }
}

TEST(CpuOps, AttentionIsCausalGroupedQuerySoftmax) {
  std::mt19937 rng(6);
  const int64_t T = 5, start = 3, H = 4, KVH = 2, d = 16, ctx = 12;
  Tensor q = random_tensor({T, H, d}, rng, 2.0f);
  Tensor k = random_tensor({ctx, KVH, d}, rng, 2.0f), v = random_tensor({ctx, KVH, d}, rng);
  for (AttentionKind kind : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    op::AttentionRequest req;
    req.kind = kind;
    req.head_dim = d;
    auto attention = op::make_attention(req);
    ASSERT_TRUE(attention.ok()) << attention.status().message();
    op::AttentionArgs args;
    args.q = q;
    args.k_cache = k;
    args.v_cache = v;
    args.out = poisoned({T, H, d});
    args.start = start;
    ASSERT_TRUE((*attention)->forward(args).ok());
    std::vector<double> ref;
    reference_attention(q, k, v, start, ref);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(args.out.data<float>()[i], ref[i], 1e-5);
  }
}

TEST(CpuOps, AttentionRefusesUnsupportedCombinations) {
  op::AttentionRequest req;
  req.dtype = DataType::kFp16;
  EXPECT_FALSE(op::make_attention(req).ok());
  req.dtype = DataType::kFp32;
  req.graph_safe = true;
  EXPECT_FALSE(op::make_attention(req).ok());
}

TEST(CpuOps, AttentionRejectsPositionsPastTheCache) {
  std::mt19937 rng(7);
  op::AttentionArgs args;
  args.q = random_tensor({4, 2, 8}, rng);
  args.k_cache = random_tensor({6, 1, 8}, rng);
  args.v_cache = random_tensor({6, 1, 8}, rng);
  args.out = poisoned({4, 2, 8});
  args.start = 3;
  auto attention = op::make_attention(op::AttentionRequest{});
  ASSERT_TRUE(attention.ok());
  EXPECT_FALSE((*attention)->forward(args).ok());
}

}  // namespace
}  // namespace kuiper
