// Splits a Jinja template into tokens the way Jinja2's lexer does under the environment Hugging
// Face renders chat templates with (trim_blocks, lstrip_blocks, trailing newline dropped), so the
// whitespace of a rendered prompt matches transformers byte for byte: whitespace control is
// settled here and the parser only ever sees the text that will be printed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kuiper/base/status.h"

namespace kuiper::jinja {

// 1-based; the column counts code points, as an editor shows it.
struct SourcePos {
  int line = 1;
  int column = 1;
};

// "line 3, column 14", the prefix of every template error.
std::string describe(SourcePos pos);

enum class TokenKind {
  kText,           // literal template text, already whitespace-controlled
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifiers and keywords (if, in, not, true, ...)
  kString,         // text holds the decoded value
  kInteger,        // text holds the digits, underscores removed
  kFloat,          // text holds a spelling strtod accepts
  kOperator,       // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEnd,            // end of the template
};

struct Token {
  TokenKind kind;
  std::string text;
  SourcePos pos;
};

// Comments are dropped here. A malformed template (an unclosed tag or string, a character no
// token starts with) gives an error naming where it is.
Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace kuiper::jinja
