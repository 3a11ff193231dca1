#include "kuiper/tokenizer/added_tokens.h"

#include <algorithm>

#include <utf8proc.h>

#include "kuiper/tokenizer/utf8.h"

namespace kuiper {
namespace {

// Rust's char::is_whitespace (the Unicode White_Space property), which Hugging Face uses for
// lstrip and rstrip.
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Rust's char::is_alphanumeric, which Hugging Face uses for single_word, by general category.
bool is_alphanumeric(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

char32_t first_char(std::string_view text) {
  size_t length = 0;
  return utf8::decode_at(text, 0, &length);
}

char32_t last_char(std::string_view text) {
  size_t length = 0;
  return utf8::decode_at(text, utf8::last_start(text), &length);
}

// Where the run of whitespace that ends `text` begins.
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    const size_t start = utf8::last_start(text.substr(0, end));
    if (!is_whitespace(last_char(text.substr(start, end - start)))) break;
    end = start;
  }
  return end;
}

// How many bytes of whitespace `text` starts with.
size_t leading_space_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    if (!is_whitespace(utf8::decode_at(text, pos, &length))) break;
    pos += length;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [this](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  for (size_t index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    const std::string& content = tokens_[index].content;
    if (text.compare(pos, content.size(), content) == 0) return &tokens_[index];
  }
  return nullptr;
}

std::vector<TextSpan> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextSpan> spans;
  size_t plain_start = 0;  // start of the text not yet assigned to a span
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* token = longest_at(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + token->content.size();
    pos = end;
    if (token->single_word) {
      const bool word_before = begin > 0 && is_alphanumeric(last_char(text.substr(0, begin)));
      const bool word_after = end < text.size() && is_alphanumeric(first_char(text.substr(end)));
      if (word_before || word_after) continue;
    }
    // Whitespace an earlier token already swallowed is not taken twice.
    if (token->lstrip) begin = std::max(trailing_space_start(text.substr(0, begin)), plain_start);
    if (token->rstrip) end += leading_space_length(text.substr(end));
    if (plain_start < begin) spans.push_back({plain_start, begin, -1});
    spans.push_back({begin, end, token->id});
    plain_start = pos = end;
  }
  if (plain_start < text.size()) spans.push_back({plain_start, text.size(), -1});
  return spans;
}

}  // namespace kuiper
