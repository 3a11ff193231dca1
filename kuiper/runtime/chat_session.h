// A multi-turn conversation over one Generator. Every turn renders the whole conversation with
// the model's chat template and hands the tokens to the generator, which prefills only what
// differs from its KV cache: in a normal exchange that is the new user message and the
// assistant header (plus any part of the last reply that re-tokenizes differently).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/runtime/generator.h"
#include "kuiper/tokenizer/chat_template.h"

namespace kuiper {

// The token ids of `messages` rendered by `chat_template` (with the generation prompt when the
// options ask for it). Fails on text that is not valid UTF-8 or a template error.
Result<std::vector<int32_t>> encode_chat(const ChatTemplate& chat_template,
                                         const Tokenizer& tokenizer,
                                         const nlohmann::ordered_json& messages,
                                         const ChatOptions& options);

class ChatSession {
 public:
  // `generator` must outlive the session.
  ChatSession(Generator& generator, ChatTemplate chat_template, ChatOptions options);

  // Sends one user message and generates the reply. On success the message and the reply (as
  // far as it got, interrupted or not) join the conversation; on failure (invalid UTF-8, a
  // conversation longer than the context, ...) the conversation is left as it was.
  Result<Generation> send(const std::string& user_text, const GenerationOptions& options,
                          const TextCallback& on_text = nullptr,
                          const std::atomic<bool>* interrupt = nullptr);
  // The same with images (vision-language models), shown before the text as Qwen3-VL's chat
  // template places them. They stay in the conversation for the later turns.
  Result<Generation> send(const std::string& user_text, const std::vector<ProcessedImage>& images,
                          const GenerationOptions& options, const TextCallback& on_text = nullptr,
                          const std::atomic<bool>* interrupt = nullptr);

  // Forgets the conversation (the system prompt stays). The KV cache is kept: it is still
  // valid for whatever prefix the next conversation shares.
  void clear();
  // Sets the system prompt (empty: none) and starts a new conversation.
  void set_system(const std::string& text);
  const std::string& system() const { return system_; }

  const nlohmann::ordered_json& messages() const { return messages_; }
  // Every image of the conversation, in the order of their placeholders.
  const std::vector<ProcessedImage>& images() const { return images_; }
  const Generator& generator() const { return generator_; }
  size_t turns() const { return messages_.size() / 2; }

 private:
  Generator& generator_;
  ChatTemplate chat_template_;
  ChatOptions options_;
  std::string system_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();  // user and assistant, alternating
  std::vector<ProcessedImage> images_;
};

}  // namespace kuiper
