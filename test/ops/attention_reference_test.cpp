// The CPU attention reference (every attention kind runs it on the CPU) against a
// double-precision causal grouped-query softmax on random inputs, and the requests it refuses.
// The GPU attention family has its own tests (test/cuda_attention_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kuiper/op/attention.h"
#include "kuiper/op/ops.h"
#include "support/assertions.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

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

TEST(AttentionReference, IsCausalGroupedQuerySoftmax) {
  const int64_t T = 5, start = 3, H = 4, KVH = 2, d = 16, ctx = 12;
  Tensor q = random_tensor({T, H, d}, 6, DataType::kFp32, 2.0f);
  Tensor k = random_tensor({ctx, KVH, d}, 7, DataType::kFp32, 2.0f);
  Tensor v = random_tensor({ctx, KVH, d}, 8);
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
    args.out = poisoned({T, H, d}, DataType::kFp32);
    args.start = start;
    ASSERT_OK((*attention)->forward(args));
    std::vector<double> ref;
    reference_attention(q, k, v, start, ref);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(args.out.data<float>()[i], ref[i], 1e-5);
  }
}

TEST(AttentionReference, RefusesUnsupportedCombinations) {
  op::AttentionRequest req;
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {  // the CPU computes in fp32
    req.dtype = dtype;
    EXPECT_FALSE(op::make_attention(req).ok()) << dtype_name(dtype);
  }
  req.dtype = DataType::kFp32;
  req.device_position = true;
  EXPECT_FALSE(op::make_attention(req).ok());
}

TEST(AttentionReference, RejectsPositionsPastTheCache) {
  op::AttentionArgs args;
  args.q = random_tensor({4, 2, 8}, 9);
  args.k_cache = random_tensor({6, 1, 8}, 10);
  args.v_cache = random_tensor({6, 1, 8}, 11);
  args.out = poisoned({4, 2, 8}, DataType::kFp32);
  args.start = 3;
  auto attention = op::make_attention(op::AttentionRequest{});
  ASSERT_TRUE(attention.ok());
  EXPECT_FALSE((*attention)->forward(args).ok());
}

// A paged batch's live count (the sequences before a decode graph's pads) must name one of its
// sequences; the CPU attends for the pads too (PagedBatch::live lets an implementation skip them).
TEST(AttentionReference, PagedLiveCountNamesASequence) {
  const int64_t H = 2, KVH = 1, d = 8, block = 4;
  auto ints = [](std::vector<int32_t> values) {
    Tensor t = *Tensor::empty({static_cast<int64_t>(values.size())}, DataType::kInt32);
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
  };
  op::AttentionArgs args;
  args.q = random_tensor({2, H, d}, 12);
  args.k_cache = random_tensor({3 * block, KVH, d}, 13);
  args.v_cache = random_tensor({3 * block, KVH, d}, 14);
  args.paged.query_begin = ints({0, 1, 2});
  args.paged.starts = ints({5, 0});
  args.paged.block_tables = *ints({1, 2, 0, 0}).reshape({2, 2});
  args.paged.block_size = block;
  args.paged.max_queries = 1;
  args.paged.max_keys = 6;
  op::AttentionRequest req;
  req.phase = op::AttentionPhase::kDecode;
  req.head_dim = d;
  auto attention = op::make_attention(req);
  ASSERT_TRUE(attention.ok()) << attention.status().message();
  for (int32_t live : {1, 2}) {
    args.paged.live = ints({live});
    args.out = poisoned({2, H, d}, DataType::kFp32);
    ASSERT_OK((*attention)->forward(args));
    for (int64_t i = 0; i < args.out.numel(); ++i) EXPECT_TRUE(std::isfinite(args.out.data<float>()[i]));
  }
  for (int32_t live : {0, 3}) {
    args.paged.live = ints({live});
    const Status st = (*attention)->forward(args);
    EXPECT_FALSE(st.ok()) << live;
    EXPECT_NE(st.message().find("live"), std::string::npos) << st.message();
  }
  args.paged.live = ints({1, 1});
  EXPECT_FALSE((*attention)->forward(args).ok());
}

}  // namespace
}  // namespace kuiper::test
