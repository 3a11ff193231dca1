#include "demo/prompts_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "kuiper/base/json_reader.h"
#include "kuiper/runtime/request_fields.h"
#include "kuiper/runtime/vision_input.h"

namespace kuiper::demo {

namespace {

using Json = nlohmann::ordered_json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

nlohmann::ordered_json user_messages(const std::string& system, const std::string& prompt) {
  Json messages = Json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  return messages;
}

Status check_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return Status::Error("\"messages\" must be a non-empty list");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        !m.contains("content") || !m["content"].is_string()) {
      return Status::Error("messages[" + std::to_string(i) +
                           "] must be an object with string \"role\" and \"content\"");
    }
    if (m.contains("images") && m["role"] != "user") {
      return Status::Error("messages[" + std::to_string(i) +
                           "]: only user messages hold \"images\"");
    }
  }
  return Status::Ok();
}

// An "images" value: a non-empty list of non-empty path strings.
Result<std::vector<std::string>> image_paths(const Json& value, const std::string& where) {
  if (!value.is_array() || value.empty()) {
    return Status::Error(where + " must be a non-empty list of image paths");
  }
  std::vector<std::string> paths;
  for (const Json& path : value) {
    if (!path.is_string() || path.get_ref<const std::string&>().empty()) {
      return Status::Error(where + " must be a non-empty list of image paths");
    }
    paths.push_back(path.get<std::string>());
  }
  return paths;
}

// Moves the images of `messages` (each user message's own "images", and `last_user_images`
// for the last user message) into the message texts as placeholders and `request->images`.
Status place_images(Json messages, const std::vector<std::string>& last_user_images,
                    BatchRequest* request) {
  size_t last_user = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] == "user") last_user = i;
  }
  if (!last_user_images.empty() && last_user == messages.size()) {
    return Status::Error("\"images\" needs a user message in \"messages\"");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    Json& m = messages[i];
    std::vector<std::string> paths;
    if (m.contains("images")) {
      KUIPER_ASSIGN_OR_RETURN(paths, image_paths(m["images"], "messages[" + std::to_string(i) +
                                                                  "].images"));
      m.erase("images");
    }
    if (i == last_user) paths.insert(paths.end(), last_user_images.begin(), last_user_images.end());
    if (paths.empty()) continue;
    m["content"] = with_image_placeholders(m["content"].get<std::string>(), paths.size());
    request->images.insert(request->images.end(), paths.begin(), paths.end());
  }
  request->messages = std::move(messages);
  return Status::Ok();
}

// The options of line `line` (1-based) that gives no "seed": the command line's, its seed
// advanced by line - 1, so that lines holding the same prompt draw different samples (as
// vLLM's requests do under one run seed), the run stays reproducible under --seed, and line 1
// samples as the one-shot program does with that seed.
GenerationOptions line_defaults(const GenerationOptions& defaults, int64_t line) {
  GenerationOptions options = defaults;
  options.sampling.seed += static_cast<uint64_t>(line - 1);
  return options;
}

Result<BatchRequest> parse_jsonl_line(const std::string& text, int64_t line,
                                      const GenerationOptions& defaults,
                                      const std::string& system) {
  // Ordered, so the echoed prompt and messages keep the line's key order.
  KUIPER_ASSIGN_OR_RETURN(const Json j, parse_json<Json>(text, "the line"));
  if (!j.is_object()) return Status::Error("expected a JSON object");
  static const char* const kFields[] = {"id", "prompt", "messages", "system", "images",
                                        "temperature", "top_k", "top_p", "min_p",
                                        "repeat_penalty", "repeat_last_n", "presence_penalty",
                                        "frequency_penalty", "seed", "max_tokens", "stop"};
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* f : kFields) known = known || key == f;
    if (!known) {
      return Status::Error("unknown field \"" + key + "\" (accepted: id, prompt, messages, system, "
                           "images, temperature, top_k, top_p, min_p, repeat_penalty, "
                           "repeat_last_n, presence_penalty, frequency_penalty, seed, "
                           "max_tokens, stop)");
    }
  }
  BatchRequest request;
  request.id = j.contains("id") ? j["id"] : Json(line);
  const bool has_prompt = j.contains("prompt");
  if (has_prompt == j.contains("messages")) {
    return Status::Error("give exactly one of \"prompt\" and \"messages\"");
  }
  std::vector<std::string> images;
  if (j.contains("images")) {
    KUIPER_ASSIGN_OR_RETURN(images, image_paths(j["images"], "\"images\""));
  }
  if (has_prompt) {
    if (!j["prompt"].is_string() || j["prompt"].get_ref<const std::string&>().empty()) {
      return Status::Error("\"prompt\" must be a non-empty string");
    }
    std::string line_system = system;
    if (j.contains("system")) {
      if (!j["system"].is_string()) return Status::Error("\"system\" must be a string");
      line_system = j["system"].get<std::string>();
    }
    request.echo = {{"prompt", j["prompt"]}};
    if (!images.empty()) request.echo["images"] = j["images"];
    KUIPER_RETURN_IF_ERROR(
        place_images(user_messages(line_system, j["prompt"].get<std::string>()), images, &request));
  } else {
    if (j.contains("system")) {
      return Status::Error("\"system\" goes with \"prompt\"; put it in \"messages\" instead");
    }
    KUIPER_RETURN_IF_ERROR(check_messages(j["messages"]));
    request.echo = {{"messages", j["messages"]}};
    if (!images.empty()) request.echo["images"] = j["images"];
    KUIPER_RETURN_IF_ERROR(place_images(j["messages"], images, &request));
  }
  request.generation = line_defaults(defaults, line);
  const nlohmann::json fields(j);
  KUIPER_RETURN_IF_ERROR(read_generation_fields(JsonReader(fields, ""), &request.generation));
  return request;
}

}  // namespace

Result<std::vector<PromptLine>> read_prompts_file(const std::string& path,
                                                  const GenerationOptions& defaults,
                                                  const std::string& system) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot open " + path + ": " + std::strerror(errno));
  const bool jsonl = ends_with(path, ".jsonl");
  std::vector<PromptLine> lines;
  std::string text;
  int64_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    // A byte order mark, as Windows editors start a UTF-8 file with, is not part of the prompt.
    if (number == 1 && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (is_blank(text)) continue;
    if (jsonl) {
      lines.push_back({number, parse_jsonl_line(text, number, defaults, system)});
    } else {
      BatchRequest request;
      request.id = number;
      request.echo = {{"prompt", text}};
      request.messages = user_messages(system, text);
      request.generation = line_defaults(defaults, number);
      lines.push_back({number, std::move(request)});
    }
  }
  if (in.bad()) return Status::Error("cannot read " + path + ": " + std::strerror(errno));
  if (lines.empty()) return Status::Error(path + " holds no prompts");
  return lines;
}

}  // namespace kuiper::demo
