// GPT-2's byte-level alphabet: each of the 256 byte values stands for one printable code point,
// so a vocabulary of text strings can spell any byte sequence. Bytes that are already visible
// (most of printable Latin-1) stand for themselves; the rest (controls, space, ...) take the
// code points from U+0100 up, in byte order ("Ġ" is the space).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kuiper::byte_level {

char32_t code_point_of(uint8_t byte);

// Byte-level text (UTF-8) for raw bytes.
std::string encode(std::string_view bytes);

// Raw bytes for byte-level text. Text holding any code point outside the alphabet comes back
// unchanged: that is how Hugging Face's ByteLevel decoder treats added tokens such as
// "<|im_end|>", which are stored as plain text rather than in the alphabet.
std::string decode(std::string_view text);

}  // namespace kuiper::byte_level
