// What a generation request asks for and what it gives back, shared by the Engine (many
// requests at once) and the Generator (one at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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
  std::string text;          // their text, cut before a stop string
  FinishReason finish = FinishReason::kEndToken;
  GenerationStats stats;
};

// Receives the text of the generation as it becomes final (valid UTF-8, stop strings held
// back until they are ruled out).
using TextCallback = std::function<void(const std::string& text)>;

}  // namespace kuiper
