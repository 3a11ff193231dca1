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
  // Loads <fixtures>/<fixture>/golden.safetensors; the test fails if it cannot.
  static Golden load(const std::string& fixture);
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

}  // namespace kuiper::test
