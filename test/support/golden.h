// Hugging Face reference outputs (golden.safetensors of a fixture) and the comparisons the
// golden tests make against them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kuiper/tensor/tensor.h"

namespace kuiper::test {

struct GoldenTensor {
  std::vector<int64_t> shape;
  std::vector<float> f32;    // F32 tensors
  std::vector<int32_t> i32;  // I32 tensors
};

class Golden {
 public:
  // Loads <fixtures>/<fixture>/<file>: golden.safetensors (transformers in fp32) or
  // golden_bf16.safetensors (in bf16, the same names). The test fails if it cannot.
  static Golden load(const std::string& fixture, const std::string& file = "golden.safetensors");
  static Golden load_file(const std::string& path);
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const GoldenTensor& at(const std::string& name) const;

 private:
  std::map<std::string, GoldenTensor> tensors_;
};

// The fixtures' chat.greedy does not follow from their chat.ids (transformers itself
// continues those ids differently); the continuation it does produce, recorded in
// test/data/fixture_chat_greedy.json, stands in for it. The test fails if it is missing.
std::vector<int32_t> recorded_chat_greedy(const std::string& fixture);

// max |a - b| / max |b|: the error measure of the acceptance criteria.
double relative_max_error(const float* a, const float* b, size_t n);
// max |a - b|, or infinity when the sizes differ or an element of either is NaN (poison left).
double max_abs_error(const std::vector<float>& a, const std::vector<float>& b);
// log(sum(exp(x))) computed stably in double.
double log_sum_exp(const float* x, size_t n);
// Indices of the k largest values, largest first.
std::vector<int32_t> top_k(const float* x, size_t n, int k);

// 16-bit runs against transformers: the last position's logits within this much of the golden
// (max abs error over max |golden logit|), the acceptance figure. transformers' own bf16
// logits lie 0.4-1.3% from its fp32 ones on the fixtures.
constexpr double kHalfTolerance = 2e-2;

// Rows [T, V] of logits for every position of golden prompt p, checked against it: all finite,
// the last row within `tol` (max abs error over max |golden logit|; printed as measured), and
// the golden top token at every position whose golden top-2 margin is clear, i.e. wider than
// twice the error `tol` allows, so an error within the tolerance cannot swap the two. `what`
// names the run in messages. Returns the number of positions compared (the caller checks it is
// not zero where the prompt has clear margins).
int expect_prompt_rows_match(const std::vector<float>& rows, const Golden& golden,
                             const std::string& p, double tol, const std::string& what);
// One step of p's greedy continuation: `row` the logits that predict golden token p.greedy[step]
// (the prompt's last row for step 0, else the row after feeding p.greedy[step - 1]); finite,
// and that token on top where its margin is clear as above. Returns whether it compared.
bool expect_greedy_step(const std::vector<float>& row, const Golden& golden, const std::string& p,
                        size_t step, double tol, const std::string& what);

}  // namespace kuiper::test
