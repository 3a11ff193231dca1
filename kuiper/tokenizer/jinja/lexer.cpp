#include "kuiper/tokenizer/jinja/lexer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace kuiper::jinja {

std::string describe(SourcePos pos) {
  return "line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

namespace {

// Longest first, so "//" is not read as two "/".
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_code_point(char32_t cp, std::string* out) {
  utf8proc_uint8_t buffer[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buffer);
  out->append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads `digits` hex digits at text[i]; -1 when they are not all there.
int64_t read_hex(std::string_view text, size_t i, size_t digits) {
  if (i + digits > text.size()) return -1;
  int64_t value = 0;
  for (size_t k = 0; k < digits; ++k) {
    const int v = hex_value(text[i + k]);
    if (v < 0) return -1;
    value = value * 16 + v;
  }
  return value;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {
    // Jinja's default keep_trailing_newline=False drops one newline at the very end.
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag_start(pos_);
      std::string_view text = src_.substr(pos_, tag == std::string_view::npos ? std::string_view::npos : tag - pos_);
      if (tag == std::string_view::npos) {
        emit_text(text, pos_);
        break;
      }
      const char kind = src_[tag + 1];
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      const bool has_modifier = modifier == '-' || modifier == '+';
      if (modifier == '-') {
        while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      } else if (modifier != '+' && kind != '{') {
        text = lstrip_block_indent(text);
      }
      emit_text(text, pos_);
      pos_ = tag + 2 + (has_modifier ? 1 : 0);
      if (kind == '#') {
        KUIPER_RETURN_IF_ERROR(skip_comment(tag));
      } else if (kind == '%' && match_keyword_tag(pos_, "raw", nullptr, nullptr)) {
        KUIPER_RETURN_IF_ERROR(lex_raw(tag));
      } else {
        KUIPER_RETURN_IF_ERROR(lex_tag(tag, kind == '%'));
      }
    }
    tokens_.push_back({TokenKind::kEnd, "", position(src_.size())});
    return std::move(tokens_);
  }

 private:
  SourcePos position(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    SourcePos pos;
    pos.line = static_cast<int>(it - line_starts_.begin()) + 1;
    for (size_t i = *it; i < offset && i < src_.size(); ++i) {
      if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) ++pos.column;
    }
    return pos;
  }

  Status error_at(size_t offset, const std::string& what) const {
    return Status::Error(describe(position(offset)) + ": " + what);
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string_view::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string_view::npos;
  }

  // lstrip_blocks: a {% or {# tag that only indentation precedes on its line takes that
  // indentation away. "Line start" includes text right after a tag that ended in a newline.
  std::string_view lstrip_block_indent(std::string_view text) const {
    const size_t newline = text.rfind('\n');
    const size_t line_begin = newline == std::string_view::npos ? 0 : newline + 1;
    if (newline == std::string_view::npos && !line_starting_) return text;
    for (size_t i = line_begin; i < text.size(); ++i) {
      if (!is_space(text[i])) return text;
    }
    return text.substr(0, line_begin);
  }

  void emit_text(std::string_view text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::string(text), position(offset)});
  }

  // After a closing delimiter: "-" eats all following whitespace, trim_blocks eats one newline
  // after %} and #} (not after }}), "+" keeps everything.
  void finish_tag(char modifier, bool trims_newline) {
    if (modifier == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (modifier != '+' && trims_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  Status skip_comment(size_t tag) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) return error_at(tag, "comment '{#' is never closed with '#}'");
    const char modifier = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    pos_ = end + 2;
    finish_tag(modifier, true);
    return Status::Ok();
  }

  // Whether src_[from..] is "<ws>keyword<ws>%}" (with an optional - or + before %}); sets the
  // offset just past "%}" and the modifier.
  bool match_keyword_tag(size_t from, std::string_view keyword, size_t* end, char* modifier) const {
    size_t i = from;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.substr(i, keyword.size()) != keyword) return false;
    i += keyword.size();
    if (i < src_.size() && is_name_char(src_[i])) return false;
    while (i < src_.size() && is_space(src_[i])) ++i;
    char m = '\0';
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) m = src_[i++];
    if (src_.substr(i, 2) != "%}") return false;
    if (end != nullptr) *end = i + 2;
    if (modifier != nullptr) *modifier = m;
    return true;
  }

  // {% raw %}...{% endraw %}: the text between is printed as written. As in Jinja, the raw tag
  // does not take the newline after it, while endraw gets lstrip_blocks and trim_blocks.
  Status lex_raw(size_t tag) {
    size_t content_begin = 0;
    char open_modifier = '\0';
    match_keyword_tag(pos_, "raw", &content_begin, &open_modifier);
    if (open_modifier == '-') {
      while (content_begin < src_.size() && is_space(src_[content_begin])) ++content_begin;
    }
    line_starting_ = content_begin > 0 && src_[content_begin - 1] == '\n';
    for (size_t end_tag = src_.find("{%", content_begin); end_tag != std::string_view::npos;
         end_tag = src_.find("{%", end_tag + 2)) {
      const char end_open = end_tag + 2 < src_.size() ? src_[end_tag + 2] : '\0';
      const bool has_end_open = end_open == '-' || end_open == '+';
      size_t after = 0;
      char close_modifier = '\0';
      if (!match_keyword_tag(end_tag + 2 + (has_end_open ? 1 : 0), "endraw", &after, &close_modifier)) continue;
      std::string_view content = src_.substr(content_begin, end_tag - content_begin);
      if (end_open == '-') {
        while (!content.empty() && is_space(content.back())) content.remove_suffix(1);
      } else if (end_open != '+') {
        content = lstrip_block_indent(content);
      }
      emit_text(content, content_begin);
      pos_ = after;
      finish_tag(close_modifier, true);
      return Status::Ok();
    }
    return error_at(tag, "'{% raw %}' is never closed with '{% endraw %}'");
  }

  // The end delimiter at pos_, if any: its length and its whitespace modifier.
  bool at_tag_end(bool block, size_t* length, char* modifier) const {
    const std::string_view rest = src_.substr(pos_);
    const std::string_view close = block ? "%}" : "}}";
    for (const char m : {'-', '+'}) {
      if (rest.size() >= 3 && rest[0] == m && rest.substr(1, 2) == close && (block || m == '-')) {
        *length = 3;
        *modifier = m;
        return true;
      }
    }
    if (rest.substr(0, 2) == close) {
      *length = 2;
      *modifier = '\0';
      return true;
    }
    return false;
  }

  Status lex_tag(size_t tag, bool block) {
    tokens_.push_back({block ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", position(tag)});
    // The closing brackets still owed, innermost last. Inside brackets "}}" closes a dict
    // literal, not the tag, and a mismatched bracket is reported where it stands, as Jinja's
    // balancing stack does.
    std::string owed;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return error_at(tag, std::string("tag '") + (block ? "{%" : "{{") + "' is never closed with '" +
                                 (block ? "%}" : "}}") + "'");
      }
      size_t length = 0;
      char modifier = '\0';
      if (owed.empty() && at_tag_end(block, &length, &modifier)) {
        tokens_.push_back({block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", position(pos_)});
        pos_ += length;
        finish_tag(modifier, block);
        return Status::Ok();
      }
      const size_t start = pos_;
      const char c = src_[pos_];
      if (is_name_start(c)) {
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        tokens_.push_back({TokenKind::kName, std::string(src_.substr(start, pos_ - start)), position(start)});
      } else if (is_digit(c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        KUIPER_RETURN_IF_ERROR(lex_string());
      } else {
        std::string_view op;
        for (const std::string_view candidate : kOperators) {
          if (src_.substr(pos_, candidate.size()) == candidate) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) return error_at(pos_, std::string("unexpected character '") + c + "'");
        if (op == "(") owed += ')';
        if (op == "[") owed += ']';
        if (op == "{") owed += '}';
        if (op == ")" || op == "]" || op == "}") {
          if (owed.empty() || owed.back() != op[0]) {
            return error_at(pos_, "unexpected '" + std::string(op) + "'" +
                                      (owed.empty() ? std::string() : std::string(", expected '") + owed.back() + "'"));
          }
          owed.pop_back();
        }
        pos_ += op.size();
        tokens_.push_back({TokenKind::kOperator, std::string(op), position(start)});
      }
    }
  }

  // digits with "_" separators, an optional fraction, an optional exponent (Jinja's rules).
  void lex_number() {
    const size_t start = pos_;
    std::string spelling;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() && is_digit(src_[pos_ + 1])))) {
        if (src_[pos_] != '_') spelling += src_[pos_];
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      spelling += src_[pos_++];
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t after = pos_ + 1;
      if (after < src_.size() && (src_[after] == '+' || src_[after] == '-')) ++after;
      if (after < src_.size() && is_digit(src_[after])) {
        is_float = true;
        spelling += 'e';
        spelling += src_.substr(pos_ + 1, after - pos_ - 1);
        pos_ = after;
        digits();
      }
    }
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInteger, spelling, position(start)});
  }

  // A Python string literal: Jinja decodes it with Python's "unicode-escape" rules, under
  // which an unknown escape keeps its backslash.
  Status lex_string() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) return error_at(start, "string literal is never closed");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\' || pos_ + 1 >= src_.size()) {
        value += c;
        ++pos_;
        continue;
      }
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n': break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          int64_t cp = read_hex(src_, pos_, digits);
          if (cp < 0 || cp > 0x10FFFF) return error_at(pos_ - 2, std::string("bad \\") + e + " escape in string literal");
          pos_ += digits;
          // A UTF-16 surrogate pair spelled as two \u escapes is one character.
          if (cp >= 0xD800 && cp < 0xDC00 && src_.substr(pos_, 2) == "\\u") {
            const int64_t low = read_hex(src_, pos_ + 2, 4);
            if (low >= 0xDC00 && low < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
              pos_ += 6;
            }
          }
          append_code_point(static_cast<char32_t>(cp), &value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int cp = e - '0';
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k) {
              cp = cp * 8 + (src_[pos_++] - '0');
            }
            append_code_point(static_cast<char32_t>(cp), &value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    tokens_.push_back({TokenKind::kString, std::move(value), position(start)});
    return Status::Ok();
  }

  std::string_view src_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace kuiper::jinja
