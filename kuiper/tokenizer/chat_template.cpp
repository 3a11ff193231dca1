#include "kuiper/tokenizer/chat_template.h"

#include <utility>

#include "kuiper/tokenizer/jinja/ast.h"
#include "kuiper/tokenizer/jinja/interpreter.h"
#include "kuiper/tokenizer/jinja/parser.h"

namespace kuiper {
namespace {

// A special token in tokenizer_config.json is a string, an AddedToken object with "content", or
// null.
std::string special_token(const nlohmann::ordered_json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const jinja::Template> tmpl, std::string bos_token, std::string eos_token)
    : template_(std::move(tmpl)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& tokenizer_config_json_text) {
  const auto config = nlohmann::ordered_json::parse(tokenizer_config_json_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return Status::Error("tokenizer_config.json is not a JSON object");
  }
  const auto field = config.find("chat_template");
  if (field == config.end() || field->is_null()) return Status::Error("tokenizer_config.json has no chat_template");
  std::string source;
  if (field->is_string()) {
    source = field->get<std::string>();
  } else if (field->is_array()) {
    // Several named templates: apply_chat_template uses "default" unless told otherwise.
    for (const auto& named : *field) {
      // Checked by type first: value("name", "") throws when "name" is not a string.
      if (named.is_object() && named.contains("name") && named["name"] == "default" &&
          named.contains("template") && named["template"].is_string()) {
        source = named["template"].get<std::string>();
      }
    }
    if (source.empty()) return Status::Error("tokenizer_config.json chat_template list has no \"default\" template");
  } else {
    return Status::Error("tokenizer_config.json chat_template is neither a string nor a list of named templates");
  }
  return parse(source, special_token(config, "bos_token"), special_token(config, "eos_token"));
}

Result<ChatTemplate> ChatTemplate::parse(const std::string& template_source, std::string bos_token, std::string eos_token) {
  auto parsed = jinja::parse(template_source);
  if (!parsed.ok()) return parsed.status().With("chat template");
  return ChatTemplate(std::make_shared<const jinja::Template>(std::move(parsed).value()), std::move(bos_token),
                      std::move(eos_token));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatOptions& options) const {
  if (!messages.is_array()) return Status::Error("chat messages must be a JSON list");
  if (!options.extra.is_object()) return Status::Error("chat template options must be a JSON object");
  // The variables apply_chat_template passes: tools and documents are None unless given, the
  // special tokens come before the caller's keyword arguments, which may override them.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  variables["messages"] = messages;
  variables["tools"] = nullptr;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  if (!bos_token_.empty()) variables["bos_token"] = bos_token_;
  if (!eos_token_.empty()) variables["eos_token"] = eos_token_;
  for (const auto& [key, value] : options.extra.items()) variables[key] = value;
  auto rendered = jinja::render(*template_, std::move(variables));
  if (!rendered.ok()) return rendered.status().With("chat template");
  return rendered;
}

}  // namespace kuiper
