#include "kuiper/tokenizer/jinja/text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdint>

namespace kuiper::jinja::text {
namespace {

constexpr utf8proc_int32_t kInvalid = -1;

// The code point of the character text[begin, end), or kInvalid for a stray byte.
utf8proc_int32_t code_point(std::string_view text, size_t begin, size_t end) {
  utf8proc_int32_t cp = kInvalid;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + begin),
                                              static_cast<utf8proc_ssize_t>(end - begin), &cp);
  return n > 0 ? cp : kInvalid;
}

// Python's str.isspace: bidirectional class WS, B or S, or category Zs.
bool is_space(utf8proc_int32_t cp) {
  if (cp == kInvalid) return false;
  const utf8proc_property_t* p = utf8proc_get_property(cp);
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

void append_code_point(utf8proc_int32_t cp, std::string* out) {
  utf8proc_uint8_t buffer[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(cp, buffer);
  out->append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

template <typename Map>
std::string map_chars(std::string_view text, Map map) {
  const std::vector<size_t> b = char_boundaries(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i + 1 < b.size(); ++i) {
    const utf8proc_int32_t cp = code_point(text, b[i], b[i + 1]);
    if (cp == kInvalid) {
      out.append(text.substr(b[i], b[i + 1] - b[i]));
    } else {
      append_code_point(map(i, cp), &out);
    }
  }
  return out;
}

bool all_cased_in(std::string_view text, utf8proc_propval_t wanted) {
  const std::vector<size_t> b = char_boundaries(text);
  bool any = false;
  for (size_t i = 0; i + 1 < b.size(); ++i) {
    const utf8proc_int32_t cp = code_point(text, b[i], b[i + 1]);
    if (cp == kInvalid) continue;
    const utf8proc_propval_t category = utf8proc_get_property(cp)->category;
    if (category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT) {
      if (category != wanted) return false;
      any = true;
    }
  }
  return any;
}

}  // namespace

std::vector<size_t> char_boundaries(std::string_view text) {
  std::vector<size_t> boundaries;
  boundaries.reserve(text.size() + 1);
  size_t i = 0;
  while (i < text.size()) {
    boundaries.push_back(i);
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                                static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    i += n > 0 ? static_cast<size_t>(n) : 1;
  }
  boundaries.push_back(text.size());
  return boundaries;
}

std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<size_t> b = char_boundaries(text);
  std::vector<std::string_view> strippable;
  if (chars.has_value()) {
    const std::vector<size_t> cb = char_boundaries(*chars);
    for (size_t i = 0; i + 1 < cb.size(); ++i) {
      strippable.push_back(std::string_view(*chars).substr(cb[i], cb[i + 1] - cb[i]));
    }
  }
  auto removable = [&](size_t i) {
    if (!chars.has_value()) return is_space(code_point(text, b[i], b[i + 1]));
    const std::string_view c = text.substr(b[i], b[i + 1] - b[i]);
    return std::find(strippable.begin(), strippable.end(), c) != strippable.end();
  };
  size_t first = 0;
  size_t last = b.size() - 1;  // characters [first, last)
  if (left) {
    while (first < last && removable(first)) ++first;
  }
  if (right) {
    while (last > first && removable(last - 1)) --last;
  }
  return std::string(text.substr(b[first], b[last] - b[first]));
}

std::vector<std::string> split(std::string_view text, const std::optional<std::string>& separator, int64_t max_split) {
  std::vector<std::string> parts;
  if (separator.has_value()) {
    size_t start = 0;
    while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
      const size_t found = text.find(*separator, start);
      if (found == std::string_view::npos) break;
      parts.emplace_back(text.substr(start, found - start));
      start = found + separator->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  const std::vector<size_t> b = char_boundaries(text);
  const size_t count = b.size() - 1;
  size_t i = 0;
  while (true) {
    while (i < count && is_space(code_point(text, b[i], b[i + 1]))) ++i;
    if (i == count) break;
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      // The remainder after the last split keeps its inner and trailing whitespace.
      parts.emplace_back(text.substr(b[i]));
      break;
    }
    const size_t begin = i;
    while (i < count && !is_space(code_point(text, b[i], b[i + 1]))) ++i;
    parts.emplace_back(text.substr(b[begin], b[i] - b[begin]));
  }
  return parts;
}

std::string replace(std::string_view text, std::string_view old_part, std::string_view new_part, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old_part.empty()) {
    // Python inserts the replacement before every character and at the end.
    const std::vector<size_t> b = char_boundaries(text);
    for (size_t i = 0; i + 1 < b.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_part;
        ++done;
      }
      out.append(text.substr(b[i], b[i + 1] - b[i]));
    }
    if (count < 0 || done < count) out += new_part;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(old_part, start);
    if (found == std::string_view::npos) break;
    out.append(text.substr(start, found - start));
    out += new_part;
    start = found + old_part.size();
    ++done;
  }
  out.append(text.substr(start));
  return out;
}

std::string upper(std::string_view text) {
  return map_chars(text, [](size_t, utf8proc_int32_t cp) { return utf8proc_toupper(cp); });
}

std::string lower(std::string_view text) {
  return map_chars(text, [](size_t, utf8proc_int32_t cp) { return utf8proc_tolower(cp); });
}

std::string capitalize(std::string_view text) {
  return map_chars(text, [](size_t i, utf8proc_int32_t cp) { return i == 0 ? utf8proc_totitle(cp) : utf8proc_tolower(cp); });
}

bool is_upper(std::string_view text) { return all_cased_in(text, UTF8PROC_CATEGORY_LU); }
bool is_lower(std::string_view text) { return all_cased_in(text, UTF8PROC_CATEGORY_LL); }

}  // namespace kuiper::jinja::text
