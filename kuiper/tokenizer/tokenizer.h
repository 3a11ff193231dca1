// Qwen's byte-level BPE tokenizer, read from a Hugging Face tokenizer.json and producing the
// same ids as Hugging Face's tokenizers for the same text.
//
// encode: added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first; the rest
// is NFC-normalized, split into words by the pre-tokenizer regex, and each word's bytes are
// merged by BPE. decode: each token's bytes, joined, with invalid UTF-8 shown as U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kuiper/base/status.h"

namespace kuiper {

// Immutable after loading; copies share it, so passing one by value is cheap and a Tokenizer
// may be used from several threads at once.
class Tokenizer {
 public:
  // Errors name what in the file is missing, malformed or not supported.
  static Result<Tokenizer> from_json(const std::string& tokenizer_json_text);
  static Result<Tokenizer> from_file(const std::string& path);

  // Fails on text that is not valid UTF-8, naming the byte offset of the first bad sequence.
  Result<std::vector<int32_t>> encode(const std::string& text) const;

  // Ids outside the vocabulary contribute nothing (as in Hugging Face); callers that must
  // reject them check against vocab_size().
  std::string decode(const std::vector<int32_t>& ids) const;

  // Token text as stored in tokenizer.json: byte-level form for the vocabulary ("Ġworld" for
  // " world"), plain text for added tokens ("<|im_end|>").
  std::optional<int32_t> token_id(const std::string& token) const;
  const std::string& token_text(int32_t id) const;  // empty for an id with no token
  // The raw bytes a token decodes to (" world"); may be part of a UTF-8 character.
  const std::string& token_bytes(int32_t id) const;  // empty for an id with no token

  int64_t vocab_size() const;  // one past the largest id, added tokens included
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns generated ids into text as they arrive. A token may end inside a multi-byte character
// (an emoji is often spelled by several byte tokens); such bytes are held back until the
// character is complete, so every piece returned is valid UTF-8. Bytes that can never become
// valid UTF-8 come out as U+FFFD. Everything returned by feed() then flush() equals decode()
// of the same ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}

  // The text completed by this token; possibly empty.
  std::string feed(int32_t id);
  // The held-back bytes of an unfinished character, as U+FFFD; the decoder is then empty.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  std::string pending_;  // the start of a character still incomplete
};

}  // namespace kuiper
