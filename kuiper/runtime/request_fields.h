// The sampling fields of a request written as JSON, read over defaults with one spelling and one
// set of checks: the JSONL lines of batch mode and the server's OpenAI requests both use it.
#pragma once

#include "kuiper/base/json_reader.h"
#include "kuiper/runtime/generation.h"

namespace kuiper {

// Reads the optional fields temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
// presence_penalty, frequency_penalty, seed, max_tokens and stop (a string or a list of them)
// of the object `j` over `g`, then checks the whole (validate_sampling; max_tokens > 0 or -1).
// An absent or null field keeps its value in `g`. Errors name the field.
Status read_generation_fields(const JsonReader& j, GenerationOptions* g);

}  // namespace kuiper
