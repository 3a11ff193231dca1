// What a template can call without defining it: Jinja's filters and tests, the Python str and
// dict methods chat templates use, and the globals Hugging Face provides (namespace, range,
// dict, raise_exception, strftime_now). The names are known before rendering so the parser can
// refuse an unknown filter or test at load time, as Jinja does.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/jinja/value.h"

namespace kuiper::jinja {

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
bool has_global_function(const std::string& name);
// Whether `object.name(...)` is a str or dict method rather than a lookup of a key `name`.
bool has_method(const Value& object, const std::string& name);

Result<Value> apply_filter(const std::string& name, const Value& input, const Arguments& args);
Result<bool> apply_test(const std::string& name, const Value& input, const Arguments& args);
Result<Value> call_method(const Value& object, const std::string& name, const Arguments& args);
// raise_exception(message) gives an error Status carrying the template's message.
Result<Value> call_global_function(const std::string& name, const Arguments& args);

}  // namespace kuiper::jinja
