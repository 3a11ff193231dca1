// A model's chat template, rendered exactly as Hugging Face's apply_chat_template renders it:
// the Jinja source from tokenizer_config.json runs in Kuiper's own Jinja interpreter with the
// same environment (trim_blocks, lstrip_blocks, loop controls, tojson without HTML escaping,
// raise_exception, strftime_now) and the same variables (messages, tools, documents,
// add_generation_prompt, bos_token, eos_token, plus caller keyword arguments).
//
// JSON is taken as nlohmann::ordered_json because Python dicts keep insertion order and tojson
// prints keys in that order; a plain nlohmann::json converts implicitly (its keys arrive sorted).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"

namespace kuiper {

namespace jinja {
struct Template;
}

struct ChatOptions {
  bool add_generation_prompt = true;
  // Further template variables, like apply_chat_template's keyword arguments:
  // {"enable_thinking": false}, {"tools": [<JSON schema>, ...]}, {"add_vision_id": true}, ...
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Reads "chat_template" (a string, or a list of {name, template} from which "default" is
  // taken) and the bos/eos tokens from the text of a tokenizer_config.json.
  static Result<ChatTemplate> from_tokenizer_config(const std::string& tokenizer_config_json_text);

  // Fails, naming line and column, when the template uses Jinja this interpreter does not
  // support, so a program can refuse the model at start-up rather than mid-conversation. An
  // empty token is left undefined in the template, as Hugging Face does for a null one.
  static Result<ChatTemplate> parse(const std::string& template_source, std::string bos_token = "",
                                    std::string eos_token = "");

  // `messages` is a list of {"role", "content", ...} objects. Errors: raise_exception() in the
  // template (its message), or data the template cannot use (a missing field it needs, a type
  // error), with the template line.
  Result<std::string> render(const nlohmann::ordered_json& messages, const ChatOptions& options) const;

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> tmpl, std::string bos_token, std::string eos_token);

  std::shared_ptr<const jinja::Template> template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace kuiper
