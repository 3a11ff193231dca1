// The text of one generation as its tokens arrive: decoded to whole UTF-8 characters, with text
// that could begin a stop string held back until it is ruled out, a completed stop string cut
// off, and every final piece passed to the caller's callback as it appears.
#pragma once

#include <string>
#include <vector>

#include "kuiper/runtime/generation.h"
#include "kuiper/runtime/stop_strings.h"
#include "kuiper/tokenizer/tokenizer.h"

namespace kuiper {

class TextStream {
 public:
  TextStream(Tokenizer tokenizer, std::vector<std::string> stops, TextCallback on_text);

  // Adds the next generated token. True when it completed a stop string: the text ends before
  // it and nothing more may be fed.
  bool feed(int32_t id);
  // Generation ended without a stop string: emits what was held back. True when that
  // completes a stop string after all (a character cut off at the end shows as U+FFFD).
  bool finish();

  const std::string& text() const { return text_; }

 private:
  void emit(const std::string& piece);

  StreamDecoder decoder_;
  StopStrings stops_;
  TextCallback on_text_;
  std::string text_;
};

}  // namespace kuiper
