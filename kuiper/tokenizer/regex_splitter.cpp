#include "kuiper/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kuiper {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

const pcre2_code* as_code(const std::shared_ptr<const void>& code) {
  return static_cast<const pcre2_code*>(code.get());
}

}  // namespace

Result<RegexSplitter> RegexSplitter::compile(const std::string& pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    return Status::Error("cannot compile the pre-tokenizer regex at offset " +
                         std::to_string(error_offset) + ": " + pcre2_message(error));
  }
  // Without JIT (a PCRE2 built without it) the interpreter gives the same matches, only slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return RegexSplitter(std::shared_ptr<const void>(code, [](const void* c) {
    pcre2_code_free(static_cast<pcre2_code*>(const_cast<void*>(c)));
  }));
}

Status RegexSplitter::split(std::string_view text,
                            const std::function<void(std::string_view)>& on_word) const {
  const pcre2_code* code = as_code(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  if (match == nullptr) return Status::Error("out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t word_start = 0;  // where the text not yet handed out begins
  while (pos < text.size()) {
    // The text was validated once; checking it again at every match would cost O(n^2).
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match.get(),
                               nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return Status::Error("pre-tokenizer regex failed at byte " + std::to_string(pos) + ": " +
                           pcre2_message(rc));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    const size_t begin = span[0], end = span[1];
    if (begin == end) {
      // An empty match splits nothing; step over one whole character to find the next one.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (word_start < begin) on_word(text.substr(word_start, begin - word_start));
    on_word(text.substr(begin, end - begin));
    word_start = pos = end;
  }
  if (word_start < text.size()) on_word(text.substr(word_start));
  return Status::Ok();
}

}  // namespace kuiper
