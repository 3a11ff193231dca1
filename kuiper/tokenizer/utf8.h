// UTF-8 checking and repair for the tokenizer: encode() refuses invalid input (naming where it
// is bad), while decode() and the stream decoder must always produce valid text, whatever bytes
// the model's tokens spell.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kuiper::utf8 {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Byte offset of the first sequence in `text` that is not valid UTF-8 (an overlong form, a
// surrogate, a code point above U+10FFFF, a stray continuation byte or a cut-off sequence),
// or std::string_view::npos when all of it is valid.
size_t find_invalid(std::string_view text);

// Appends `bytes` to `out` with every maximal invalid subpart replaced by one U+FFFD, the
// Unicode-recommended practice that Hugging Face's decoder (Rust's from_utf8_lossy) follows.
// Returns how many bytes were consumed: all of them when `at_end`; otherwise a trailing
// sequence that is valid so far but incomplete is left unconsumed, so a streaming caller can
// complete it with the next bytes.
size_t append_lossy(std::string_view bytes, bool at_end, std::string* out);

// The code point starting at text[pos] in valid UTF-8; *length receives its byte count.
char32_t decode_at(std::string_view text, size_t pos, size_t* length);

// Byte offset where the last code point of valid, non-empty UTF-8 `text` starts.
size_t last_start(std::string_view text);

void append_code_point(char32_t cp, std::string* out);

}  // namespace kuiper::utf8
