#include "kuiper/tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "kuiper/tokenizer/jinja/text.h"

namespace kuiper::jinja {
namespace {

// One parameter of a builtin: a missing required one is an error, a missing optional one takes
// `fallback`.
struct Param {
  const char* name;
  bool required;
  Value fallback;
};
Param required(const char* name) { return {name, true, Value()}; }
Param optional(const char* name, Value fallback) { return {name, false, std::move(fallback)}; }
Value none() { return Value::data(nullptr); }

// Binds arguments to parameters as Python does: positional first, then by keyword.
Result<std::vector<Value>> bind(const std::string& callee, const Arguments& args, const std::vector<Param>& params) {
  if (args.positional.size() > params.size()) {
    return Status::Error(callee + "() takes at most " + std::to_string(params.size()) + " argument(s), " +
                         std::to_string(args.positional.size()) + " given");
  }
  std::vector<std::optional<Value>> bound(params.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [name, value] : args.named) {
    // A lambda may not capture a structured binding before C++20: capture a plain reference.
    const std::string& key = name;
    const auto it = std::find_if(params.begin(), params.end(), [&key](const Param& p) { return key == p.name; });
    if (it == params.end()) return Status::Error(callee + "() got an unexpected keyword argument '" + name + "'");
    const size_t index = static_cast<size_t>(it - params.begin());
    if (bound[index].has_value()) return Status::Error(callee + "() got multiple values for argument '" + name + "'");
    bound[index] = value;
  }
  std::vector<Value> values;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!bound[i].has_value() && params[i].required) {
      return Status::Error(callee + "() missing required argument '" + params[i].name + "'");
    }
    values.push_back(bound[i].has_value() ? *bound[i] : params[i].fallback);
  }
  return values;
}

Status no_arguments(const std::string& callee, const Arguments& args) {
  if (args.positional.empty() && args.named.empty()) return Status::Ok();
  return Status::Error(callee + "() takes no arguments");
}

bool is_none(const Value& v) { return v.is_undefined() || (v.is_data() && v.json().is_null()); }

Result<std::string> want_string(const std::string& callee, const Value& v) {
  if (!v.is_string()) return Status::Error(callee + "() expects a string, got " + type_name(v));
  return v.string();
}

Result<int64_t> want_int(const std::string& callee, const Value& v) {
  if (v.is_data() && (v.json().is_number_integer() || v.json().is_boolean())) {
    return v.json().is_boolean() ? int64_t{v.json().get<bool>()} : v.integer();
  }
  return Status::Error(callee + "() expects an integer, got " + type_name(v));
}

Result<std::optional<std::string>> optional_string(const std::string& callee, const Value& v) {
  if (is_none(v)) return std::optional<std::string>();
  KUIPER_ASSIGN_OR_RETURN(std::string s, want_string(callee, v));
  return std::optional<std::string>(std::move(s));
}

Result<Json> list_of(const std::vector<Value>& items) {
  Json out = Json::array();
  for (const Value& item : items) {
    KUIPER_ASSIGN_OR_RETURN(Json j, to_json(item));
    out.push_back(std::move(j));
  }
  return out;
}

// "a.b.0" as Jinja's attribute getters read it: each part an item or attribute lookup.
Result<Value> attribute_path(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    KUIPER_ASSIGN_OR_RETURN(current, numeric ? get_item(current, Value::data(std::stoll(part))) : get_attribute(current, part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// ---- filters ----

using Filter = Result<Value> (*)(const Value& input, const Arguments& args);

Result<Value> filter_length(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("length", args));
  if (input.is_undefined()) return Value::data(0);
  if (input.is_string()) return Value::data(static_cast<int64_t>(text::char_boundaries(input.string()).size() - 1));
  if (input.is_list() || input.is_mapping()) return Value::data(static_cast<int64_t>(input.json().size()));
  return Status::Error("object of type '" + type_name(input) + "' has no len()");
}

Result<Value> filter_trim(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("trim", args, {optional("chars", none())}));
  KUIPER_ASSIGN_OR_RETURN(auto chars, optional_string("trim", p[0]));
  return Value::data(text::strip(to_string(input), chars, true, true));
}

// Hugging Face replaces Jinja's tojson with json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) so that the prompt shows the JSON unescaped.
Result<Value> filter_tojson(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("tojson", args,
                                       {optional("ensure_ascii", Value::data(false)), optional("indent", none()),
                                        optional("separators", none()), optional("sort_keys", Value::data(false))}));
  JsonFormat format;
  format.ensure_ascii = truthy(p[0]);
  if (!is_none(p[1])) {
    KUIPER_ASSIGN_OR_RETURN(const int64_t indent, want_int("tojson", p[1]));
    format.indent = static_cast<int>(std::max<int64_t>(indent, 0));
    format.item_separator = ",";  // json.dumps drops the space before a newline
  }
  if (!is_none(p[2])) {
    const bool pair = p[2].is_list() && p[2].json().size() == 2 && p[2].json()[0].is_string() && p[2].json()[1].is_string();
    if (!pair) return Status::Error("tojson() separators must be a pair of strings");
    format.item_separator = p[2].json()[0].get<std::string>();
    format.key_separator = p[2].json()[1].get<std::string>();
  }
  format.sort_keys = truthy(p[3]);
  if (input.is_undefined()) return Status::Error("Object of type Undefined is not JSON serializable (" + input.text() + ")");
  KUIPER_ASSIGN_OR_RETURN(Json json, to_json(input));
  return Value::data(dump_json(json, format));
}

Result<Value> filter_string(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("string", args));
  return Value::data(to_string(input));
}

Result<Value> filter_first(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("first", args));
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> filter_last(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("last", args));
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Result<Value> filter_join(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("join", args, {optional("d", Value::data("")), optional("attribute", none())}));
  KUIPER_ASSIGN_OR_RETURN(auto attribute, optional_string("join", p[1]));
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  const std::string separator = to_string(p[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    if (attribute.has_value()) {
      KUIPER_ASSIGN_OR_RETURN(Value part, attribute_path(items[i], *attribute));
      out += to_string(part);
    } else {
      out += to_string(items[i]);
    }
  }
  return Value::data(std::move(out));
}

Result<Value> filter_default(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("default", args,
                                       {optional("default_value", Value::data("")), optional("boolean", Value::data(false))}));
  if (input.is_undefined() || (truthy(p[1]) && !truthy(input))) return p[0];
  return input;
}

Result<Value> filter_items(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("items", args));
  Json pairs = Json::array();
  if (input.is_undefined()) return Value::data(std::move(pairs));
  if (!input.is_mapping()) return Status::Error("items() expects a mapping, got " + type_name(input));
  for (const auto& [key, item] : input.json().items()) pairs.push_back(Json::array({key, item}));
  return Value::data(std::move(pairs));
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...): keep the
// items for which the test (or plain truthiness) gives `keep`.
Result<Value> select_items(const std::string& callee, const Value& input, const Arguments& args, bool by_attribute, bool keep) {
  if (!args.named.empty()) return Status::Error(callee + "() takes no keyword arguments");
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) return Status::Error(callee + "() missing required argument 'attribute'");
    KUIPER_ASSIGN_OR_RETURN(attribute, want_string(callee, args.positional[next++]));
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) {
    KUIPER_ASSIGN_OR_RETURN(test, want_string(callee, args.positional[next++]));
    if (!has_test(*test)) return Status::Error(callee + "(): no test named '" + *test + "'");
  }
  Arguments test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  std::vector<Value> kept;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      KUIPER_ASSIGN_OR_RETURN(subject, attribute_path(item, attribute));
    }
    bool passed = false;
    if (test.has_value()) {
      KUIPER_ASSIGN_OR_RETURN(passed, apply_test(*test, subject, test_args));
    } else {
      passed = truthy(subject);
    }
    if (passed == keep) kept.push_back(item);
  }
  KUIPER_ASSIGN_OR_RETURN(Json list, list_of(kept));
  return Value::data(std::move(list));
}

Result<Value> filter_select(const Value& input, const Arguments& args) { return select_items("select", input, args, false, true); }
Result<Value> filter_reject(const Value& input, const Arguments& args) { return select_items("reject", input, args, false, false); }
Result<Value> filter_selectattr(const Value& input, const Arguments& args) {
  return select_items("selectattr", input, args, true, true);
}
Result<Value> filter_rejectattr(const Value& input, const Arguments& args) {
  return select_items("rejectattr", input, args, true, false);
}

// map(attribute="x", default=...) or map("filter", args...).
Result<Value> filter_map(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  std::vector<Value> mapped;
  const auto attribute = std::find_if(args.named.begin(), args.named.end(), [](const auto& a) { return a.first == "attribute"; });
  if (attribute != args.named.end()) {
    KUIPER_ASSIGN_OR_RETURN(const std::string path, want_string("map", attribute->second));
    Value fallback;
    for (const auto& [name, value] : args.named) {
      if (name == "default") {
        fallback = value;
      } else if (name != "attribute") {
        return Status::Error("map() got an unexpected keyword argument '" + name + "'");
      }
    }
    for (const Value& item : items) {
      KUIPER_ASSIGN_OR_RETURN(Value v, attribute_path(item, path));
      mapped.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
  } else {
    if (args.positional.empty()) return Status::Error("map() needs a filter name or attribute=");
    KUIPER_ASSIGN_OR_RETURN(const std::string filter, want_string("map", args.positional[0]));
    if (!has_filter(filter)) return Status::Error("map(): no filter named '" + filter + "'");
    Arguments filter_args;
    filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
    filter_args.named = args.named;
    for (const Value& item : items) {
      KUIPER_ASSIGN_OR_RETURN(Value v, apply_filter(filter, item, filter_args));
      mapped.push_back(std::move(v));
    }
  }
  KUIPER_ASSIGN_OR_RETURN(Json list, list_of(mapped));
  return Value::data(std::move(list));
}

Result<Value> filter_list(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("list", args));
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  KUIPER_ASSIGN_OR_RETURN(Json list, list_of(items));
  return Value::data(std::move(list));
}

Result<Value> filter_lower(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("lower", args));
  return Value::data(text::lower(to_string(input)));
}

Result<Value> filter_upper(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("upper", args));
  return Value::data(text::upper(to_string(input)));
}

Result<Value> filter_capitalize(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("capitalize", args));
  return Value::data(text::capitalize(to_string(input)));
}

// str.replace, refused before it runs when the result would pass kMaxStringBytes.
Result<Value> checked_replace(const std::string& text, const std::string& old_part, const std::string& new_part,
                              int64_t count) {
  uint64_t found = 0;
  if (old_part.empty()) {
    found = text.size() + 1;  // at most: before every character and at the end
  } else {
    for (size_t at = text.find(old_part); at != std::string::npos; at = text.find(old_part, at + old_part.size())) {
      ++found;
    }
  }
  if (count >= 0) found = std::min<uint64_t>(found, static_cast<uint64_t>(count));
  if (new_part.size() > old_part.size() &&
      found > (kMaxStringBytes - std::min(text.size(), kMaxStringBytes)) / (new_part.size() - old_part.size())) {
    return Status::Error("replace() would pass " + std::to_string(kMaxStringBytes) + " bytes");
  }
  return Value::data(text::replace(text, old_part, new_part, count));
}

Result<Value> filter_replace(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("replace", args, {required("old"), required("new"), optional("count", none())}));
  int64_t count = -1;
  if (!is_none(p[2])) {
    KUIPER_ASSIGN_OR_RETURN(count, want_int("replace", p[2]));
  }
  return checked_replace(to_string(input), to_string(p[0]), to_string(p[1]), count);
}

Result<Value> filter_reverse(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("reverse", args));
  KUIPER_ASSIGN_OR_RETURN(auto items, iterate(input));
  std::reverse(items.begin(), items.end());
  if (input.is_string()) {
    std::string out;
    for (const Value& c : items) out += c.string();
    return Value::data(std::move(out));
  }
  KUIPER_ASSIGN_OR_RETURN(Json list, list_of(items));
  return Value::data(std::move(list));
}

// int(d) of a finite float: Python's is a big integer; beyond int64 here an error, not a
// conversion with undefined behaviour.
Result<Value> int_of_float(double d) {
  constexpr double kTwo63 = 9223372036854775808.0;
  if (d >= -kTwo63 && d < kTwo63) return Value::data(static_cast<int64_t>(d));
  return Status::Error("int(): " + python_float(d) + " is beyond a 64-bit integer");
}

// Jinja's int filter: int(value), else int(float(value)), else the default.
Result<Value> filter_int(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("int", args, {optional("default", Value::data(0)), optional("base", Value::data(10))}));
  KUIPER_ASSIGN_OR_RETURN(const int64_t base, want_int("int", p[1]));
  if (input.is_data()) {
    const Json& j = input.json();
    if (j.is_boolean()) return Value::data(int64_t{j.get<bool>()});
    if (j.is_number_integer()) return input;
    if (j.is_number_float() && std::isfinite(j.get<double>())) return int_of_float(j.get<double>());
    if (j.is_string()) {
      const std::string s = text::strip(j.get<std::string>(), std::nullopt, true, true);
      if (!s.empty()) {
        char* end = nullptr;
        errno = 0;
        const long long i = std::strtoll(s.c_str(), &end, static_cast<int>(base));
        if (errno == 0 && *end == '\0') return Value::data(static_cast<int64_t>(i));
        const double d = std::strtod(s.c_str(), &end);
        if (*end == '\0' && std::isfinite(d)) return int_of_float(d);
      }
    }
  }
  return p[0];
}

Result<Value> filter_float(const Value& input, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("float", args, {optional("default", Value::data(0.0))}));
  if (input.is_data()) {
    const Json& j = input.json();
    if (j.is_boolean()) return Value::data(j.get<bool>() ? 1.0 : 0.0);
    if (j.is_number()) return Value::data(j.get<double>());
    if (j.is_string()) {
      const std::string s = text::strip(j.get<std::string>(), std::nullopt, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return Value::data(d);
    }
  }
  return p[0];
}

Result<Value> filter_abs(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("abs", args));
  KUIPER_ASSIGN_OR_RETURN(Value negated, negate("-", input));
  KUIPER_ASSIGN_OR_RETURN(const bool negative, less(input, Value::data(0)));
  return negative ? negated : input;
}

// Chat templates render with autoescape off, so marking text safe changes nothing.
Result<Value> filter_safe(const Value& input, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("safe", args));
  return input;
}

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> table = {
      {"length", filter_length},       {"count", filter_length},        {"trim", filter_trim},
      {"tojson", filter_tojson},       {"string", filter_string},       {"first", filter_first},
      {"last", filter_last},           {"join", filter_join},           {"default", filter_default},
      {"d", filter_default},           {"items", filter_items},         {"select", filter_select},
      {"reject", filter_reject},       {"selectattr", filter_selectattr}, {"rejectattr", filter_rejectattr},
      {"map", filter_map},             {"list", filter_list},           {"lower", filter_lower},
      {"upper", filter_upper},         {"capitalize", filter_capitalize}, {"replace", filter_replace},
      {"reverse", filter_reverse},     {"int", filter_int},             {"float", filter_float},
      {"abs", filter_abs},             {"safe", filter_safe},
  };
  return table;
}

// ---- tests ----

using Test = Result<bool> (*)(const Value& input, const Arguments& args);

Result<Value> one_argument(const std::string& test, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind(test, args, {required("other")}));
  return p[0];
}

#define KUIPER_JINJA_PLAIN_TEST(fn, name, expr)                  \
  Result<bool> fn(const Value& v, const Arguments& args) {       \
    KUIPER_RETURN_IF_ERROR(no_arguments(name, args));       \
    return (expr);                                               \
  }

KUIPER_JINJA_PLAIN_TEST(test_defined, "defined", !v.is_undefined())
KUIPER_JINJA_PLAIN_TEST(test_undefined, "undefined", v.is_undefined())
KUIPER_JINJA_PLAIN_TEST(test_none, "none", v.is_data() && v.json().is_null())
KUIPER_JINJA_PLAIN_TEST(test_boolean, "boolean", v.is_data() && v.json().is_boolean())
KUIPER_JINJA_PLAIN_TEST(test_true, "true", v.is_data() && v.json().is_boolean() && v.json().get<bool>())
KUIPER_JINJA_PLAIN_TEST(test_false, "false", v.is_data() && v.json().is_boolean() && !v.json().get<bool>())
KUIPER_JINJA_PLAIN_TEST(test_integer, "integer", v.is_integer())
KUIPER_JINJA_PLAIN_TEST(test_float, "float", v.is_data() && v.json().is_number_float())
// Python's bool is a Number, so `true is number` holds.
KUIPER_JINJA_PLAIN_TEST(test_number, "number", v.is_data() && (v.json().is_number() || v.json().is_boolean()))
KUIPER_JINJA_PLAIN_TEST(test_string, "string", v.is_string())
KUIPER_JINJA_PLAIN_TEST(test_mapping, "mapping", v.is_mapping())
// Undefined iterates as empty and has a length, so Jinja calls it iterable and a sequence.
KUIPER_JINJA_PLAIN_TEST(test_iterable, "iterable", v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping())
KUIPER_JINJA_PLAIN_TEST(test_callable, "callable", v.kind() == Value::Kind::kMacro || v.kind() == Value::Kind::kFunction)
KUIPER_JINJA_PLAIN_TEST(test_lower, "lower", v.is_string() && text::is_lower(v.string()))
KUIPER_JINJA_PLAIN_TEST(test_upper, "upper", v.is_string() && text::is_upper(v.string()))

#undef KUIPER_JINJA_PLAIN_TEST

// Python's `is`: identity, which for data only singletons (None, True, False) can share.
Result<bool> test_sameas(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("sameas", args));
  if (v.is_data() && other.is_data()) {
    const Json& a = v.json();
    const Json& b = other.json();
    return (a.is_null() && b.is_null()) || (a.is_boolean() && b.is_boolean() && a == b) || &a == &b;
  }
  return !v.is_data() && !other.is_data() && equal(v, other);
}

Result<bool> test_eq(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("eq", args));
  return equal(v, other);
}
Result<bool> test_ne(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("ne", args));
  return !equal(v, other);
}
Result<bool> test_lt(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("lt", args));
  return less(v, other);
}
Result<bool> test_gt(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("gt", args));
  return less(other, v);
}
Result<bool> test_le(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("le", args));
  KUIPER_ASSIGN_OR_RETURN(const bool greater, less(other, v));
  return !greater;
}
Result<bool> test_ge(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("ge", args));
  KUIPER_ASSIGN_OR_RETURN(const bool smaller, less(v, other));
  return !smaller;
}
Result<bool> test_in(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value container, one_argument("in", args));
  return contains(container, v);
}

Result<bool> test_odd(const Value& v, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("odd", args));
  KUIPER_ASSIGN_OR_RETURN(const int64_t i, want_int("odd", v));
  return i % 2 != 0;
}
Result<bool> test_even(const Value& v, const Arguments& args) {
  KUIPER_RETURN_IF_ERROR(no_arguments("even", args));
  KUIPER_ASSIGN_OR_RETURN(const int64_t i, want_int("even", v));
  return i % 2 == 0;
}
Result<bool> test_divisibleby(const Value& v, const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(Value other, one_argument("divisibleby", args));
  KUIPER_ASSIGN_OR_RETURN(const int64_t i, want_int("divisibleby", v));
  KUIPER_ASSIGN_OR_RETURN(const int64_t n, want_int("divisibleby", other));
  if (n == 0) return Status::Error("integer division or modulo by zero");
  return i % n == 0;
}

const std::unordered_map<std::string, Test>& tests() {
  static const std::unordered_map<std::string, Test> table = {
      {"defined", test_defined},   {"undefined", test_undefined}, {"none", test_none},
      {"boolean", test_boolean},   {"true", test_true},           {"false", test_false},
      {"integer", test_integer},   {"float", test_float},         {"number", test_number},
      {"string", test_string},     {"mapping", test_mapping},     {"iterable", test_iterable},
      {"sequence", test_iterable}, {"callable", test_callable},   {"sameas", test_sameas},
      {"eq", test_eq},             {"equalto", test_eq},          {"==", test_eq},
      {"ne", test_ne},             {"!=", test_ne},               {"lt", test_lt},
      {"lessthan", test_lt},       {"<", test_lt},                {"le", test_le},
      {"<=", test_le},             {"gt", test_gt},               {"greaterthan", test_gt},
      {">", test_gt},              {"ge", test_ge},               {">=", test_ge},
      {"in", test_in},             {"odd", test_odd},             {"even", test_even},
      {"divisibleby", test_divisibleby}, {"lower", test_lower},   {"upper", test_upper},
  };
  return table;
}

// ---- methods ----

const std::unordered_set<std::string>& string_methods() {
  static const std::unordered_set<std::string> names = {"startswith", "endswith", "split", "strip", "lstrip",
                                                        "rstrip", "replace", "upper", "lower", "capitalize"};
  return names;
}

const std::unordered_set<std::string>& dict_methods() {
  static const std::unordered_set<std::string> names = {"items", "keys", "values", "get"};
  return names;
}

// startswith/endswith take one string or a tuple of them.
Result<bool> affix_matches(const std::string& method, const std::string& s, const Value& affix) {
  auto matches = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return method == "startswith" ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return matches(affix.string());
  if (affix.is_list()) {
    for (const Json& a : affix.json()) {
      if (!a.is_string()) return Status::Error(method + "() tuple items must be strings");
      if (matches(a.get_ref<const std::string&>())) return true;
    }
    return false;
  }
  return Status::Error(method + "() expects a string or a tuple of strings, got " + type_name(affix));
}

Result<Value> call_string_method(const std::string& s, const std::string& method, const Arguments& args) {
  if (method == "startswith" || method == "endswith") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(method, args, {required("prefix")}));
    KUIPER_ASSIGN_OR_RETURN(const bool matched, affix_matches(method, s, p[0]));
    return Value::data(matched);
  }
  if (method == "split") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(method, args, {optional("sep", none()), optional("maxsplit", Value::data(-1))}));
    KUIPER_ASSIGN_OR_RETURN(auto separator, optional_string(method, p[0]));
    if (separator.has_value() && separator->empty()) return Status::Error("split(): empty separator");
    KUIPER_ASSIGN_OR_RETURN(const int64_t max_split, want_int(method, p[1]));
    Json parts = Json::array();
    for (std::string& part : text::split(s, separator, max_split)) parts.push_back(std::move(part));
    return Value::data(std::move(parts));
  }
  if (method == "strip" || method == "lstrip" || method == "rstrip") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(method, args, {optional("chars", none())}));
    KUIPER_ASSIGN_OR_RETURN(auto chars, optional_string(method, p[0]));
    return Value::data(text::strip(s, chars, method != "rstrip", method != "lstrip"));
  }
  if (method == "replace") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(method, args, {required("old"), required("new"), optional("count", Value::data(-1))}));
    KUIPER_ASSIGN_OR_RETURN(const std::string old_part, want_string(method, p[0]));
    KUIPER_ASSIGN_OR_RETURN(const std::string new_part, want_string(method, p[1]));
    KUIPER_ASSIGN_OR_RETURN(const int64_t count, want_int(method, p[2]));
    return checked_replace(s, old_part, new_part, count);
  }
  KUIPER_RETURN_IF_ERROR(no_arguments(method, args));
  if (method == "upper") return Value::data(text::upper(s));
  if (method == "lower") return Value::data(text::lower(s));
  return Value::data(text::capitalize(s));
}

Result<Value> call_dict_method(const Value& dict, const std::string& method, const Arguments& args) {
  if (method == "get") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(method, args, {required("key"), optional("default", none())}));
    if (!p[0].is_string()) return p[1];
    const auto it = dict.json().find(p[0].string());
    return it == dict.json().end() ? p[1] : Value::element(dict, *it);
  }
  KUIPER_RETURN_IF_ERROR(no_arguments(method, args));
  if (method == "items") return filter_items(dict, Arguments());
  Json out = Json::array();
  for (const auto& [key, item] : dict.json().items()) {
    if (method == "keys") {
      out.push_back(key);
    } else {
      out.push_back(item);
    }
  }
  return Value::data(std::move(out));
}

// ---- globals ----

// Jinja's sandbox refuses ranges longer than this; so do we.
constexpr int64_t kMaxRange = 100000;

Result<Value> make_namespace(const Arguments& args) {
  auto ns = std::make_shared<Object>();
  ns->type_name = "Namespace";
  ns->assignable = true;
  if (args.positional.size() > 1) return Status::Error("namespace() takes at most one positional argument");
  if (!args.positional.empty()) {
    const Value& initial = args.positional[0];
    if (!initial.is_mapping()) return Status::Error("namespace() expects a mapping, got " + type_name(initial));
    for (const auto& [key, item] : initial.json().items()) ns->attributes[key] = Value::element(initial, item);
  }
  for (const auto& [name, value] : args.named) ns->attributes[name] = value;
  return Value::object(std::move(ns));
}

Result<Value> make_range(const Arguments& args) {
  if (!args.named.empty() || args.positional.empty() || args.positional.size() > 3) {
    return Status::Error("range() takes one to three positional arguments");
  }
  std::vector<int64_t> n;
  for (const Value& v : args.positional) {
    KUIPER_ASSIGN_OR_RETURN(const int64_t i, want_int("range", v));
    n.push_back(i);
  }
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) return Status::Error("range() arg 3 must not be zero");
  Json out = Json::array();
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      return Status::Error("range() longer than " + std::to_string(kMaxRange) + " items");
    }
    out.push_back(i);
  }
  return Value::data(std::move(out));
}

Result<Value> make_dict(const Arguments& args) {
  Json out = Json::object();
  if (args.positional.size() > 1) return Status::Error("dict() takes at most one positional argument");
  if (!args.positional.empty()) {
    if (!args.positional[0].is_mapping()) return Status::Error("dict() expects a mapping");
    out = args.positional[0].json();
  }
  for (const auto& [name, value] : args.named) {
    KUIPER_ASSIGN_OR_RETURN(out[name], to_json(value));
  }
  return Value::data(std::move(out));
}

// Hugging Face's strftime_now: the local time now, formatted like Python's strftime.
Result<Value> strftime_now(const Arguments& args) {
  KUIPER_ASSIGN_OR_RETURN(auto p, bind("strftime_now", args, {required("format")}));
  KUIPER_ASSIGN_OR_RETURN(const std::string format, want_string("strftime_now", p[0]));
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buffer(256 + format.size() * 8, '\0');
  const size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &local);
  buffer.resize(n);
  return Value::data(std::move(buffer));
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

bool has_global_function(const std::string& name) {
  return name == "namespace" || name == "range" || name == "dict" || name == "raise_exception" || name == "strftime_now";
}

bool has_method(const Value& object, const std::string& name) {
  if (object.is_string()) return string_methods().count(name) != 0;
  if (object.is_mapping()) return dict_methods().count(name) != 0;
  return false;
}

Result<Value> apply_filter(const std::string& name, const Value& input, const Arguments& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) return Status::Error("no filter named '" + name + "'");
  return it->second(input, args);
}

Result<bool> apply_test(const std::string& name, const Value& input, const Arguments& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) return Status::Error("no test named '" + name + "'");
  return it->second(input, args);
}

Result<Value> call_method(const Value& object, const std::string& name, const Arguments& args) {
  if (!has_method(object, name)) {
    return Status::Error("'" + type_name(object) + "' object has no method '" + name + "'");
  }
  if (object.is_string()) return call_string_method(object.string(), name, args);
  return call_dict_method(object, name, args);
}

Result<Value> call_global_function(const std::string& name, const Arguments& args) {
  if (name == "namespace") return make_namespace(args);
  if (name == "range") return make_range(args);
  if (name == "dict") return make_dict(args);
  if (name == "strftime_now") return strftime_now(args);
  if (name == "raise_exception") {
    KUIPER_ASSIGN_OR_RETURN(auto p, bind(name, args, {required("message")}));
    return Status::Error(to_string(p[0]));
  }
  return Status::Error("no function named '" + name + "'");
}

}  // namespace kuiper::jinja
