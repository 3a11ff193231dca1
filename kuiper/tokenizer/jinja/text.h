// Python str methods on UTF-8 text, counting in code points as Python does (len, indexing,
// slicing, whitespace, case). Bytes that are not valid UTF-8 count as one character each and
// pass through unchanged, so no operation loses text.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kuiper::jinja::text {

// Byte offsets where each character starts, plus text.size() at the end.
std::vector<size_t> char_boundaries(std::string_view text);

// str.strip/lstrip/rstrip: `chars` absent strips Unicode whitespace (str.isspace).
std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right);

// str.split: no separator splits on whitespace runs and drops empty parts; max_split < 0 means
// no limit. An empty separator is the caller's error to report.
std::vector<std::string> split(std::string_view text, const std::optional<std::string>& separator, int64_t max_split);

// str.replace; count < 0 replaces all.
std::string replace(std::string_view text, std::string_view old_part, std::string_view new_part, int64_t count);

std::string upper(std::string_view text);
std::string lower(std::string_view text);
std::string capitalize(std::string_view text);  // first character upper, the rest lower

// str.isupper/islower: at least one cased character and all cased ones in that case.
bool is_upper(std::string_view text);
bool is_lower(std::string_view text);

}  // namespace kuiper::jinja::text
