// Runs a parsed template: Jinja's scoping (a for loop's body gets a fresh scope each iteration,
// if does not open one, macros see the scope they were defined in), control flow, and the
// evaluation of expressions over jinja::Value.
#pragma once

#include <string>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/jinja/ast.h"

namespace kuiper::jinja {

// `variables` is a JSON object; each member becomes a top-level template variable. Errors
// (raise_exception, misuse of an undefined value, a type error) name the template line.
Result<std::string> render(const Template& tmpl, Json variables);

}  // namespace kuiper::jinja
