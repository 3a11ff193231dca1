// op::qk_norm_rope_cache: the CPU reference is the unfused ops (rmsnorm, rope, kv_write) with
// the rotary positions apart from the cache rows where given; every backend matches it, with and
// without YaRN.
#include <gtest/gtest.h>

#include <algorithm>

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
  return cases;
}

KUIPER_OP_BACKEND_TEST(QkNormRopeCache, qk_norm_rope_cache_cases)

}  // namespace
}  // namespace kuiper::test
