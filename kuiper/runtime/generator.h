// The generation loop: prefill the prompt, then sample and decode one token at a time until an
// end token, a stop string, the token limit, the end of the context or an interrupt.
//
// The model's KV cache outlives a request: the generator remembers which tokens it holds, and a
// new prompt that starts with the same tokens (the next turn of a chat, a batch sharing a system
// prompt) prefills only what follows the common prefix.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kuiper/model/model.h"
#include "kuiper/runtime/sampler.h"
#include "kuiper/runtime/stats.h"
#include "kuiper/runtime/vision_input.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "kuiper/vision/preprocess.h"

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
  kInterrupted,  // the interrupt flag was raised
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

class Generator {
 public:
  // `model` must outlive the generator. End tokens: the config's eos ids, <|im_end|> and
  // <|endoftext|>.
  Generator(Model& model, Tokenizer tokenizer);

  // Generates a continuation of `prompt`. Fails, leaving the cache usable, on an empty prompt,
  // a prompt longer than the context (the message gives both lengths), invalid options or a
  // model error. `interrupt` is read before every token.
  Result<Generation> generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                              const TextCallback& on_text = nullptr,
                              const std::atomic<bool>* interrupt = nullptr);
  // The same for a vision-language model's prompt holding images: per image, in order, a run
  // of merged_tokens <|image_pad|> ids (expand_image_pads) and its pixel values in `images`.
  // A text-only model refuses images; a pad count that does not match is an error.
  Result<Generation> generate_with_images(const std::vector<int32_t>& prompt,
                                          const std::vector<ProcessedImage>& images,
                                          const GenerationOptions& options,
                                          const TextCallback& on_text = nullptr,
                                          const std::atomic<bool>* interrupt = nullptr);

  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Model& model() const { return model_; }
  int64_t max_context() const { return model_.max_context(); }
  bool is_end_token(int32_t id) const { return end_tokens_.count(id) != 0; }
  // The tokens whose keys and values are in the cache, position 0 first.
  const std::vector<int32_t>& cached_tokens() const { return cached_; }

 private:
  // Runs `ids` at the end of the cache (KV block 0) and returns the last position's logits, on
  // the model's device: the sampler runs there, so a GPU step copies back only the chosen token.
  // With images (their pads in `ids`) the vision tower runs first and the span takes 3-D
  // positions.
  Result<Tensor> forward(const std::vector<int32_t>& ids,
                         const std::vector<ProcessedImage>& images = {});

  Model& model_;
  Tokenizer tokenizer_;
  std::unordered_set<int32_t> end_tokens_;
  std::vector<int32_t> cached_;
  // Fingerprints of the images whose pad runs are in cached_, in order.
  std::vector<uint64_t> cached_images_;
  // The rotary shift the images in cached_ leave for the text after them (M-RoPE models).
  RopeDeltas rope_deltas_;
};

}  // namespace kuiper
