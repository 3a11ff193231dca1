// The JSONL records qwen*_infer writes with --output and in batch mode: one object per prompt,
// either a result or the error that prompt met.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "kuiper/runtime/generator.h"

namespace kuiper::demo {

// {"id", "prompt" or "messages" (as given), "output", "output_ids", "finish_reason", "seed",
// "stats"}. `request` holds the "prompt" or "messages" member to echo.
nlohmann::ordered_json result_record(const nlohmann::ordered_json& id, const nlohmann::ordered_json& request,
                             const Generation& generation, uint64_t seed);
// {"id", "line", "error"}.
nlohmann::ordered_json error_record(const nlohmann::ordered_json& id, int64_t line, const std::string& message);

// One line of JSONL, newline included. Invalid UTF-8 (a prompt that was refused for it) is
// written as U+FFFD rather than failing the whole record.
std::string jsonl_line(const nlohmann::ordered_json& record);

}  // namespace kuiper::demo
