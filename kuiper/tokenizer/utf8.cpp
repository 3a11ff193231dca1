#include "kuiper/tokenizer/utf8.h"

#include <cstdint>

namespace kuiper::utf8 {
namespace {

enum class SequenceKind { kValid, kInvalid, kIncomplete };

struct Sequence {
  SequenceKind kind;
  size_t length;  // valid: the whole sequence; invalid: the maximal subpart; incomplete: bytes seen
};

// Examines the sequence starting at text[pos]. The second byte's range depends on the lead
// byte: that is how overlong forms (E0, F0), surrogates (ED) and code points above U+10FFFF
// (F4) are excluded without decoding.
Sequence examine(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) return {SequenceKind::kValid, 1};
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (lead < 0xC2) {
    return {SequenceKind::kInvalid, 1};
  } else if (lead < 0xE0) {
    length = 2;
  } else if (lead < 0xF0) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead < 0xF5) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {SequenceKind::kInvalid, 1};
  }
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size()) return {SequenceKind::kIncomplete, i};
    const auto byte = static_cast<uint8_t>(text[pos + i]);
    if (byte < low || byte > high) return {SequenceKind::kInvalid, i};
    low = 0x80;
    high = 0xBF;
  }
  return {SequenceKind::kValid, length};
}

}  // namespace

size_t find_invalid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Sequence seq = examine(text, pos);
    if (seq.kind != SequenceKind::kValid) return pos;
    pos += seq.length;
  }
  return std::string_view::npos;
}

size_t append_lossy(std::string_view bytes, bool at_end, std::string* out) {
  size_t pos = 0;
  size_t run_start = 0;  // valid bytes are copied in runs, not one sequence at a time
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Sequence seq = examine(bytes, pos);
    if (seq.kind == SequenceKind::kValid) {
      pos += seq.length;
      continue;
    }
    out->append(bytes.substr(run_start, pos - run_start));
    if (seq.kind == SequenceKind::kIncomplete && !at_end) return pos;
    out->append(kReplacement);
    pos += seq.length;
    run_start = pos;
  }
  out->append(bytes.substr(run_start, pos - run_start));
  return pos;
}

char32_t decode_at(std::string_view text, size_t pos, size_t* length) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) {
    *length = 1;
    return lead;
  }
  const size_t n = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  char32_t cp = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  *length = n;
  return cp;
}

size_t last_start(std::string_view text) {
  size_t pos = text.size() - 1;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

void append_code_point(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace kuiper::utf8
