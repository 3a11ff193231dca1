#include "kuiper/runtime/chat_session.h"

#include "kuiper/tokenizer/utf8.h"

namespace kuiper {

Result<std::vector<int32_t>> encode_chat(const ChatTemplate& chat_template,
                                         const Tokenizer& tokenizer,
                                         const nlohmann::ordered_json& messages,
                                         const ChatOptions& options) {
  // Checked here so the error points into the message, not into the rendered conversation.
  for (const nlohmann::ordered_json& message : messages) {
    const auto content = message.find("content");
    if (content == message.end() || !content->is_string()) continue;
    const std::string& text = content->get_ref<const std::string&>();
    const size_t bad = utf8::find_invalid(text);
    if (bad != std::string_view::npos) {
      return Status::Error("the " + message.value("role", std::string("message")) +
                           " message is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    }
  }
  KUIPER_ASSIGN_OR_RETURN(std::string text, chat_template.render(messages, options));
  return tokenizer.encode(text);
}

ChatSession::ChatSession(Generator& generator, ChatTemplate chat_template, ChatOptions options)
    : generator_(generator),
      chat_template_(std::move(chat_template)),
      options_(std::move(options)) {}

Result<Generation> ChatSession::send(const std::string& user_text,
                                     const GenerationOptions& options,
                                     const TextCallback& on_text,
                                     const std::atomic<bool>* interrupt) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system_.empty()) messages.push_back({{"role", "system"}, {"content", system_}});
  for (const nlohmann::ordered_json& m : messages_) messages.push_back(m);
  messages.push_back({{"role", "user"}, {"content", user_text}});

  KUIPER_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          encode_chat(chat_template_, generator_.tokenizer(), messages, options_));
  KUIPER_ASSIGN_OR_RETURN(Generation reply, generator_.generate(ids, options, on_text, interrupt));
  messages_.push_back(messages.back());
  messages_.push_back({{"role", "assistant"}, {"content", reply.text}});
  return reply;
}

void ChatSession::clear() { messages_ = nlohmann::ordered_json::array(); }

void ChatSession::set_system(const std::string& text) {
  system_ = text;
  clear();
}

}  // namespace kuiper
