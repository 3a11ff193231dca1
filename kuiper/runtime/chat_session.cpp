#include "kuiper/runtime/chat_session.h"

#include "kuiper/runtime/vision_input.h"
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
      const auto role = message.find("role");  // value() would throw on a role not a string
      const bool named = role != message.end() && role->is_string();
      return Status::Error((named ? "the " + role->get<std::string>() + " message" : std::string("a message")) +
                           " is not valid UTF-8 (byte " + std::to_string(bad) + ")");
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
  return send(user_text, {}, options, on_text, interrupt);
}

Result<Generation> ChatSession::send(const std::string& user_text,
                                     const std::vector<ProcessedImage>& images,
                                     const GenerationOptions& options,
                                     const TextCallback& on_text,
                                     const std::atomic<bool>* interrupt) {
  const ModelConfig& config = generator_.model().config();
  if (!images.empty() && !config.vision.has_value()) {
    return Status::Error(std::string("a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system_.empty()) messages.push_back({{"role", "system"}, {"content", system_}});
  for (const nlohmann::ordered_json& m : messages_) messages.push_back(m);
  messages.push_back(
      {{"role", "user"}, {"content", with_image_placeholders(user_text, images.size())}});

  KUIPER_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          encode_chat(chat_template_, generator_.tokenizer(), messages, options_));
  std::vector<ProcessedImage> all_images = images_;
  all_images.insert(all_images.end(), images.begin(), images.end());
  if (config.vision.has_value()) {
    KUIPER_ASSIGN_OR_RETURN(ids, expand_image_pads(ids, static_cast<int32_t>(config.image_token_id),
                                                   image_tokens(config, all_images)));
  }
  KUIPER_ASSIGN_OR_RETURN(Generation reply, generator_.generate_with_images(
                                                ids, all_images, options, on_text, interrupt));
  images_ = std::move(all_images);
  messages_.push_back(messages.back());
  messages_.push_back({{"role", "assistant"}, {"content", reply.text}});
  return reply;
}

void ChatSession::clear() {
  messages_ = nlohmann::ordered_json::array();
  images_.clear();
}

void ChatSession::set_system(const std::string& text) {
  system_ = text;
  clear();
}

}  // namespace kuiper
