#include "kuiper/runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "kuiper/runtime/stop_strings.h"

namespace kuiper {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// FNV-1a 64 of an image's grid and pixel values: tells the image a run of cached pads holds.
uint64_t fingerprint(const ProcessedImage& image) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  mix(image.grid.data(), sizeof(image.grid));
  mix(image.pixel_values.data(), image.pixel_values.size() * sizeof(float));
  return h;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndToken: return "eos";
    case FinishReason::kStopString: return "stop";
    case FinishReason::kMaxTokens: return "length";
    case FinishReason::kContextFull: return "context";
    case FinishReason::kInterrupted: return "interrupted";
  }
  return "unknown";
}

Generator::Generator(Model& model, Tokenizer tokenizer)
    : model_(model), tokenizer_(std::move(tokenizer)) {
  for (int64_t id : model_.config().eos_token_ids) end_tokens_.insert(static_cast<int32_t>(id));
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (std::optional<int32_t> id = tokenizer_.token_id(name)) end_tokens_.insert(*id);
  }
}

Result<Tensor> Generator::forward(const std::vector<int32_t>& ids,
                                  const std::vector<ProcessedImage>& images) {
  static const int32_t kBlock = 0;
  const int64_t start = static_cast<int64_t>(cached_.size());
  SequenceInput sequence;
  sequence.tokens = ids;
  sequence.start = start;
  sequence.blocks = Span<const int32_t>(&kBlock, 1);
  sequence.rope_offset = rope_deltas_.at(start);
  Result<ImageSpan> span = Status::Error("no images");
  if (!images.empty()) {
    span = encode_image_span(model_, ids, start + sequence.rope_offset, images);
    if (!span.ok()) return span.status();
    sequence.rope_offset = 0;
    sequence.rope_positions = span->index.positions;
    sequence.image = &span->features;
  }
  Result<Tensor> logits = model_.forward(Span<const SequenceInput>(&sequence, 1));
  if (!logits.ok()) {
    // The cache may hold part of this call; forgetting all of it is always safe.
    cached_.clear();
    cached_images_.clear();
    rope_deltas_.clear();
    return logits.status();
  }
  cached_.insert(cached_.end(), ids.begin(), ids.end());
  for (const ProcessedImage& image : images) cached_images_.push_back(fingerprint(image));
  if (span.ok()) rope_deltas_.add(span->index, start, static_cast<int64_t>(ids.size()));
  return logits;
}

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
  const Clock::time_point t_start = Clock::now();
  if (prompt.empty()) return Status::Error("the prompt is empty");
  const ModelConfig& config = model_.config();
  const bool vision = config.vision.has_value();
  if (!vision && !images.empty()) {
    return Status::Error(std::string("a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  const int32_t image_pad = static_cast<int32_t>(config.image_token_id);
  if (vision) {
    KUIPER_RETURN_IF_ERROR(check_image_pads(prompt, image_pad, image_tokens(config, images)));
  }
  const int64_t context = max_context();
  if (static_cast<int64_t>(prompt.size()) > context) {
    return Status::Error("the prompt is " + std::to_string(prompt.size()) +
                         " tokens, longer than the context of " + std::to_string(context) +
                         " tokens");
  }
  if (options.max_tokens == 0 || options.max_tokens < -1) {
    return Status::Error("max_tokens must be > 0 or -1 (no limit), not " +
                         std::to_string(options.max_tokens));
  }
  KUIPER_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(options.sampling));

  // Reuse the cached prefix, but always run the last prompt token: its logits are needed.
  size_t reused = std::min(common_prefix(cached_, prompt), prompt.size() - 1);
  // Equal ids do not mean equal images: a run of pads is reused only when the cache holds the
  // same image there, and never in part (an image runs whole, with its <|vision_start|>).
  size_t kept_images = 0;
  if (vision) {
    for (const auto& [first, end] : image_pad_runs(prompt, image_pad)) {
      if (end > reused || kept_images >= cached_images_.size() ||
          cached_images_[kept_images] != fingerprint(images[kept_images])) {
        reused = std::min(reused, first > 0 ? first - 1 : 0);
        break;
      }
      ++kept_images;
    }
  }
  cached_.resize(reused);
  cached_images_.resize(kept_images);
  rope_deltas_.truncate(static_cast<int64_t>(reused));
  const std::vector<int32_t> fresh(prompt.begin() + static_cast<std::ptrdiff_t>(reused),
                                   prompt.end());
  const std::vector<ProcessedImage> fresh_images(
      images.begin() + static_cast<std::ptrdiff_t>(kept_images), images.end());

  Generation out;
  GenerationStats& stats = out.stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.prefilled_tokens = static_cast<int64_t>(fresh.size());
  const Clock::time_point t_prefill = Clock::now();
  KUIPER_ASSIGN_OR_RETURN(Tensor logits, forward(fresh, fresh_images));
  stats.prefill_seconds = seconds_between(t_prefill, Clock::now());

  std::vector<int32_t> history = prompt;
  StreamDecoder decoder(tokenizer_);
  StopStrings stops(options.stop);
  auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    out.text += text;
    if (on_text) on_text(text);
  };

  Clock::time_point t_first;
  bool first = true;
  while (true) {
    if (interrupt != nullptr && interrupt->load()) {
      out.finish = FinishReason::kInterrupted;
      break;
    }
    KUIPER_ASSIGN_OR_RETURN(const int32_t id, sampler.sample(logits, history));
    if (first) {
      first = false;
      t_first = Clock::now();
      stats.first_token_seconds = seconds_between(t_start, t_first);
    }
    if (!options.ignore_eos && is_end_token(id)) {
      out.finish = FinishReason::kEndToken;
      break;
    }
    out.ids.push_back(id);
    history.push_back(id);
    const StopStrings::Step step = stops.feed(decoder.feed(id));
    emit(step.text);
    if (step.stopped) {
      out.finish = FinishReason::kStopString;
      break;
    }
    if (options.max_tokens > 0 && static_cast<int64_t>(out.ids.size()) >= options.max_tokens) {
      out.finish = FinishReason::kMaxTokens;
      break;
    }
    if (static_cast<int64_t>(cached_.size()) >= context) {
      out.finish = FinishReason::kContextFull;
      break;
    }
    KUIPER_ASSIGN_OR_RETURN(logits, forward({id}));
    ++stats.decode_steps;
  }
  if (out.finish != FinishReason::kStopString) {
    // A character cut off at the end shows as U+FFFD, which could still complete a stop string.
    const StopStrings::Step tail = stops.feed(decoder.flush());
    emit(tail.text);
    if (tail.stopped) {
      out.finish = FinishReason::kStopString;
    } else {
      emit(stops.flush());
    }
  }
  stats.generated_tokens = static_cast<int64_t>(out.ids.size());
  if (stats.decode_steps > 0) stats.decode_seconds = seconds_between(t_first, Clock::now());
  return out;
}

}  // namespace kuiper
