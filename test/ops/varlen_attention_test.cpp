// op::varlen_attention (the vision tower's attention over packed sequences): the CPU reference
// against softmax attention within each sequence in double, bad bounds refused, every backend
// against the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

// Softmax attention within each sequence, in double, from the definition.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<int32_t>& cu, int64_t heads) {
  const int64_t width = q.dim(1), d = width / heads;
  Tensor ref = *Tensor::empty(q.shape(), DataType::kFp32);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> w;
        double max_w = -INFINITY, sum = 0;
        for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += double(q.data<float>()[t * width + h * d + c]) *
                   k.data<float>()[j * width + h * d + c];
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

TEST(VarlenAttention, CpuStaysWithinEachSequence) {
  const int64_t heads = 3, d = 24, T = 40;
  const std::vector<int32_t> cu = {0, 5, 5, 17, 40};  // an empty sequence too
  Tensor q = random_tensor({T, heads * d}, 14, DataType::kFp32, 2.0f);
  Tensor k = random_tensor({T, heads * d}, 15, DataType::kFp32, 2.0f);
  Tensor v = random_tensor({T, heads * d}, 16);
  Tensor out = poisoned(q.shape(), DataType::kFp32);
  ASSERT_OK(op::varlen_attention(q, k, v, int_tensor(cu, {5}), heads, out));
  EXPECT_LE(rel_error(out, attention_reference(q, k, v, cu, heads)), 1e-6);
  // One sequence over everything is a different answer: the boundaries matter.
  Tensor whole = poisoned(q.shape(), DataType::kFp32);
  ASSERT_OK(op::varlen_attention(q, k, v, int_tensor({0, int32_t(T)}, {2}), heads, whole));
  EXPECT_LE(rel_error(whole, attention_reference(q, k, v, {0, int32_t(T)}, heads)), 1e-6);
  EXPECT_GT(rel_error(whole, out), 1e-3);
}

TEST(VarlenAttention, RejectsBadBounds) {
  Tensor q = random_tensor({10, 8}, 15), out = poisoned({10, 8}, DataType::kFp32);
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{0, 9}, std::vector<int32_t>{1, 10},
                                         std::vector<int32_t>{0, 6, 4, 10}}) {
    Status s = op::varlen_attention(q, q, q, int_tensor(cu, {int64_t(cu.size())}), 2, out);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("cu_seqlens"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(op::varlen_attention(q, q, q, int_tensor({0, 10}, {2}), 3, out).ok());  // 8 % 3
}

TEST(VarlenAttention, CudaRefusesHeadDimPastItsLimit) {
  SKIP_WITHOUT_CUDA();
  Tensor q = upload(random_tensor({4, 256}, 25), DataType::kFp32, DeviceType::kCuda);
  Tensor out = poisoned({4, 256}, DataType::kFp32, DeviceType::kCuda);
  Tensor cu = upload(int_tensor({0, 4}, {2}), DataType::kInt32, DeviceType::kCuda);
  Status s = op::varlen_attention(q, q, q, cu, 1, out);  // head_dim 256
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
}

std::vector<OpCase> varlen_attention_cases() {
  struct Shape {
    int64_t heads, d;
    std::vector<int32_t> cu;
  };
  // Head dims of the real towers (64, 72) and the kernel's limits; sequences that straddle the
  // kernel's 8-query blocks and 32-key tiles, an empty one, and one long image of many tiles.
  const std::vector<Shape> shapes = {{2, 64, {0, 13, 13, 50, 83}},
                                     {3, 72, {0, 280}},
                                     {1, 128, {0, 1, 2, 40, 41}},
                                     {4, 40, {0, 7, 64, 65, 130}}};
  std::vector<OpCase> cases;
  for (const Shape& s : shapes) {
    for (DataType act : kActivations) {
      const int64_t T = s.cu.back(), W = s.heads * s.d;
      const int64_t heads = s.heads;
      cases.push_back({"varlen_attention heads " + std::to_string(s.heads) + " d " +
                           std::to_string(s.d) + " " + dtype_name(act),
                       {in({T, W}, act, 2.0f), in({T, W}, act, 2.0f), in({T, W}, act),
                        ints(s.cu, {int64_t(s.cu.size())}), out({T, W}, act)},
                       [heads](std::vector<Tensor>& a) {
                         return op::varlen_attention(a[0], a[1], a[2], a[3], heads, a[4]);
                       },
                       {2e-5, 3e-3}});
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(VarlenAttention, varlen_attention_cases)

}  // namespace
}  // namespace kuiper::test
