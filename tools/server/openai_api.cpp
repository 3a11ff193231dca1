#include "tools/server/openai_api.h"

#include <random>

#include "kuiper/base/json_reader.h"
#include "kuiper/runtime/request_fields.h"
#include "kuiper/runtime/vision_input.h"

namespace kuiper::server {

namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxChoices = 16;       // n
constexpr int64_t kMaxTopLogprobs = 20;   // the API's limit for chat; completions allow 5

bool fail(ApiError* error, const std::string& message, const std::string& param = "",
          const std::string& code = "") {
  error->status = 400;
  error->type = "invalid_request_error";
  error->message = message;
  error->param = param;
  error->code = code;
  return false;
}

// The field a read_generation_fields message is about (the first the message names).
std::string field_of(const std::string& message) {
  for (const char* key : {"max_tokens", "temperature", "top_k", "top_p", "min_p",
                          "repeat_penalty", "repeat_last_n", "presence_penalty",
                          "frequency_penalty", "seed", "stop"}) {
    if (message.find(key) != std::string::npos) {
      return std::string(key) == "repeat_penalty" ? "repetition_penalty" : key;
    }
  }
  return "";
}

bool is_empty_value(const Json& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}

// The fields both endpoints share: model, stream, n, seed and the sampling fields.
bool parse_common(const Json& j, const ParseContext& context, int64_t default_max_tokens,
                  ApiRequest* out, ApiError* error) {
  const JsonReader r(j, "");
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return fail(error, "\"model\" must be a string", "model");
    out->model = j["model"].get<std::string>();
    if (out->model != context.model) {
      // 404, as OpenAI's API and vLLM answer a model they do not serve.
      fail(error, "the model \"" + out->model + "\" does not exist; this server serves \"" +
                      context.model + "\"",
           "model", "model_not_found");
      error->status = 404;
      return false;
    }
  }
  Result<bool> stream = r.get_bool_or("stream", false);
  if (!stream.ok()) return fail(error, "\"stream\" must be a boolean", "stream");
  out->stream = *stream;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const Json& o = j["stream_options"];
    if (!o.is_object()) return fail(error, "\"stream_options\" must be an object", "stream_options");
    if (!out->stream) {
      return fail(error, "\"stream_options\" goes with \"stream\": true", "stream_options");
    }
    Result<bool> usage = JsonReader(o, "").get_bool_or("include_usage", false);
    if (!usage.ok()) {
      return fail(error, "\"stream_options.include_usage\" must be a boolean",
                  "stream_options.include_usage");
    }
    out->include_usage = *usage;
  }
  Result<int64_t> n = r.get_int_or("n", 1, 1, kMaxChoices);
  if (!n.ok()) {
    return fail(error, "\"n\" must be an integer in [1, " + std::to_string(kMaxChoices) + "]", "n");
  }
  out->n = *n;
  for (const char* unsupported : {"tools", "functions", "logit_bias"}) {
    if (j.contains(unsupported) && !is_empty_value(j[unsupported])) {
      return fail(error, std::string("\"") + unsupported + "\" is not supported by this server",
                  unsupported);
    }
  }
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const Json& f = j["response_format"];
    if (!f.is_object() || f.value("type", Json("text")) != "text") {
      return fail(error, "\"response_format\": only {\"type\": \"text\"} is supported",
                  "response_format");
    }
  }

  // The sampling fields, in read_generation_fields' spelling, over the API's defaults.
  GenerationOptions& g = out->generation;
  g.sampling.temperature = 1.0f;
  g.sampling.top_p = 1.0f;
  g.sampling.top_k = 0;
  g.sampling.min_p = 0.0f;
  g.sampling.repeat_penalty = 1.0f;
  g.sampling.repeat_last_n = -1;  // vLLM's repetition penalty sees the whole sequence
  g.max_tokens = default_max_tokens;
  Json fields = Json::object();
  for (const char* key : {"temperature", "top_p", "min_p", "presence_penalty",
                          "frequency_penalty", "seed", "stop", "max_tokens"}) {
    if (j.contains(key) && !j[key].is_null()) fields[key] = j[key];
  }
  if (j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()) {
    fields["max_tokens"] = j["max_completion_tokens"];
  }
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {
    fields["repeat_penalty"] = j["repetition_penalty"];
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    // vLLM's -1 (and 0) keep every token.
    fields["top_k"] = j["top_k"].is_number_integer() && j["top_k"].get<int64_t>() == -1
                          ? Json(0)
                          : j["top_k"];
  }
  const Status read = read_generation_fields(JsonReader(fields, ""), &g);
  if (!read.ok()) return fail(error, read.message(), field_of(read.message()));
  out->max_tokens_given = fields.contains("max_tokens");
  if (!fields.contains("seed")) g.sampling.seed = std::random_device{}();
  Result<bool> ignore_eos = r.get_bool_or("ignore_eos", false);
  if (!ignore_eos.ok()) return fail(error, "\"ignore_eos\" must be a boolean", "ignore_eos");
  g.ignore_eos = *ignore_eos;
  return true;
}

// Decodes standard base64 (padding optional); false on any other character.
bool decode_base64(const std::string& text, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '=') --end;
  if (text.size() - end > 2) return false;
  out->clear();
  out->reserve(end * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  for (size_t i = 0; i < end; ++i) {
    const int v = value(text[i]);
    if (v < 0) return false;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out->push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return count < 6;  // a lone 6-bit group is not a whole byte
}

// An image_url part's URL: a data: URI of a base64 PNG or JPEG, decoded into `bytes`.
bool read_image_url(const std::string& url, const std::string& param, std::string* bytes,
                    ApiError* error) {
  if (url.rfind("data:", 0) != 0) {
    return fail(error, "image URLs must be data: URIs (base64 PNG or JPEG); this server "
                       "fetches nothing",
                param, "unsupported_image_url");
  }
  const size_t comma = url.find(',');
  const std::string header = url.substr(5, comma == std::string::npos ? 0 : comma - 5);
  if (comma == std::string::npos || header.size() < 7 ||
      header.compare(header.size() - 7, 7, ";base64") != 0) {
    return fail(error, "an image data: URI must be data:image/png;base64,... or "
                       "data:image/jpeg;base64,...",
                param);
  }
  if (!decode_base64(url.substr(comma + 1), bytes) || bytes->empty()) {
    return fail(error, "the image data: URI does not hold valid base64", param);
  }
  return true;
}

bool parse_messages(const Json& messages, bool vision, ApiRequest* out, ApiError* error) {
  if (!messages.is_array() || messages.empty()) {
    return fail(error, "\"messages\" must be a non-empty list", "messages");
  }
  out->messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return fail(error, where + " must be an object with a string \"role\"", where);
    }
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      return fail(error, where + ".role \"" + role + "\": expected system, user or assistant",
                  where + ".role");
    }
    const Json content = m.contains("content") ? m["content"] : Json();
    std::string text;
    size_t images = 0;
    if (content.is_string()) {
      text = content.get<std::string>();
    } else if (content.is_null() && role == "assistant") {
    } else if (content.is_array()) {
      for (size_t k = 0; k < content.size(); ++k) {
        const std::string part_where = where + ".content[" + std::to_string(k) + "]";
        const Json& part = content[k];
        const std::string type =
            part.is_object() && part.contains("type") && part["type"].is_string()
                ? part["type"].get<std::string>()
                : "";
        if (type == "text" && part.contains("text") && part["text"].is_string()) {
          text += part["text"].get<std::string>();
        } else if (type == "image_url") {
          if (role != "user") return fail(error, "only user messages hold images", part_where);
          if (!vision) {
            return fail(error, "this model takes no images", part_where, "images_not_supported");
          }
          const Json url = part.contains("image_url") && part["image_url"].is_object()
                               ? part["image_url"].value("url", Json())
                               : part.value("image_url", Json());
          if (!url.is_string()) {
            return fail(error, part_where + ".image_url must hold a string \"url\"", part_where);
          }
          std::string bytes;
          if (!read_image_url(url.get<std::string>(), part_where + ".image_url.url", &bytes,
                              error)) {
            return false;
          }
          out->images.push_back(std::move(bytes));
          ++images;
        } else {
          return fail(error, part_where + ": expected {\"type\": \"text\", \"text\": ...} or "
                                          "{\"type\": \"image_url\", \"image_url\": {\"url\": ...}}",
                      part_where);
        }
      }
    } else {
      return fail(error, where + ".content must be a string or a list of parts",
                  where + ".content");
    }
    if (images > 0) text = with_image_placeholders(text, images);
    out->messages.push_back({{"role", role}, {"content", text}});
  }
  return true;
}

Result<Json> parse_body(const std::string& body) {
  KUIPER_ASSIGN_OR_RETURN(Json j, parse_json<Json>(body, "the request body"));
  if (!j.is_object()) return Status::Error("the request body must be a JSON object");
  return j;
}

}  // namespace

Json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? Json() : Json(param)},
            {"code", code.empty() ? Json() : Json(code)}}}};
}

bool parse_chat_request(const std::string& body, const ParseContext& context, ApiRequest* out,
                        ApiError* error) {
  Result<Json> parsed = parse_body(body);
  if (!parsed.ok()) return fail(error, parsed.status().message());
  const Json& j = *parsed;
  out->chat = true;
  if (!parse_common(j, context, -1, out, error)) return false;
  if (!j.contains("messages")) return fail(error, "\"messages\" is required", "messages");
  if (!parse_messages(j["messages"], context.vision, out, error)) return false;
  const JsonReader r(j, "");
  Result<bool> logprobs = r.get_bool_or("logprobs", false);
  if (!logprobs.ok()) return fail(error, "\"logprobs\" must be a boolean", "logprobs");
  out->logprobs = *logprobs;
  Result<int64_t> top = r.get_int_or("top_logprobs", 0, 0, kMaxTopLogprobs);
  if (!top.ok()) {
    return fail(error, "\"top_logprobs\" must be an integer in [0, 20]", "top_logprobs");
  }
  if (j.contains("top_logprobs") && !j["top_logprobs"].is_null() && !out->logprobs) {
    return fail(error, "\"top_logprobs\" needs \"logprobs\": true", "top_logprobs");
  }
  if (out->logprobs) out->generation.logprobs = static_cast<int32_t>(*top);
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    if (!j["chat_template_kwargs"].is_object()) {
      return fail(error, "\"chat_template_kwargs\" must be an object", "chat_template_kwargs");
    }
    out->template_kwargs = j["chat_template_kwargs"];
  }
  return true;
}

bool parse_completion_request(const std::string& body, const ParseContext& context,
                              ApiRequest* out, ApiError* error) {
  Result<Json> parsed = parse_body(body);
  if (!parsed.ok()) return fail(error, parsed.status().message());
  const Json& j = *parsed;
  out->chat = false;
  // The API's default for completions is 16 tokens.
  if (!parse_common(j, context, 16, out, error)) return false;
  if (!j.contains("prompt")) return fail(error, "\"prompt\" is required", "prompt");
  // One prompt (a string or a list of token ids) or several (a list of strings or of lists of
  // token ids), as the API takes them.
  const Json& prompt = j["prompt"];
  const std::string forms =
      "\"prompt\" must be a string, a list of token ids, or a list of strings or of lists of "
      "token ids, none empty";
  auto read_ids = [&](const Json& list, const std::string& where, ApiRequest::Prompt* p) {
    for (const Json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= context.vocab) {
        return fail(error, "\"" + where + "\": token ids must be integers in [0, " +
                               std::to_string(context.vocab) + ")",
                    "prompt");
      }
      p->ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    p->is_ids = true;
    return true;
  };
  if (prompt.is_string()) {
    out->prompts.push_back({prompt.get<std::string>(), {}, false});
  } else if (prompt.is_array() && !prompt.empty() && !prompt[0].is_string() &&
             !prompt[0].is_array()) {
    out->prompts.emplace_back();
    if (!read_ids(prompt, "prompt", &out->prompts.back())) return false;
  } else if (prompt.is_array() && !prompt.empty()) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      const std::string where = "prompt[" + std::to_string(i) + "]";
      out->prompts.emplace_back();
      if (prompt[i].is_string() && prompt[0].is_string()) {
        out->prompts.back().text = prompt[i].get<std::string>();
      } else if (prompt[i].is_array() && prompt[0].is_array() && !prompt[i].empty()) {
        if (!read_ids(prompt[i], where, &out->prompts.back())) return false;
      } else {
        return fail(error, forms + " (" + where + " is not like prompt[0])", "prompt");
      }
    }
  } else {
    return fail(error, forms, "prompt");
  }
  for (const ApiRequest::Prompt& p : out->prompts) {
    if (!p.is_ids && p.text.empty()) return fail(error, forms + " (a prompt is empty)", "prompt");
  }
  const JsonReader r(j, "");
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    Result<int64_t> logprobs = r.get_int("logprobs", 0, 5);
    if (!logprobs.ok()) return fail(error, "\"logprobs\" must be an integer in [0, 5]", "logprobs");
    out->logprobs = true;
    out->generation.logprobs = static_cast<int32_t>(*logprobs);
  }
  Result<bool> echo = r.get_bool_or("echo", false);
  if (!echo.ok()) return fail(error, "\"echo\" must be a boolean", "echo");
  out->echo = *echo;
  if (out->echo && out->logprobs) {
    return fail(error, "\"echo\" with \"logprobs\" is not supported: this server computes no "
                       "log-probabilities of prompt tokens",
                "echo");
  }
  Result<int64_t> best_of = r.get_int_or("best_of", 1, 1, 1);
  if (!best_of.ok()) return fail(error, "\"best_of\" other than 1 is not supported", "best_of");
  if (j.contains("suffix") && !is_empty_value(j["suffix"])) {
    return fail(error, "\"suffix\" is not supported by this server", "suffix");
  }
  return true;
}

const char* api_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndToken:
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull:
      return "length";
    case FinishReason::kInterrupted:
      return "abort";
  }
  return "stop";
}

namespace {

Json bytes_of(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// A token's text for logprobs: its bytes, valid UTF-8 or not (JSON output replaces what is not).
std::string token_string(const Tokenizer& tokenizer, int32_t id) {
  return tokenizer.decode({id});
}

}  // namespace

Json chat_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& lps) {
  Json content = Json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string token = token_string(tokenizer, lp.id);
    Json top = Json::array();
    for (const auto& [id, logprob] : lp.top) {
      const std::string t = token_string(tokenizer, id);
      top.push_back({{"token", t}, {"logprob", logprob}, {"bytes", bytes_of(t)}});
    }
    content.push_back(
        {{"token", token}, {"logprob", lp.logprob}, {"bytes", bytes_of(token)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& lps) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  size_t offset = 0;
  for (const TokenLogprob& lp : lps) {
    const std::string token = token_string(tokenizer, lp.id);
    tokens.push_back(token);
    token_logprobs.push_back(lp.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, logprob] : lp.top) alternatives[token_string(tokenizer, id)] = logprob;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace kuiper::server
