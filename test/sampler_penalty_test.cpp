// OpenAI's presence and frequency penalties in the Sampler: over the tokens the sampler drew
// (not the prompt), on the host path and the tensor path alike.
#include <gtest/gtest.h>

#include "kuiper/runtime/sampler.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper {
namespace {

SamplingParams greedy(float presence, float frequency) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  return p;
}

std::vector<int32_t> draws(Sampler& s, const std::vector<float>& logits, int count) {
  std::vector<int32_t> ids;
  // The prompt (history) holds token 0 many times: the penalties must not count it.
  const std::vector<int32_t> prompt(10, 0);
  for (int i = 0; i < count; ++i) ids.push_back(s.sample(logits.data(), 4, prompt));
  return ids;
}

TEST(SamplerPenalties, FrequencyPenaltyGrowsWithEachDraw) {
  Sampler s = *Sampler::create(greedy(0.0f, 0.5f));
  // 1.0 -> 0.5 after one draw of 0, so 0.9 wins; then 0.5 vs 0.4: 0 again; then 0.0 vs 0.4: 1.
  EXPECT_EQ(draws(s, {1.0f, 0.9f, 0.0f, -1.0f}, 4), (std::vector<int32_t>{0, 1, 0, 1}));
}

TEST(SamplerPenalties, PresencePenaltyIsPaidOnce) {
  Sampler s = *Sampler::create(greedy(2.0f, 0.0f));
  // Each drawn token sits 2 lower, however often it was drawn: 0, then 1 (0.9 > -1.0), then 2
  // (0.0 > -1.0, -1.1), then 0 again (-1.0 > -1.1, -2.0, -3.0).
  EXPECT_EQ(draws(s, {1.0f, 0.9f, 0.0f, -3.0f}, 4), (std::vector<int32_t>{0, 1, 2, 0}));
}

TEST(SamplerPenalties, OffLeavesGreedyAlone) {
  Sampler s = *Sampler::create(greedy(0.0f, 0.0f));
  EXPECT_EQ(draws(s, {1.0f, 0.9f, 0.0f, -1.0f}, 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(SamplerPenalties, TensorPathMatchesHostPath) {
  std::vector<float> logits = {1.0f, 0.9f, 0.0f, -1.0f};
  Sampler host = *Sampler::create(greedy(0.3f, 0.4f));
  Sampler tensor = *Sampler::create(greedy(0.3f, 0.4f));
  const Tensor row = Tensor::view(logits.data(), {1, 4}, DataType::kFp32, DeviceType::kCpu);
  for (int i = 0; i < 6; ++i) {
    Result<int32_t> t = tensor.sample(row, {});
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(*t, host.sample(logits.data(), 4, {}));
  }
}

TEST(SamplerPenalties, OutOfRangeIsRefused) {
  EXPECT_FALSE(Sampler::create(greedy(2.5f, 0.0f)).ok());
  EXPECT_FALSE(Sampler::create(greedy(0.0f, -3.0f)).ok());
  EXPECT_TRUE(Sampler::create(greedy(-2.0f, 2.0f)).ok());
}

}  // namespace
}  // namespace kuiper
