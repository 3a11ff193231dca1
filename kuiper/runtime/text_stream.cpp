#include "kuiper/runtime/text_stream.h"

namespace kuiper {

TextStream::TextStream(Tokenizer tokenizer, std::vector<std::string> stops, TextCallback on_text)
    : decoder_(std::move(tokenizer)), stops_(std::move(stops)), on_text_(std::move(on_text)) {}

void TextStream::emit(const std::string& piece) {
  if (piece.empty()) return;
  text_ += piece;
  if (on_text_) on_text_(piece);
}

bool TextStream::feed(int32_t id) {
  const StopStrings::Step step = stops_.feed(decoder_.feed(id));
  emit(step.text);
  return step.stopped;
}

bool TextStream::finish() {
  const StopStrings::Step tail = stops_.feed(decoder_.flush());
  emit(tail.text);
  if (tail.stopped) return true;
  emit(stops_.flush());
  return false;
}

}  // namespace kuiper
