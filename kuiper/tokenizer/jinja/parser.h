// Parses Jinja template source into a syntax tree, following Jinja2's grammar and operator
// precedence for the subset chat templates use. Anything outside that subset (an unknown tag,
// filter or test, a stray token) is refused here, at load time, with the line and column.
#pragma once

#include <string_view>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/jinja/ast.h"

namespace kuiper::jinja {

Result<Template> parse(std::string_view source);

}  // namespace kuiper::jinja
