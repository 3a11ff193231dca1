#include "kuiper/tokenizer/byte_level.h"

#include <array>

#include "kuiper/tokenizer/utf8.h"

namespace kuiper::byte_level {
namespace {

constexpr uint32_t kNoByte = 0xFFFFFFFF;

struct Alphabet {
  std::array<char32_t, 256> code_point{};
  std::array<uint32_t, 324> byte_of{};  // every code point of the alphabet is below U+0144

  Alphabet() {
    byte_of.fill(kNoByte);
    char32_t next_shifted = 256;
    for (int b = 0; b < 256; ++b) {
      const bool visible = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code_point[b] = visible ? static_cast<char32_t>(b) : next_shifted++;
      byte_of[code_point[b]] = static_cast<uint32_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

char32_t code_point_of(uint8_t byte) { return alphabet().code_point[byte]; }

std::string encode(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append_code_point(code_point_of(static_cast<uint8_t>(c)), &text);
  return text;
}

std::string decode(std::string_view text) {
  const Alphabet& a = alphabet();
  std::string bytes;
  bytes.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const char32_t cp = utf8::decode_at(text, pos, &length);
    if (cp >= a.byte_of.size() || a.byte_of[cp] == kNoByte) return std::string(text);
    bytes.push_back(static_cast<char>(a.byte_of[cp]));
    pos += length;
  }
  return bytes;
}

}  // namespace kuiper::byte_level
