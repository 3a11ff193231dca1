// op::sample: the CPU kernel against the host Sampler (runs everywhere), and the CUDA kernel
// against the CPU on random rows of the vocabulary sizes that matter (skips without a GPU). Not
// through the op harness: a draw is one token, compared token by token along a generation.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kuiper/op/ops.h"
#include "kuiper/runtime/sampler.h"
#include "support/assertions.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

std::vector<float> random_logits(int64_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& v : logits) v = normal(rng);
  return logits;
}

std::vector<int32_t> random_history(int64_t vocab, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> h(n);
  for (int32_t& v : h) v = id(rng);
  // Repeats, which the penalty must count once.
  for (size_t i = 1; i < n; i += 3) h[i] = h[i - 1];
  return h;
}

SamplingParams params(float temperature, int32_t top_k, float top_p, float min_p,
                      float repeat_penalty, int32_t repeat_last_n, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = repeat_penalty;
  p.repeat_last_n = repeat_last_n;
  p.seed = seed;
  return p;
}

// Greedy, temperature only, each warper alone, the penalty, and mixes of them.
std::vector<SamplingParams> cases(uint64_t seed) {
  return {
      params(0.0f, 0, 1.0f, 0.0f, 1.0f, 64, seed),      // greedy
      params(0.0f, 0, 1.0f, 0.0f, 1.3f, 64, seed),      // greedy with the penalty
      params(1.0f, 0, 1.0f, 0.0f, 1.0f, 64, seed),      // plain softmax draw
      params(0.7f, 0, 1.0f, 0.0f, 1.0f, 64, seed),      // temperature only
      params(1.0f, 40, 1.0f, 0.0f, 1.0f, 64, seed),     // top-k
      params(1.0f, 1, 1.0f, 0.0f, 1.0f, 64, seed),      // top-k 1 is greedy
      params(1.0f, 0, 0.9f, 0.0f, 1.0f, 64, seed),      // top-p
      params(1.0f, 0, 0.3f, 0.0f, 1.0f, 64, seed),      // a tight top-p
      params(1.0f, 0, 1.0f, 0.05f, 1.0f, 64, seed),     // min-p
      params(1.0f, 0, 1.0f, 0.0f, 1.5f, -1, seed),      // the penalty over all the history
      params(0.8f, 40, 0.95f, 0.05f, 1.0f, 64, seed),   // llama.cpp's defaults
      params(1.2f, 2000, 0.8f, 0.01f, 1.1f, 16, seed),  // everything
      params(0.5f, 5000, 0.99f, 0.0f, 0.8f, 64, seed),  // a penalty < 1 favours repeats
  };
}

TEST(Sample, CpuKernelMatchesTheSampler) {
  for (int64_t vocab : {7, 1000}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const std::vector<float> logits = random_logits(vocab, seed, 2.0f);
      const Tensor row =
          Tensor::view(const_cast<float*>(logits.data()), {1, vocab}, DataType::kFp32,
                       DeviceType::kCpu);
      for (const SamplingParams& p : cases(seed)) {
        Sampler by_pointer = *Sampler::create(p);
        Sampler by_tensor = *Sampler::create(p);
        std::vector<int32_t> history = random_history(vocab, 40, seed + 100);
        for (int step = 0; step < 20; ++step) {
          const int32_t expected = by_pointer.sample(logits.data(), vocab, history);
          Result<int32_t> got = by_tensor.sample(row, history);
          ASSERT_TRUE(got.ok()) << got.status().message();
          ASSERT_EQ(*got, expected) << "vocab " << vocab << " seed " << seed << " step " << step;
          history.push_back(expected);
        }
      }
    }
  }
}

TEST(Sample, RefusesBadArguments) {
  std::vector<float> logits(8, 0.0f);
  const Tensor row = Tensor::view(logits.data(), {8}, DataType::kFp32, DeviceType::kCpu);
  Tensor out = *Tensor::empty({1}, DataType::kInt32);
  op::SampleWorkspace ws;
  op::SampleParams p;
  p.temperature = 1.0f;
  EXPECT_FALSE(op::sample(row, Tensor(), p, 1.0, ws, out).ok());  // uniform must be < 1
  Tensor wide = *Tensor::empty({2}, DataType::kInt32);
  EXPECT_FALSE(op::sample(row, Tensor(), p, 0.5, ws, wide).ok());
  p.top_p = 0.0f;
  EXPECT_FALSE(op::sample(row, Tensor(), p, 0.5, ws, out).ok());
}

TEST(Sample, RepetitionPenaltyCountsEachIdOnceAndSkipsUnknownIds) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f};
  const std::vector<int32_t> recent = {0, 0, 1, 7, -1};
  op::repetition_penalty(2.0f, recent.data(), static_cast<int64_t>(recent.size()), logits.data(),
                         3);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f}));
}

TEST(Sample, DrawWalksTheCumulativeProbabilitiesInIdOrder) {
  // Most likely first, as sample_candidates leaves them; the draw walks ids 3, 5, 9.
  const std::vector<TokenProbability> candidates = {{9, 0.5f}, {3, 0.25f}, {5, 0.25f}};
  EXPECT_EQ(op::draw(candidates, 0.0), 3);
  EXPECT_EQ(op::draw(candidates, 0.24), 3);
  EXPECT_EQ(op::draw(candidates, 0.25), 5);
  EXPECT_EQ(op::draw(candidates, 0.49), 5);
  EXPECT_EQ(op::draw(candidates, 0.5), 9);
  EXPECT_EQ(op::draw(candidates, 0.999), 9);
  // Past a total below one (rounding): the largest id.
  EXPECT_EQ(op::draw({{4, 0.5f}, {2, 0.25f}}, 0.9), 4);
}

TEST(Sample, CandidatesAreTopKRenormalised) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f};
  op::SampleParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  const std::vector<TokenProbability> c = op::sample_candidates(logits.data(), 4, p);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 1);  // equal logits: the lower id first
  EXPECT_EQ(c[1].id, 3);
  EXPECT_FLOAT_EQ(c[0].probability, 0.5f);
  EXPECT_FLOAT_EQ(c[1].probability, 0.5f);
}

// Runs the host Sampler and a second one on the device copy of the row for `steps` tokens;
// both draw from their own generator with the same seed, so they must agree token for token.
void expect_device_matches_host(int64_t vocab, uint64_t seed, int steps) {
  const std::vector<float> logits = random_logits(vocab, seed, 3.0f);
  const Tensor host = Tensor::view(const_cast<float*>(logits.data()), {1, vocab},
                                   DataType::kFp32, DeviceType::kCpu);
  Result<Tensor> device = host.to(DeviceType::kCuda);
  ASSERT_TRUE(device.ok()) << device.status().message();
  for (const SamplingParams& p : cases(seed)) {
    Sampler on_host = *Sampler::create(p);
    Sampler on_device = *Sampler::create(p);
    std::vector<int32_t> history = random_history(vocab, 100, seed + 7);
    for (int step = 0; step < steps; ++step) {
      const int32_t expected = on_host.sample(logits.data(), vocab, history);
      Result<int32_t> got = on_device.sample(*device, history);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_EQ(*got, expected) << "vocab " << vocab << " seed " << seed << " step " << step
                                << " temperature " << p.temperature << " top_k " << p.top_k
                                << " top_p " << p.top_p << " min_p " << p.min_p << " penalty "
                                << p.repeat_penalty;
      history.push_back(expected);
    }
  }
}

TEST(Sample, CudaMatchesTheHostSamplerOnASmallVocabulary) {
  SKIP_WITHOUT_CUDA();
  for (int64_t vocab : {1, 5, 1000, 3000}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) expect_device_matches_host(vocab, seed, 24);
  }
}

TEST(Sample, CudaMatchesTheHostSamplerOnQwensVocabulary) {
  SKIP_WITHOUT_CUDA();
  for (uint64_t seed = 11; seed <= 13; ++seed) expect_device_matches_host(151936, seed, 6);
}

// The op straight, over the range of the draw and into a poisoned output.
TEST(Sample, CudaOpMatchesTheCpuKernelOverTheRangeOfTheDraw) {
  SKIP_WITHOUT_CUDA();
  const int64_t vocab = 151936;
  const std::vector<float> logits = random_logits(vocab, 5, 4.0f);
  const Tensor host = Tensor::view(const_cast<float*>(logits.data()), {vocab}, DataType::kFp32,
                                   DeviceType::kCpu);
  const Tensor device = *host.to(DeviceType::kCuda);
  std::vector<int32_t> recent = random_history(vocab, 64, 9);
  const Tensor recent_host =
      Tensor::view(recent.data(), {64}, DataType::kInt32, DeviceType::kCpu);
  const Tensor recent_device = *recent_host.to(DeviceType::kCuda);
  op::SampleWorkspace host_ws, device_ws;
  for (SamplingParams sp : cases(1)) {
    sp.repeat_last_n = -1;  // the whole of `recent`, as the op sees it
    const op::SampleParams p{sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty};
    const std::vector<TokenProbability> pool =
        Sampler::create(sp)->candidates(logits.data(), vocab, recent);
    for (double u : {0.0, 0.1, 0.25, 0.5, 0.75, 0.999, 1.0 - 0x1.0p-53}) {
      Tensor expected = *Tensor::empty({1}, DataType::kInt32);
      ASSERT_OK(op::sample(host, recent_host, p, u, host_ws, expected));
      Tensor out = poisoned({1}, DataType::kInt32, DeviceType::kCuda);
      ASSERT_OK(op::sample(device, recent_device, p, u, device_ws, out));
      const int32_t got = out.to(DeviceType::kCpu)->data<int32_t>()[0];
      const std::string where = "u " + std::to_string(u) + " temperature " +
                                std::to_string(p.temperature) + " top_k " +
                                std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) +
                                " min_p " + std::to_string(p.min_p) + " penalty " +
                                std::to_string(p.repeat_penalty);
      if (u < 0.99 || sp.temperature == 0.0f) {
        EXPECT_EQ(got, expected.data<int32_t>()[0]) << where;
      } else {
        // High draws cross the CDF in its tail, where the two sums' last bits (summed in a
        // different order) decide between neighbouring tiny probabilities: any kept token is
        // right there, and the drawn one must be kept.
        bool kept = false;
        for (const TokenProbability& c : pool) kept = kept || c.id == got;
        EXPECT_TRUE(kept) << where << ": " << got << " is not a candidate";
        if (got != expected.data<int32_t>()[0]) {
          std::printf("tail draw differs: %s: cpu %d gpu %d\n", where.c_str(),
                      expected.data<int32_t>()[0], got);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kuiper::test
