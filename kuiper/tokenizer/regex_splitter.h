// The pre-tokenizer's Split step: cuts text into words at a regex, keeping both the matches and
// the text between them as words of their own (Hugging Face's "Isolated" behaviour).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kuiper/base/status.h"

namespace kuiper {

class RegexSplitter {
 public:
  // Compiles `pattern` for UTF-8 text with Unicode properties (so \p{L}, \s, case folding mean
  // what they mean to the Oniguruma engine Hugging Face uses), JIT-compiled where PCRE2 can.
  // `literal` takes the pattern as a plain string (tokenizer.json's {"String": ...} form).
  static Result<RegexSplitter> compile(const std::string& pattern, bool literal);

  // Calls on_word for each non-empty word of `text`, which must be valid UTF-8, in order.
  // Fails only if the regex engine does (e.g. it runs out of its stack).
  Status split(std::string_view text,
               const std::function<void(std::string_view word)>& on_word) const;

 private:
  explicit RegexSplitter(std::shared_ptr<const void> code) : code_(std::move(code)) {}
  std::shared_ptr<const void> code_;  // pcre2_code_8, kept opaque so callers need not see PCRE2
};

}  // namespace kuiper
