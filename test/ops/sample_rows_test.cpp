// op::sample_rows: the CUDA pipeline against the CPU reference through the op harness (random
// logits, mixed per-row parameters, poisoned output), the CPU op against op::sample row by row,
// and on the GPU against op::sample row by row at Qwen's vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kuiper/op/ops.h"
#include "support/assertions.h"
#include "support/tensors.h"
#include "ops/harness.h"

namespace kuiper::test {
namespace {

op::SampleParams warpers(float temperature, int32_t top_k, float top_p, float min_p,
                         float repeat_penalty) {
  return {temperature, top_k, top_p, min_p, repeat_penalty};
}

// Greedy, greedy with the penalty, each warper alone and mixes, a penalty < 1, llama.cpp's
// defaults: row i of a batch takes entry i % size.
const std::vector<op::SampleParams>& mixed() {
  static const std::vector<op::SampleParams> params = {
      warpers(0.0f, 0, 1.0f, 0.0f, 1.0f),      // greedy
      warpers(0.8f, 40, 0.95f, 0.05f, 1.0f),   // llama.cpp's defaults
      warpers(0.0f, 0, 1.0f, 0.0f, 1.3f),      // greedy with the penalty
      warpers(1.0f, 0, 1.0f, 0.0f, 1.0f),      // plain softmax draw
      warpers(0.7f, 5, 1.0f, 0.0f, 1.0f),      // top-k
      warpers(1.0f, 0, 0.6f, 0.0f, 1.0f),      // top-p
      warpers(1.0f, 0, 1.0f, 0.1f, 1.5f),      // min-p with the penalty
      warpers(1.2f, 300, 0.8f, 0.01f, 1.1f),   // everything
      warpers(0.5f, 0, 0.99f, 0.0f, 0.8f),     // a penalty < 1 favours repeats
  };
  return params;
}

// S rows over logits [R, V]: row i reads logits row (i * 7) % R (out of order, some twice), has
// the mixed parameters, a uniform below 0.99 (high draws land in the CDF's tail, where the two
// sums' last bits may pick neighbouring tiny probabilities: sample_test covers those) and a
// window of up to 40 ids with repeats and ids outside the vocabulary (every third row's is empty).
struct Batch {
  std::vector<op::SampleRow> rows;
  std::vector<int32_t> recent;
};

Batch make_batch(int64_t S, int64_t R, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 0.99);
  std::uniform_int_distribution<int32_t> id(-2, static_cast<int32_t>(V + 1));
  Batch b;
  for (int64_t i = 0; i < S; ++i) {
    op::SampleRow r;
    r.row = (i * 7) % R;
    r.params = mixed()[static_cast<size_t>(i) % mixed().size()];
    r.uniform = uniform(rng);
    r.recent_begin = static_cast<int64_t>(b.recent.size());
    r.recent_count = i % 3 == 2 ? 0 : std::min<int64_t>(40, 1 + i * 5);
    for (int64_t j = 0; j < r.recent_count; ++j) {
      b.recent.push_back(j % 4 == 1 ? b.recent.back() : id(rng));
    }
    b.rows.push_back(r);
  }
  return b;
}

OpCase sample_rows_case(int64_t S, int64_t R, int64_t V, float scale, uint64_t seed) {
  const Batch batch = make_batch(S, R, V, seed);
  auto workspace = std::make_shared<op::SampleWorkspace>();
  return {"sample_rows " + std::to_string(S) + " of [" + std::to_string(R) + "," +
              std::to_string(V) + "]",
          {in({R, V}, DataType::kFp32, scale), out({S}, DataType::kInt32)},
          [batch, workspace](std::vector<Tensor>& a) {
            return op::sample_rows(a[0], batch.rows, batch.recent, *workspace, a[1]);
          }};
}

std::vector<OpCase> sample_rows_cases() {
  return {
      sample_rows_case(1, 1, 7, 2.0f, 1),          // one row, a vocabulary below a block
      sample_rows_case(1, 3, 1000, 4.0f, 2),       // one row of several
      sample_rows_case(9, 4, 1000, 4.0f, 3),       // every parameter mix, rows reused
      sample_rows_case(12, 12, 3001, 6.0f, 4),     // V not a multiple of the block
      sample_rows_case(10, 9, 151936, 8.0f, 5),    // Qwen's vocabulary
  };
}

KUIPER_OP_BACKEND_TEST(SampleRows, sample_rows_cases)

// The token op::sample gives for each row alone (on the logits' device).
std::vector<int32_t> sample_each(const Tensor& logits, const Batch& batch) {
  const DeviceType device = logits.device();
  op::SampleWorkspace ws;
  Tensor token = *Tensor::empty({1}, DataType::kInt32, device);
  std::vector<int32_t> out;
  for (const op::SampleRow& r : batch.rows) {
    Tensor window;
    if (r.recent_count > 0) {
      window = *Tensor::view(const_cast<int32_t*>(batch.recent.data()) + r.recent_begin,
                             {r.recent_count}, DataType::kInt32, DeviceType::kCpu)
                    .to(device);
    }
    EXPECT_OK(op::sample(logits.rows(r.row, 1), window, r.params, r.uniform, ws, token));
    out.push_back(token.to(DeviceType::kCpu)->data<int32_t>()[0]);
  }
  return out;
}

std::vector<int32_t> sample_all(const Tensor& logits, const Batch& batch,
                                op::SampleWorkspace& ws) {
  const int64_t S = static_cast<int64_t>(batch.rows.size());
  Tensor out = poisoned({S}, DataType::kInt32, logits.device());
  EXPECT_OK(op::sample_rows(logits, batch.rows, batch.recent, ws, out));
  const Tensor host = *out.to(DeviceType::kCpu);
  return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + S);
}

TEST(SampleRows, CpuMatchesSampleRowByRow) {
  const int64_t R = 5, V = 2000;
  Tensor logits = *Tensor::empty({R, V}, DataType::kFp32);
  ASSERT_OK(op::fill_random(logits, 17, 5.0f, 0.0f));
  const Batch batch = make_batch(11, R, V, 8);
  op::SampleWorkspace ws;
  EXPECT_EQ(sample_all(logits, batch, ws), sample_each(logits, batch));
}

TEST(SampleRows, RefusesBadArguments) {
  Tensor logits = *Tensor::empty({2, 8}, DataType::kFp32);
  ASSERT_OK(op::fill_random(logits, 1, 1.0f, 0.0f));
  Tensor out = *Tensor::empty({1}, DataType::kInt32);
  op::SampleWorkspace ws;
  op::SampleRow r;
  r.params.temperature = 1.0f;
  ASSERT_OK(op::sample_rows(logits, {r}, {}, ws, out));
  op::SampleRow bad = r;
  bad.row = 2;  // past the logits
  EXPECT_FALSE(op::sample_rows(logits, {bad}, {}, ws, out).ok());
  bad = r;
  bad.recent_count = 1;  // past `recent`
  EXPECT_FALSE(op::sample_rows(logits, {bad}, {}, ws, out).ok());
  bad = r;
  bad.uniform = 1.0;
  EXPECT_FALSE(op::sample_rows(logits, {bad}, {}, ws, out).ok());
  EXPECT_FALSE(op::sample_rows(logits, {r, r}, {}, ws, out).ok());  // out has one token
  EXPECT_FALSE(op::sample_rows(logits, {}, {}, ws, out).ok());
}

// At Qwen's vocabulary: S rows at once equal op::sample on each row alone, on the GPU (their
// times: `kuiper-bench --sample-only`).
TEST(SampleRows, CudaMatchesSampleRowByRowOnQwensVocabulary) {
  SKIP_WITHOUT_CUDA();
  const int64_t V = 151936;
  op::SampleWorkspace ws;
  for (int64_t S : {1, 8, 64, 100, 256}) {  // 100: a full sort of 64 rows and one of 36
    Tensor logits = *Tensor::empty({S, V}, DataType::kFp32, DeviceType::kCuda);
    ASSERT_OK(op::fill_random(logits, static_cast<uint64_t>(S), 8.0f, 0.0f));
    const Batch batch = make_batch(S, S, V, static_cast<uint64_t>(S) + 100);
    EXPECT_EQ(sample_all(logits, batch, ws), sample_each(logits, batch)) << S << " rows";
  }
}

// Four rows or more that each keep at most 1024 tokens (greedy, or top-k from 1 to 1024, with
// top-p, min-p and penalties) or draw from the whole vocabulary but for top-p and min-p (top-k
// 0: the OpenAI API's default) are drawn on the GPU without the full sort (a radix select of
// the kept tokens; radix searches of the cumulative probability): the same tokens as the CPU's
// sort (and as op::sample row by row, which sorts), at Qwen's vocabulary, at a V that is not a
// multiple of the block, and with logits on a coarse grid, so that thousands of keys tie at the
// select's threshold and at the crossings (the lower ids first, as the stable sort keeps them).
// Batches of selecting rows alone, of whole rows alone, and of both.
TEST(SampleRows, CudaDrawsWithoutTheSortAsTheCpuSorts) {
  SKIP_WITHOUT_CUDA();
  static const std::vector<op::SampleParams> whole = {
      warpers(1.0f, 0, 1.0f, 0.0f, 1.0f),       // OpenAI's defaults
      warpers(0.7f, 0, 1.0f, 0.0f, 1.3f),       // with the penalty
      warpers(1.0f, 0, 0.9f, 0.0f, 1.0f),       // top-p
      warpers(0.8f, 0, 0.95f, 0.05f, 1.0f),     // llama.cpp's defaults but top-k
      warpers(1.0f, 0, 1.0f, 0.1f, 1.3f),       // min-p with the penalty
      warpers(1.2f, 0, 0.5f, 0.02f, 1.0f),      // both
      warpers(1.5f, 0, 0.99f, 0.0f, 0.9f),      // a penalty < 1
  };
  static const std::vector<op::SampleParams> few = {
      warpers(0.0f, 0, 1.0f, 0.0f, 1.0f),       // greedy
      warpers(0.8f, 40, 0.95f, 0.05f, 1.0f),    // llama.cpp's defaults
      warpers(0.0f, 0, 1.0f, 0.0f, 1.3f),       // greedy with the penalty
      warpers(1.0f, 1, 1.0f, 0.0f, 1.0f),       // top-1
      warpers(0.7f, 5, 1.0f, 0.0f, 1.5f),       // top-k with the penalty
      warpers(1.2f, 300, 0.8f, 0.01f, 1.1f),    // everything
      warpers(1.0f, 1024, 1.0f, 0.0f, 1.0f),    // the most the select keeps
      warpers(2.0f, 1000, 0.99f, 0.0f, 0.8f),   // a penalty < 1
  };
  struct Case {
    int64_t S, V;
    float grid;  // logits rounded to multiples of this (0: as drawn)
  };
  // Rows of 1 to 32 chunks (a chunk a block: as many as fill the GPU twice, each of at least
  // 4096 tokens), ties within and across chunks.
  for (const Case c : {Case{9, 3001, 0.0f}, Case{24, 151936, 0.0f}, Case{16, 5000, 0.5f},
                       Case{16, 151936, 1.0f}, Case{4, 151936, 0.0f}, Case{5, 151936, 2.0f},
                       Case{64, 151936, 0.0f}, Case{1, 151936, 0.0f}, Case{3, 151936, 1.0f}}) {
    Tensor logits = *Tensor::empty({c.S, c.V}, DataType::kFp32);
    ASSERT_OK(op::fill_random(logits, static_cast<uint64_t>(c.V + c.S), 6.0f, 0.0f));
    if (c.grid > 0.0f) {
      float* v = logits.data<float>();
      for (int64_t i = 0; i < logits.numel(); ++i) v[i] = std::round(v[i] / c.grid) * c.grid;
    }
    const Tensor on_gpu = *logits.to(DeviceType::kCuda);
    for (const char* kind : {"selecting", "whole", "both"}) {
      Batch batch = make_batch(c.S, c.S, c.V, static_cast<uint64_t>(c.V) + 7);
      for (size_t i = 0; i < batch.rows.size(); ++i) {
        const bool draws_whole = kind[0] == 'w' || (kind[0] == 'b' && i % 2 == 1);
        batch.rows[i].params = draws_whole ? whole[i % whole.size()] : few[i % few.size()];
      }
      op::SampleWorkspace cpu_ws, cuda_ws;
      const std::string name = std::to_string(c.S) + " rows of " + std::to_string(c.V) + ", " +
                               kind + (c.grid > 0.0f ? ", ties" : "");
      const std::vector<int32_t> cpu = sample_all(logits, batch, cpu_ws);
      EXPECT_EQ(sample_all(on_gpu, batch, cuda_ws), cpu) << name;
      EXPECT_EQ(sample_each(on_gpu, batch), cpu) << name;
    }
  }
}

}  // namespace
}  // namespace kuiper::test
