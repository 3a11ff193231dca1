#include "kuiper/runtime/generator.h"

#include <algorithm>

namespace kuiper {

namespace {

// One request at a time, its whole prompt in one forward (the model chunks long ones itself).
EngineOptions one_request(const Model& model) {
  EngineOptions options;
  options.max_batch = 1;
  options.max_batch_tokens = std::max<int64_t>(1, model.max_context());
  return options;
}

}  // namespace

Generator::Generator(Model& model, Tokenizer tokenizer)
    : engine_(Engine::create(model, std::move(tokenizer), one_request(model)).value()) {}

Result<Generation> Generator::generate(const std::vector<int32_t>& prompt,
                                       const GenerationOptions& options,
                                       const TextCallback& on_text,
                                       const std::atomic<bool>* interrupt) {
  return generate_with_images(prompt, {}, options, on_text, interrupt);
}

Result<Generation> Generator::generate_with_images(const std::vector<int32_t>& prompt,
                                                   const std::vector<ProcessedImage>& images,
                                                   const GenerationOptions& options,
                                                   const TextCallback& on_text,
                                                   const std::atomic<bool>* interrupt) {
  KUIPER_ASSIGN_OR_RETURN(const int64_t id, engine_->add_request(prompt, images, options, on_text));
  while (true) {
    if (interrupt != nullptr && interrupt->load()) engine_->cancel(id);
    KUIPER_ASSIGN_OR_RETURN(std::vector<FinishedRequest> finished, engine_->step());
    for (FinishedRequest& f : finished) {
      if (f.id != id) continue;
      std::vector<int32_t> tokens = prompt;
      if (f.generation.ok()) {
        tokens.insert(tokens.end(), f.generation->ids.begin(), f.generation->ids.end());
      }
      tokens.resize(std::min(tokens.size(), static_cast<size_t>(f.cached_tokens)));
      cached_ = std::move(tokens);
      return std::move(f.generation);
    }
  }
}

}  // namespace kuiper
