// A chat template (Jinja source) parsed and rendered over a short conversation; the same bytes
// also read as the tokenizer_config.json a model file carries (its chat_template field, a string
// or a list of named templates, and the special tokens).
#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/chat_template.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "<think>x</think>Hello"}, {"role": "user", "content": "2+2?"}])");
  const std::string text = kuiper::fuzz::as_text(data, size);
  auto tmpl = kuiper::ChatTemplate::parse(text, "<s>", "</s>");
  if (tmpl.ok()) (void)tmpl->render(messages, kuiper::ChatOptions());
  auto configured = kuiper::ChatTemplate::from_tokenizer_config(text);
  if (configured.ok()) (void)configured->render(messages, kuiper::ChatOptions());
  return 0;
}
