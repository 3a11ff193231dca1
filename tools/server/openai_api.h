// The OpenAI API as kuiper-server speaks it: requests of /v1/chat/completions and
// /v1/completions read into one checked ApiRequest (every refusal an ApiError, the OpenAI error
// object), and the response objects and stream chunks written back.
//
// Sampling follows the API's defaults (temperature 1, top_p 1, no top_k or min_p) with
// vLLM's extra fields (top_k, min_p, repetition_penalty, chat_template_kwargs); the fields read
// are those of read_generation_fields plus the API's own spellings (max_completion_tokens,
// repetition_penalty, top_k -1). Fields the server does not know are ignored, as the API's
// servers do; ones it knows but cannot honour (tools, logit_bias, a JSON response format,
// best_of > 1) are refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/runtime/generation.h"
#include "kuiper/tokenizer/tokenizer.h"

namespace kuiper::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  // {"error": {"message", "type", "param", "code"}}
  nlohmann::json to_json() const;
};

struct ApiRequest {
  bool chat = false;
  std::string model;
  // Chat: the conversation for the chat template, each message's images as placeholders
  // before its text (vision_input.h), and the images' file bytes in placeholder order.
  nlohmann::ordered_json messages;
  std::vector<std::string> images;
  nlohmann::json template_kwargs = nlohmann::json::object();  // chat_template_kwargs
  // Completions: the prompts (one or a list; choice p * n + c is prompt p's c-th), each as text
  // or as token ids; echo: each choice's text starts with its prompt's.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;
  bool echo = false;
  GenerationOptions generation;
  bool max_tokens_given = false;  // max_tokens (or max_completion_tokens) was in the request
  int64_t n = 1;  // choices of each prompt; choice c samples with seed + c
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
};

// Reads a request body. `model` is the served model's name (a request naming another is
// refused); `vocab` bounds token ids; `vision` says whether images are accepted.
struct ParseContext {
  std::string model;
  int64_t vocab = 0;
  bool vision = false;
};
bool parse_chat_request(const std::string& body, const ParseContext& context, ApiRequest* out,
                        ApiError* error);
bool parse_completion_request(const std::string& body, const ParseContext& context,
                              ApiRequest* out, ApiError* error);

// "stop", "length" or, for a cancelled request, "abort" (vLLM's word).
const char* api_finish_reason(FinishReason reason);

// The logprobs object of a choice: chat {"content": [{token, logprob, bytes, top_logprobs}]},
// completions {tokens, token_logprobs, top_logprobs, text_offset}.
nlohmann::json chat_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& lps);
nlohmann::json completion_logprobs(const Tokenizer& tokenizer,
                                   const std::vector<TokenLogprob>& lps);

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace kuiper::server
