// A chat template (Jinja source) parsed and rendered over a short conversation.
#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/chat_template.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tmpl = kuiper::ChatTemplate::parse(kuiper::fuzz::as_text(data, size), "<s>", "</s>");
  if (!tmpl.ok()) return 0;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "<think>x</think>Hello"}, {"role": "user", "content": "2+2?"}])");
  (void)tmpl->render(messages, kuiper::ChatOptions());
  return 0;
}
