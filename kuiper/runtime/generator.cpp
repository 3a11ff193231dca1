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

Result<Tensor> Generator::forward(const std::vector<int32_t>& ids) {
  const int64_t start = static_cast<int64_t>(cached_.size());
  Result<Tensor> logits = model_.forward(ids, start, false);
  if (!logits.ok()) {
    // The cache may hold part of this call; forgetting all of it is always safe.
    cached_.clear();
    return logits.status();
  }
  cached_.insert(cached_.end(), ids.begin(), ids.end());
  return logits;
}

Result<Generation> Generator::generate(const std::vector<int32_t>& prompt,
                                       const GenerationOptions& options,
                                       const TextCallback& on_text,
                                       const std::atomic<bool>* interrupt) {
  const Clock::time_point t_start = Clock::now();
  if (prompt.empty()) return Status::Error("the prompt is empty");
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
  const size_t reused = std::min(common_prefix(cached_, prompt), prompt.size() - 1);
  cached_.resize(reused);
  const std::vector<int32_t> fresh(prompt.begin() + static_cast<std::ptrdiff_t>(reused),
                                   prompt.end());

  Generation out;
  GenerationStats& stats = out.stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.prefilled_tokens = static_cast<int64_t>(fresh.size());
  const Clock::time_point t_prefill = Clock::now();
  KUIPER_ASSIGN_OR_RETURN(Tensor logits, forward(fresh));
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
