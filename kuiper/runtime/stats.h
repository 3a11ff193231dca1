// What one generation request cost: how much of the prompt had to be run (the rest came from
// the KV cache), and how fast prefill and decode went.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kuiper {

struct GenerationStats {
  int64_t prompt_tokens = 0;     // tokens in the request's prompt
  int64_t prefilled_tokens = 0;  // of those, run through the model; the others were cached
  int64_t generated_tokens = 0;  // tokens returned (an end token is not counted)
  int64_t decode_steps = 0;      // forward passes after the prefill, one token each
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;       // from the first sampled token to the last
  double first_token_seconds = 0.0;  // from the request to the first sampled token

  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;

  nlohmann::ordered_json to_json() const;
  // One line for people: "prompt 14 tokens (14 prefilled, 1.2 ms, 11666.7 tok/s) | ...".
  std::string summary() const;
};

}  // namespace kuiper
