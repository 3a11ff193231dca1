// One generation at a time: an Engine serving a single request, for the one-shot programs and
// the REPL.
//
// The KV cache outlives a request: a new prompt that starts with the same tokens as an earlier
// request's (the next turn of a chat, a shared system prompt) runs only what follows the part
// the cache still holds.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "kuiper/model/model.h"
#include "kuiper/runtime/engine.h"
#include "kuiper/runtime/generation.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "kuiper/vision/preprocess.h"

namespace kuiper {

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

  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  const Model& model() const { return engine_->model(); }
  int64_t max_context() const { return engine_->max_context(); }
  bool is_end_token(int32_t id) const { return engine_->is_end_token(id); }
  // The tokens of the last request (prompt, then generated) whose keys and values the cache
  // kept, position 0 first.
  const std::vector<int32_t>& cached_tokens() const { return cached_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> cached_;
};

}  // namespace kuiper
