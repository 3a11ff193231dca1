#include "kuiper/tokenizer/tokenizer.h"
#include "kuiper/tokenizer/utf8.h"

namespace kuiper {

std::string StreamDecoder::feed(int32_t id) {
  pending_ += tokenizer_.token_bytes(id);
  std::string text;
  pending_.erase(0, utf8::append_lossy(pending_, /*at_end=*/false, &text));
  return text;
}

std::string StreamDecoder::flush() {
  std::string text;
  utf8::append_lossy(pending_, /*at_end=*/true, &text);
  pending_.clear();
  return text;
}

}  // namespace kuiper
