#include "kuiper/runtime/request_fields.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace kuiper {

Status read_generation_fields(const JsonReader& j, GenerationOptions* g) {
  auto number = [&](const char* key, float* out) -> Status {
    if (!j.has(key)) return Status::Ok();
    KUIPER_ASSIGN_OR_RETURN(double v, j.get_double(key));
    if (std::fabs(v) > std::numeric_limits<float>::max()) {
      return Status::Error(std::string("\"") + key + "\" is out of range");
    }
    *out = static_cast<float>(v);
    return Status::Ok();
  };
  auto integer = [&](const char* key, auto* out) -> Status {
    using T = std::remove_pointer_t<decltype(out)>;
    KUIPER_ASSIGN_OR_RETURN(*out, j.get_int_or(key, *out, std::numeric_limits<T>::min(),
                                               std::numeric_limits<T>::max()));
    return Status::Ok();
  };
  SamplingParams& s = g->sampling;
  KUIPER_RETURN_IF_ERROR(number("temperature", &s.temperature));
  KUIPER_RETURN_IF_ERROR(integer("top_k", &s.top_k));
  KUIPER_RETURN_IF_ERROR(number("top_p", &s.top_p));
  KUIPER_RETURN_IF_ERROR(number("min_p", &s.min_p));
  KUIPER_RETURN_IF_ERROR(number("repeat_penalty", &s.repeat_penalty));
  KUIPER_RETURN_IF_ERROR(integer("repeat_last_n", &s.repeat_last_n));
  KUIPER_RETURN_IF_ERROR(number("presence_penalty", &s.presence_penalty));
  KUIPER_RETURN_IF_ERROR(number("frequency_penalty", &s.frequency_penalty));
  KUIPER_RETURN_IF_ERROR(integer("max_tokens", &g->max_tokens));
  if (j.has("seed")) {
    KUIPER_ASSIGN_OR_RETURN(int64_t seed, j.get_int("seed", 0));
    s.seed = static_cast<uint64_t>(seed);
  }
  if (j.has("stop")) {
    KUIPER_ASSIGN_OR_RETURN(JsonReader stop, j.at("stop"));
    g->stop.clear();
    if (stop.is_array()) {
      KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> items, stop.elements());
      for (const JsonReader& item : items) {
        KUIPER_ASSIGN_OR_RETURN(std::string text, item.to_string());
        g->stop.push_back(std::move(text));
      }
    } else {
      KUIPER_ASSIGN_OR_RETURN(std::string text, stop.to_string());
      g->stop.push_back(std::move(text));
    }
    for (const std::string& text : g->stop) {
      if (text.empty()) return Status::Error("\"stop\" cannot hold an empty string");
    }
  }
  KUIPER_RETURN_IF_ERROR(validate_sampling(s));
  if (g->max_tokens == 0 || g->max_tokens < -1) {
    return Status::Error("\"max_tokens\" must be > 0 or -1 (no limit)");
  }
  return Status::Ok();
}

}  // namespace kuiper
