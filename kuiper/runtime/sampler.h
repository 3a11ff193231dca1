// Next-token sampling from a row of logits: repetition penalty (and OpenAI's presence and
// frequency penalties), then greedy arg-max or, with a
// temperature, the Hugging Face warper chain (temperature -> top-k -> top-p -> min-p) and a
// draw from a seeded generator, so the same seed gives the same tokens. The warpers run where the
// logits are (op::sample); the draw's uniform number always comes from the host generator, so a
// model on the GPU samples the same tokens as on the CPU.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "kuiper/base/status.h"
#include "kuiper/op/ops.h"

namespace kuiper {

struct SamplingParams {
  // 0 means greedy (arg-max); defaults follow llama.cpp.
  float temperature = 0.8f;
  int32_t top_k = 40;           // keep the k most likely tokens; 0 keeps all
  float top_p = 0.95f;          // keep the smallest set whose probability reaches p; 1 keeps all
  float min_p = 0.05f;          // drop tokens less likely than min_p * the most likely; 0 keeps all
  float repeat_penalty = 1.0f;  // 1 is off
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at; -1: all of them
  // OpenAI's penalties over the tokens this sampler drew (the prompt is not counted, as in
  // vLLM): a token drawn c times has its logit lowered by c * frequency_penalty +
  // presence_penalty (c > 0). Each in [-2, 2]; 0 is off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
};

// Checks every field is in its range; the message names the field and the range.
Status validate_sampling(const SamplingParams& params);

// Hugging Face's RepetitionPenaltyLogitsProcessor (and llama.cpp's): every distinct token of
// `recent` has its logit divided by `penalty` when positive and multiplied when negative, so
// the penalty always makes a repeat less likely.
void apply_repetition_penalty(float penalty, const std::vector<int32_t>& recent,
                              std::vector<float>* logits);

// logits[t] -= count[t] * frequency + (count[t] > 0 ? presence : 0) for every counted token.
void apply_occurrence_penalties(float presence, float frequency,
                                const std::unordered_map<int32_t, int32_t>& counts,
                                std::vector<float>* logits);

using TokenProbability = op::TokenProbability;

class Sampler {
 public:
  static Result<Sampler> create(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  bool greedy() const { return params_.temperature == 0.0f; }

  // The next token given the logits of the last position and the tokens so far (prompt and
  // generated, oldest first; the repetition penalty reads its tail). The token counts for the
  // presence and frequency penalties of the next draws.
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history);
  // The same for an fp32 [V] row on any device: on the GPU only the recent ids go up and the
  // 4-byte token comes back.
  Result<int32_t> sample(const Tensor& logits, const std::vector<int32_t>& history);

  // Whether op::sample_rows can draw this sampler's tokens: it knows every penalty but OpenAI's,
  // whose counts live here.
  bool samples_on_device() const { return !occurrence_penalties(); }
  // This step's row of op::sample_rows for logits row `row`, which then gives the token
  // sample() would: appends the repetition penalty's window of `history` to `recent` and draws
  // the uniform (when not greedy) from this sampler's generator. Only when samples_on_device().
  op::SampleRow sample_row(int64_t row, const std::vector<int32_t>& history,
                           std::vector<int32_t>* recent);

  // The tokens a non-greedy draw chooses among after the penalty and the warpers, most likely
  // first, with their renormalised probabilities.
  std::vector<TokenProbability> candidates(const float* logits, int64_t vocab,
                                           const std::vector<int32_t>& history);

 private:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // The tail of `history` the repetition penalty reads; empty when the penalty is off.
  std::vector<int32_t> recent(const std::vector<int32_t>& history) const;
  bool occurrence_penalties() const {
    return params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  }
  // The logits after the penalties; points into `logits` when there is none.
  const float* penalised(const float* logits, int64_t vocab, const std::vector<int32_t>& history);
  double uniform();  // [0, 1), the same sequence on every platform for one seed
  op::SampleParams op_params() const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
  std::unordered_map<int32_t, int32_t> drawn_;  // token -> times drawn
  std::vector<float> host_row_;  // the tensor path's row, copied when penalties need the host
  // Device-side state of the tensor path, allocated on the first GPU step and reused after.
  op::SampleWorkspace workspace_;
  Tensor recent_;  // int32, capacity for the window; its first n rows are this step's ids
  Tensor token_;   // int32 [1] on the logits' device
};

}  // namespace kuiper
