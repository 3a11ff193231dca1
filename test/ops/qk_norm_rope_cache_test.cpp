// op::qk_norm_rope_cache: the CPU reference is the unfused ops (rmsnorm, rope, kv_write) with
// the rotary positions apart from the cache rows where given; every backend matches it, with and
// without YaRN.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

// With rotary positions apart from the cache rows (how Qwen3-VL runs text tokens): RoPE at the
// rotary positions, rows written at the cache rows, plain or YaRN; rotary positions that do not
// fit the tokens are an error.
void takes_rotary_positions_apart(const op::RopeParams& rope) {
  SCOPED_TRACE(rope.scaling == op::RopeScaling::kYarn ? "yarn" : "plain");
  const int64_t T = 2, H = 2, d = 8, rows = 6;
  const std::vector<int32_t> cache_rows = {1, 4};
  const Tensor pos = int_tensor(cache_rows, {T}), rot = int_tensor({100, 7}, {T});
  Tensor q = random_tensor({T, H, d}, 40), k = random_tensor({T, 1, d}, 41);
  Tensor v = random_tensor({T, d}, 42);
  Tensor kc = *Tensor::empty({rows, d}, DataType::kFp32),
         vc = *Tensor::empty({rows, d}, DataType::kFp32);
  std::fill(kc.data<float>(), kc.data<float>() + kc.numel(), 0.0f);
  std::fill(vc.data<float>(), vc.data<float>() + vc.numel(), 0.0f);
  Tensor rq = *q.to(DeviceType::kCpu), rk = *k.to(DeviceType::kCpu);
  ASSERT_OK(op::rope(rq, rot, rope));
  ASSERT_OK(op::rope(rk, rot, rope));
  ASSERT_OK(op::qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, pos, rope, kc, vc, &rot));
  for (int64_t i = 0; i < q.numel(); ++i) EXPECT_EQ(q.data<float>()[i], rq.data<float>()[i]);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      EXPECT_EQ(kc.data<float>()[cache_rows[t] * d + i], rk.data<float>()[t * d + i]);
      EXPECT_EQ(vc.data<float>()[cache_rows[t] * d + i], v.data<float>()[t * d + i]);
    }
  }
  const Tensor short_rot = int_tensor({100}, {1});
  EXPECT_FALSE(
      op::qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, pos, rope, kc, vc, &short_rot).ok());
}

TEST(QkNormRopeCache, CpuTakesRotaryPositionsApart) {
  for (const op::RopeParams& rope :
       {op::RopeParams(1e6), op::yarn_rope(1e6, 8, 4.0, 32768, 32, 1, 1.25, true)}) {
    takes_rotary_positions_apart(rope);
  }
}

TEST(QkNormRopeCache, RefusesHostCacheRowsOutsideTheCache) {
  Tensor q = random_tensor({1, 2, 8}, 43), k = random_tensor({1, 1, 8}, 44);
  Tensor v = random_tensor({1, 8}, 45);
  Tensor kc = random_tensor({4, 8}, 46), vc = random_tensor({4, 8}, 47);
  const Status s =
      op::qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, int_tensor({4}, {1}), 1e6, kc, vc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("outside"), std::string::npos) << s.message();
}

// The stacked form is the unstacked one on qkv's parts: the same q and caches, qkv's k left
// rotated, its q and v heads untouched.
TEST(QkNormRopeCache, CpuStackedIsTheUnstackedForm) {
  const int64_t T = 3, Hq = 4, Hkv = 2, d = 8, rows = 10, row = (Hq + 2 * Hkv) * d;
  const op::RopeParams rope(1e6);
  const Tensor pos = int_tensor({2, 9, 5}, {T}), rot = int_tensor({40, 3, 700}, {T});
  const Tensor norm = random_tensor({d}, 50);
  Tensor qkv = random_tensor({T, Hq + 2 * Hkv, d}, 51, DataType::kFp32, 2.0f);
  const Tensor before = *qkv.to(DeviceType::kCpu);
  Tensor q = *Tensor::empty({T, Hq, d}, DataType::kFp32);
  Tensor k = *Tensor::empty({T, Hkv, d}, DataType::kFp32);
  Tensor v = *Tensor::empty({T, Hkv * d}, DataType::kFp32);
  const float* s = before.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < Hq * d; ++i) q.data<float>()[t * Hq * d + i] = s[t * row + i];
    for (int64_t i = 0; i < Hkv * d; ++i) {
      k.data<float>()[t * Hkv * d + i] = s[t * row + Hq * d + i];
      v.data<float>()[t * Hkv * d + i] = s[t * row + (Hq + Hkv) * d + i];
    }
  }
  Tensor kc = random_tensor({rows, Hkv * d}, 52), vc = random_tensor({rows, Hkv * d}, 53);
  Tensor kc2 = *kc.to(DeviceType::kCpu), vc2 = *vc.to(DeviceType::kCpu);
  ASSERT_OK(op::qk_norm_rope_cache(q, k, v, &norm, &norm, 1e-6, pos, rope, kc, vc, &rot));
  Tensor q2 = poisoned({T, Hq, d}, DataType::kFp32);
  ASSERT_OK(op::qk_norm_rope_cache(qkv, q2, &norm, &norm, 1e-6, pos, rope, kc2, vc2, &rot));
  for (int64_t i = 0; i < q.numel(); ++i) EXPECT_EQ(q2.data<float>()[i], q.data<float>()[i]);
  for (int64_t i = 0; i < kc.numel(); ++i) {
    EXPECT_EQ(kc2.data<float>()[i], kc.data<float>()[i]);
    EXPECT_EQ(vc2.data<float>()[i], vc.data<float>()[i]);
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < row; ++i) {
      const bool is_k = i >= Hq * d && i < (Hq + Hkv) * d;
      const float want = is_k ? k.data<float>()[t * Hkv * d + i - Hq * d] : s[t * row + i];
      EXPECT_EQ(qkv.data<float>()[t * row + i], want) << t << " " << i;
    }
  }
  Tensor odd_q = poisoned({T, Hq + 1, d}, DataType::kFp32);  // leaves an odd k|v part
  EXPECT_FALSE(
      op::qk_norm_rope_cache(qkv, odd_q, nullptr, nullptr, 1e-6, pos, rope, kc2, vc2).ok());
}

// Arguments: q, k, v, q norm, k norm, cache rows, k cache, v cache, rotary positions.
std::vector<OpCase> qk_norm_rope_cache_cases() {
  const int64_t T = 4, Hq = 6, Hkv = 2, rows = 50;
  std::vector<OpCase> cases;
  for (int64_t d : {128, 64, 6}) {
    for (DataType act : kActivations) {
      // YaRN with the norm only: the rotation is the same code either way
      for (int variant = 0; variant < 3; ++variant) {
        const bool with_norm = variant != 1, yarn = variant == 2;
        const op::RopeParams rope =
            yarn ? op::yarn_rope(1e6, d, 4.0, 32768, 32, 1, 1.25, true) : op::RopeParams(1e6);
        // rotary positions apart from the cache rows (Qwen3-VL text after images), or the same
        for (bool apart : {false, true}) {
          OpCase c{"qk_norm_rope_cache head_dim " + std::to_string(d) + " " + dtype_name(act) +
                       (with_norm ? " qk norm" : "") + (yarn ? " yarn" : "") +
                       (apart ? " rope positions apart" : ""),
                   {in_out({T, Hq, d}, act, 2.0f), in_out({T, Hkv, d}, act, 2.0f),
                    in({T, Hkv * d}, act), in({d}, act, 0.5f, 1.0f), in({d}, act, 0.5f, 1.0f),
                    ints({3, 0, 49, 17}, {T}), in_out({rows, Hkv * d}, act),
                    in_out({rows, Hkv * d}, act), ints({900, 7, 51, 30000}, {T})},
                   [=](std::vector<Tensor>& a) {
                     return op::qk_norm_rope_cache(a[0], a[1], a[2], with_norm ? &a[3] : nullptr,
                                                   with_norm ? &a[4] : nullptr, 1e-6, a[5], rope,
                                                   a[6], a[7], apart ? &a[8] : nullptr);
                   },
                   {1e-5, 2e-3}};
          c.args[7].tolerance = 0.0;  // v rows are copied
          cases.push_back(c);
        }
      }
    }
  }
  // The stacked form. Arguments: qkv, q, q norm, k norm, cache rows, k cache, v cache, rotary
  // positions.
  for (int64_t d : {128, 6}) {
    for (DataType act : kActivations) {
      for (bool with_norm : {true, false}) {
        OpCase c{"qk_norm_rope_cache stacked head_dim " + std::to_string(d) + " " +
                     dtype_name(act) + (with_norm ? " qk norm" : ""),
                 {in_out({T, Hq + 2 * Hkv, d}, act, 2.0f), out({T, Hq, d}, act),
                  in({d}, act, 0.5f, 1.0f), in({d}, act, 0.5f, 1.0f), ints({3, 0, 49, 17}, {T}),
                  in_out({rows, Hkv * d}, act), in_out({rows, Hkv * d}, act),
                  ints({900, 7, 51, 30000}, {T})},
                 [=](std::vector<Tensor>& a) {
                   return op::qk_norm_rope_cache(a[0], a[1], with_norm ? &a[2] : nullptr,
                                                 with_norm ? &a[3] : nullptr, 1e-6, a[4],
                                                 op::RopeParams(1e6), a[5], a[6], &a[7]);
                 },
                 {1e-5, 2e-3}};
        c.args[6].tolerance = 0.0;  // v rows are copied
        cases.push_back(c);
      }
    }
  }
  // Model-sized heads, the stacked form: a CUDA block's warps take several heads each, in one
  // round (Qwen3-8B's 32 + 8 + 8), a round some warps' last head misses (28 + 4 + 4) and two
  // rounds (64 + 8 + 8); at 37 tokens several blocks share a token's heads, at 300 one block
  // takes them all.
  const std::vector<std::pair<int64_t, int64_t>> model_heads = {{32, 8}, {28, 4}, {64, 8}};
  for (const auto& [Hq_m, Hkv_m] : model_heads) {
    for (const int64_t Tm : {37, 300}) {
      for (DataType act : kActivations) {
        const int64_t dm = 128, rows_m = 2 * Tm + 3;
        std::vector<int32_t> cache_rows, rotary;
        for (int32_t t = 0; t < Tm; ++t) {
          cache_rows.push_back(2 * t + 1);
          rotary.push_back(100 + 7 * t);
        }
        OpCase c{"qk_norm_rope_cache stacked " + std::to_string(Tm) + " tokens of " +
                     std::to_string(Hq_m) + " + " + std::to_string(Hkv_m) + " heads " +
                     dtype_name(act),
                 {in_out({Tm, Hq_m + 2 * Hkv_m, dm}, act, 2.0f), out({Tm, Hq_m, dm}, act),
                  in({dm}, act, 0.5f, 1.0f), in({dm}, act, 0.5f, 1.0f), ints(cache_rows, {Tm}),
                  in_out({rows_m, Hkv_m * dm}, act), in_out({rows_m, Hkv_m * dm}, act),
                  ints(rotary, {Tm})},
                 [=](std::vector<Tensor>& a) {
                   return op::qk_norm_rope_cache(a[0], a[1], &a[2], &a[3], 1e-6, a[4],
                                                 op::RopeParams(1e6), a[5], a[6], &a[7]);
                 },
                 {1e-5, 2e-3}};
        c.args[6].tolerance = 0.0;  // v rows are copied
        cases.push_back(c);
      }
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(QkNormRopeCache, qk_norm_rope_cache_cases)

}  // namespace
}  // namespace kuiper::test
