// What a generation request asks for and what it gives back, shared by the Engine (many
// requests at once) and the Generator (one at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kuiper/runtime/sampler.h"
#include "kuiper/runtime/stats.h"

namespace kuiper {

struct GenerationOptions {
  SamplingParams sampling;
  int64_t max_tokens = -1;  // -1: until an end token or the end of the context
  std::vector<std::string> stop;
  // Keep going past the model's end tokens (benchmarks, comparisons with fixed-length goldens).
  bool ignore_eos = false;
  // -1: no log-probabilities; k >= 0: each generated token's log-probability under the model
  // (the log-softmax of its raw logits, before penalties and warpers) and the k most likely.
  int32_t logprobs = -1;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, most likely first
};

enum class FinishReason {
  kEndToken,     // the model produced one of its end tokens
  kStopString,   // a user stop string appeared in the text
  kMaxTokens,    // max_tokens were generated
  kContextFull,  // the KV cache has no room for another token
  kInterrupted,  // the interrupt flag was raised (the request was cancelled)
};
// "eos", "stop", "length", "context", "interrupted".
const char* finish_reason_name(FinishReason reason);

struct Generation {
  std::vector<int32_t> ids;  // generated tokens, an end token excluded
  std::vector<TokenLogprob> logprobs;  // one per id when the options asked for them
  std::string text;          // their text, cut before a stop string
  FinishReason finish = FinishReason::kEndToken;
  GenerationStats stats;
};

// Receives the text of the generation as it becomes final (valid UTF-8, stop strings held
// back until they are ruled out).
using TextCallback = std::function<void(const std::string& text)>;

}  // namespace kuiper
