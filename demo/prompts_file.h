// The --prompts-file of batch mode. A plain text file holds one prompt per line; a .jsonl file
// holds one object per line: {"prompt": "..."} (optionally "system") or {"messages": [...]},
// an optional "id", and optional sampling fields overriding the command line: temperature,
// top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed,
// max_tokens, stop (a string or a list). Blank lines are skipped. A bad line is an error of that line only.
// A line without its own "seed" samples with the command line's seed plus its line number less
// one (line 1 with the seed itself), so equal prompts on several lines draw different samples.
//
// Images (vision-language models): "images": ["a.png", ...] goes with "prompt", or with
// "messages" to their last user message; a user message in "messages" may also hold its own
// "images" list. Each message shows its images before its text. Paths are read as given
// (relative to the current directory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/runtime/generator.h"

namespace kuiper::demo {

struct BatchRequest {
  nlohmann::ordered_json id;        // the line's "id", else its line number
  nlohmann::ordered_json echo;      // {"prompt": ...} or {"messages": [...]}, for the result
  nlohmann::ordered_json messages;  // the conversation to render, image placeholders included
  std::vector<std::string> images;  // the image files, in the order of their placeholders
  GenerationOptions generation;
};

struct PromptLine {
  int64_t line = 0;  // 1-based
  Result<BatchRequest> request;
};

// Reads every line; fails only when the file cannot be read or holds no prompt at all.
// `defaults` are the command line's options, `system` its --system prompt.
Result<std::vector<PromptLine>> read_prompts_file(const std::string& path,
                                                  const GenerationOptions& defaults,
                                                  const std::string& system);

}  // namespace kuiper::demo
