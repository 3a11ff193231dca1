#include "kuiper/runtime/stats.h"

#include <cstdio>

namespace kuiper {

namespace {
double rate(int64_t count, double seconds) {
  return seconds > 0.0 ? static_cast<double>(count) / seconds : 0.0;
}
}  // namespace

double GenerationStats::prefill_tokens_per_second() const {
  return rate(prefilled_tokens, prefill_seconds);
}

double GenerationStats::decode_tokens_per_second() const {
  return rate(decode_steps, decode_seconds);
}

nlohmann::ordered_json GenerationStats::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"prefilled_tokens", prefilled_tokens},
          {"prefill_ms", prefill_seconds * 1e3},
          {"prefill_tokens_per_second", prefill_tokens_per_second()},
          {"generated_tokens", generated_tokens},
          {"decode_ms", decode_seconds * 1e3},
          {"decode_tokens_per_second", decode_tokens_per_second()},
          {"time_to_first_token_ms", first_token_seconds * 1e3}};
}

std::string GenerationStats::summary() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "prompt %lld tokens (%lld prefilled, %.1f ms, %.1f tok/s) | generated %lld tokens "
                "(%.1f tok/s) | first token %.1f ms",
                static_cast<long long>(prompt_tokens), static_cast<long long>(prefilled_tokens),
                prefill_seconds * 1e3, prefill_tokens_per_second(),
                static_cast<long long>(generated_tokens), decode_tokens_per_second(),
                first_token_seconds * 1e3);
  return line;
}

}  // namespace kuiper
