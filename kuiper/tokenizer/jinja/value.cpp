#include "kuiper/tokenizer/jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "kuiper/tokenizer/jinja/text.h"

namespace kuiper::jinja {

Value Value::undefined(std::string reason) {
  Value v;
  v.text_ = std::move(reason);
  return v;
}

Value Value::data(Json json) {
  Value v;
  v.kind_ = Kind::kData;
  v.data_ = std::make_shared<const Json>(std::move(json));
  return v;
}

Value Value::element(const Value& container, const Json& element) {
  Value v;
  v.kind_ = Kind::kData;
  v.data_ = std::shared_ptr<const Json>(container.data_, &element);
  return v;
}

Value Value::object(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::move(object);
  return v;
}

Value Value::macro(std::shared_ptr<const MacroDefinition> macro, std::string name) {
  Value v;
  v.kind_ = Kind::kMacro;
  v.macro_ = std::move(macro);
  v.text_ = std::move(name);
  return v;
}

Value Value::function(std::string name) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.text_ = std::move(name);
  return v;
}

namespace {

bool is_number(const Json& j) { return j.is_number() || j.is_boolean(); }  // bool is an int in Python
bool is_int_like(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t as_int(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }
double as_double(const Json& j) { return j.is_number_float() ? j.get<double>() : static_cast<double>(as_int(j)); }

std::string json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "int";
    case Json::value_t::number_float: return "float";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    default: return "binary";
  }
}

// How Jinja names the owner of a missing attribute: "'dict object'", or "None".
std::string owner_description(const Value& v) {
  if (v.is_data() && v.json().is_null()) return "None";
  return "'" + type_name(v) + " object'";
}

void append_python_repr_string(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  *out += quote;
  for (const char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", u);
      *out += buffer;
    } else {
      *out += c;
    }
  }
  *out += quote;
}

void append_repr(const Json& j, std::string* out) {
  switch (j.type()) {
    case Json::value_t::null: *out += "None"; break;
    case Json::value_t::boolean: *out += j.get<bool>() ? "True" : "False"; break;
    case Json::value_t::number_integer: *out += std::to_string(j.get<int64_t>()); break;
    case Json::value_t::number_unsigned: *out += std::to_string(j.get<uint64_t>()); break;
    case Json::value_t::number_float: *out += python_float(j.get<double>()); break;
    case Json::value_t::string: append_python_repr_string(j.get_ref<const std::string&>(), out); break;
    case Json::value_t::array: {
      *out += '[';
      bool first = true;
      for (const Json& item : j) {
        if (!first) *out += ", ";
        first = false;
        append_repr(item, out);
      }
      *out += ']';
      break;
    }
    case Json::value_t::object: {
      *out += '{';
      bool first = true;
      for (const auto& [key, item] : j.items()) {
        if (!first) *out += ", ";
        first = false;
        append_python_repr_string(key, out);
        *out += ": ";
        append_repr(item, out);
      }
      *out += '}';
      break;
    }
    default: *out += "<binary>"; break;
  }
}

void append_json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  auto append_u = [out](unsigned value) {
    char buffer[16];
    std::snprintf(buffer, sizeof(buffer), "\\u%04x", value);
    *out += buffer;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    if (u < 0x20) {
      append_u(u);
    } else if (u < 0x80 || !ensure_ascii) {
      *out += c;
    } else {
      // ensure_ascii: one \uXXXX per UTF-16 unit of the character starting here.
      utf8proc_int32_t cp = 0xFFFD;
      const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
      if (n <= 0) cp = 0xFFFD;
      if (cp >= 0x10000) {
        append_u(0xD800 + ((static_cast<unsigned>(cp) - 0x10000) >> 10));
        append_u(0xDC00 + ((static_cast<unsigned>(cp) - 0x10000) & 0x3FF));
      } else {
        append_u(static_cast<unsigned>(cp));
      }
      i += n > 0 ? static_cast<size_t>(n) - 1 : 0;
    }
  }
  *out += '"';
}

void append_json(const Json& j, const JsonFormat& f, int level, std::string* out) {
  auto newline = [&](int depth) {
    if (f.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(f.indent) * static_cast<size_t>(depth), ' ');
  };
  switch (j.type()) {
    case Json::value_t::null: *out += "null"; break;
    case Json::value_t::boolean: *out += j.get<bool>() ? "true" : "false"; break;
    case Json::value_t::number_integer: *out += std::to_string(j.get<int64_t>()); break;
    case Json::value_t::number_unsigned: *out += std::to_string(j.get<uint64_t>()); break;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += python_float(d);
      }
      break;
    }
    case Json::value_t::string: append_json_string(j.get_ref<const std::string&>(), f.ensure_ascii, out); break;
    case Json::value_t::array: {
      if (j.empty()) {
        *out += "[]";
        break;
      }
      *out += '[';
      bool first = true;
      for (const Json& item : j) {
        if (!first) *out += f.item_separator;
        first = false;
        newline(level + 1);
        append_json(item, f, level + 1, out);
      }
      newline(level);
      *out += ']';
      break;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        *out += "{}";
        break;
      }
      std::vector<std::pair<const std::string*, const Json*>> members;
      for (const auto& [key, item] : j.items()) members.emplace_back(&key, &item);
      if (f.sort_keys) {
        std::stable_sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
      }
      *out += '{';
      bool first = true;
      for (const auto& [key, item] : members) {
        if (!first) *out += f.item_separator;
        first = false;
        newline(level + 1);
        append_json_string(*key, f.ensure_ascii, out);
        *out += f.key_separator;
        append_json(*item, f, level + 1, out);
      }
      newline(level);
      *out += '}';
      break;
    }
    default: *out += "null"; break;
  }
}

bool json_equal(const Json& a, const Json& b) {
  if (is_number(a) && is_number(b)) {
    if (is_int_like(a) && is_int_like(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!json_equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, item] : a.items()) {
      const auto it = b.find(key);
      if (it == b.end() || !json_equal(item, *it)) return false;
    }
    return true;
  }
  return a == b;
}

Status type_error(const std::string& op, const Value& a, const Value& b) {
  return Status::Error("unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Result<Value> repeat(const Value& sequence, int64_t times) {
  if (times <= 0) return Value::data(sequence.is_string() ? Json("") : Json::array());
  const size_t limit = sequence.is_string() ? kMaxStringBytes : kMaxListItems;
  const size_t unit = sequence.is_string() ? sequence.string().size() : sequence.json().size();
  if (unit > 0 && static_cast<uint64_t>(times) > limit / unit) {
    return Status::Error("the result of * would pass " + std::to_string(limit) +
                         (sequence.is_string() ? " bytes" : " items"));
  }
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.string();
    return Value::data(std::move(out));
  }
  Json out = Json::array();
  for (int64_t i = 0; i < times; ++i) {
    for (const Json& item : sequence.json()) out.push_back(item);
  }
  return Value::data(std::move(out));
}

Status integer_overflow(const std::string& op) {
  return Status::Error("integer overflow in " + op + " (beyond 64 bits)");
}

// i ** j for j >= 0 by squaring: at most 64 steps, each checked.
Result<int64_t> int_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) != 0 && __builtin_mul_overflow(result, base, &result)) {
      return integer_overflow("**");
    }
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return integer_overflow("**");
  }
  return result;
}

// Python's slice.indices: clamps start and stop for a sequence of `length`.
std::vector<int64_t> slice_indices(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
  auto clamp = [&](std::optional<int64_t> index, int64_t if_absent) {
    if (!index.has_value()) return if_absent;
    int64_t i = *index;
    if (i < 0) i += length;
    if (i < 0) return step < 0 ? int64_t{-1} : int64_t{0};
    if (i >= length) return step < 0 ? length - 1 : length;
    return i;
  };
  const int64_t first = clamp(start, step < 0 ? length - 1 : 0);
  const int64_t end = clamp(stop, step < 0 ? -1 : length);
  std::vector<int64_t> indices;
  for (int64_t i = first; step > 0 ? i < end : i > end; i += step) indices.push_back(i);
  return indices;
}

}  // namespace

Status undefined_error(const Value& value) {
  return Status::Error(value.text().empty() ? "value is undefined" : value.text());
}

std::string type_name(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kData: return json_type_name(value.json());
    case Value::Kind::kObject: return value.object()->type_name;
    case Value::Kind::kMacro: return "Macro";
    case Value::Kind::kFunction: return "builtin_function_or_method";
  }
  return "unknown";
}

bool truthy(const Value& value) {
  if (!value.is_data()) return !value.is_undefined();
  const Json& j = value.json();
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return as_int(j) != 0;
    case Json::value_t::number_float: return j.get<double>() != 0.0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();  // json::empty() is false for any string
    case Json::value_t::array:
    case Json::value_t::object: return !j.empty();
    default: return true;
  }
}

std::string to_string(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kData: {
      if (value.is_string()) return value.string();
      std::string out;
      append_repr(value.json(), &out);
      return out;
    }
    case Value::Kind::kObject: return "<" + value.object()->type_name + ">";
    case Value::Kind::kMacro: return "<Macro '" + value.text() + "'>";
    case Value::Kind::kFunction: return "<built-in function " + value.text() + ">";
  }
  return "";
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  // buffer is "[-]d.ddde[+-]xx": split it into sign, significant digits and decimal exponent.
  std::string mantissa(buffer, std::strchr(buffer, 'e'));
  const int exponent = std::atoi(std::strchr(buffer, 'e') + 1);
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) return sign + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits) return sign + digits + std::string(int_digits - digits.size(), '0') + ".0";
    return sign + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  std::string out = sign + digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_text;
}

Result<Json> to_json(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kData: return value.json();
    case Value::Kind::kUndefined: return undefined_error(value);
    default: return Status::Error("a " + type_name(value) + " cannot be stored in a list or dict or serialized");
  }
}

std::string dump_json(const Json& json, const JsonFormat& format) {
  std::string out;
  append_json(json, format, 0, &out);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined: return true;
    case Value::Kind::kData: return json_equal(a.json(), b.json());
    case Value::Kind::kObject: return a.object() == b.object();
    case Value::Kind::kMacro: return a.macro() == b.macro();
    case Value::Kind::kFunction: return a.text() == b.text();
  }
  return false;
}

Result<bool> less(const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_data() && b.is_data()) {
    const Json& x = a.json();
    const Json& y = b.json();
    if (is_number(x) && is_number(y)) {
      if (is_int_like(x) && is_int_like(y)) return as_int(x) < as_int(y);
      return as_double(x) < as_double(y);
    }
    if (x.is_string() && y.is_string()) return x.get_ref<const std::string&>() < y.get_ref<const std::string&>();
    if (x.is_array() && y.is_array()) {
      for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
        if (json_equal(x[i], y[i])) continue;
        return less(Value::element(a, x[i]), Value::element(b, y[i]));
      }
      return x.size() < y.size();
    }
  }
  return Status::Error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Result<bool> contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  if (container.is_data()) {
    const Json& c = container.json();
    if (c.is_string()) {
      if (!item.is_string()) {
        return Status::Error("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return c.get_ref<const std::string&>().find(item.string()) != std::string::npos;
    }
    if (c.is_array()) {
      for (const Json& element : c) {
        if (equal(Value::element(container, element), item)) return true;
      }
      return false;
    }
    if (c.is_object()) return item.is_string() && c.contains(item.string());
  }
  return Status::Error("argument of type '" + type_name(container) + "' is not iterable");
}

Status check_size(const Value& v) {
  if (v.is_string() && v.string().size() > kMaxStringBytes) {
    return Status::Error("a string passes " + std::to_string(kMaxStringBytes) + " bytes");
  }
  if (v.is_list() && v.json().size() > kMaxListItems) {
    return Status::Error("a list passes " + std::to_string(kMaxListItems) + " items");
  }
  return Status::Ok();
}

Result<Value> arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (!a.is_data() || !b.is_data()) return type_error(op, a, b);
  const Json& x = a.json();
  const Json& y = b.json();
  if (is_number(x) && is_number(y)) {
    if (is_int_like(x) && is_int_like(y) && op != "/") {
      const int64_t i = as_int(x);
      const int64_t j = as_int(y);
      int64_t r = 0;
      const bool overflow = (op == "+" && __builtin_add_overflow(i, j, &r)) ||
                            (op == "-" && __builtin_sub_overflow(i, j, &r)) ||
                            (op == "*" && __builtin_mul_overflow(i, j, &r));
      if (overflow) return integer_overflow(op);
      if (op == "+" || op == "-" || op == "*") return Value::data(r);
      if (op == "//" || op == "%") {
        if (j == 0) return Status::Error("integer division or modulo by zero");
        if (i == std::numeric_limits<int64_t>::min() && j == -1) return integer_overflow(op);
        int64_t quotient = i / j;
        int64_t remainder = i % j;
        if (remainder != 0 && ((remainder < 0) != (j < 0))) {  // Python floors toward -infinity
          quotient -= 1;
          remainder += j;
        }
        return Value::data(op == "//" ? quotient : remainder);
      }
      if (op == "**") {
        if (j < 0) return Value::data(std::pow(static_cast<double>(i), static_cast<double>(j)));
        KUIPER_ASSIGN_OR_RETURN(const int64_t power, int_power(i, j));
        return Value::data(power);
      }
    }
    const double p = as_double(x);
    const double q = as_double(y);
    if (op == "+") return Value::data(p + q);
    if (op == "-") return Value::data(p - q);
    if (op == "*") return Value::data(p * q);
    if (op == "**") return Value::data(std::pow(p, q));
    if (q == 0.0) return Status::Error("float division by zero");
    if (op == "/") return Value::data(p / q);
    if (op == "//") return Value::data(std::floor(p / q));
    if (op == "%") {
      double r = std::fmod(p, q);
      if (r != 0.0 && ((r < 0) != (q < 0))) r += q;
      return Value::data(r);
    }
  }
  if (op == "+" && x.is_string() && y.is_string()) {
    if (a.string().size() + b.string().size() > kMaxStringBytes) {
      return Status::Error("the result of + would pass " + std::to_string(kMaxStringBytes) + " bytes");
    }
    return Value::data(a.string() + b.string());
  }
  if (op == "+" && x.is_array() && y.is_array()) {
    if (x.size() + y.size() > kMaxListItems) {
      return Status::Error("the result of + would pass " + std::to_string(kMaxListItems) + " items");
    }
    Json joined = x;
    for (const Json& item : y) joined.push_back(item);
    return Value::data(std::move(joined));
  }
  if (op == "*") {
    if ((x.is_string() || x.is_array()) && is_int_like(y)) return repeat(a, as_int(y));
    if ((y.is_string() || y.is_array()) && is_int_like(x)) return repeat(b, as_int(x));
  }
  return type_error(op, a, b);
}

Result<Value> negate(const std::string& sign, const Value& operand) {
  if (operand.is_undefined()) return undefined_error(operand);
  if (!operand.is_data() || !is_number(operand.json())) {
    return Status::Error("bad operand type for unary " + sign + ": '" + type_name(operand) + "'");
  }
  const Json& j = operand.json();
  if (is_int_like(j)) {
    if (sign == "-" && as_int(j) == std::numeric_limits<int64_t>::min()) return integer_overflow("-");
    return Value::data(sign == "-" ? -as_int(j) : as_int(j));
  }
  return Value::data(sign == "-" ? -j.get<double>() : j.get<double>());
}

Result<Value> get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) return undefined_error(object);
  if (object.is_mapping()) {
    const auto it = object.json().find(name);
    if (it != object.json().end()) return Value::element(object, *it);
  } else if (object.kind() == Value::Kind::kObject) {
    const auto it = object.object()->attributes.find(name);
    if (it != object.object()->attributes.end()) return it->second;
  }
  return Value::undefined(owner_description(object) + " has no attribute '" + name + "'");
}

Result<Value> get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return undefined_error(object);
  if (key.is_string()) return get_attribute(object, key.string());
  if (object.is_data() && key.is_data() && is_int_like(key.json())) {
    const int64_t index = as_int(key.json());
    const Json& j = object.json();
    if (j.is_array()) {
      const int64_t size = static_cast<int64_t>(j.size());
      const int64_t i = index < 0 ? index + size : index;
      if (i >= 0 && i < size) return Value::element(object, j[static_cast<size_t>(i)]);
      return Value::undefined("list object has no element " + std::to_string(index));
    }
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      const std::vector<size_t> b = text::char_boundaries(s);
      const int64_t size = static_cast<int64_t>(b.size()) - 1;
      const int64_t i = index < 0 ? index + size : index;
      if (i >= 0 && i < size) return Value::data(s.substr(b[static_cast<size_t>(i)], b[static_cast<size_t>(i) + 1] - b[static_cast<size_t>(i)]));
      return Value::undefined("str object has no element " + std::to_string(index));
    }
  }
  return Value::undefined(owner_description(object) + " has no item " + to_string(key));
}

Result<Value> get_slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop,
                        std::optional<int64_t> step) {
  if (object.is_undefined()) return undefined_error(object);
  const int64_t stride = step.value_or(1);
  if (stride == 0) return Status::Error("slice step cannot be zero");
  if (object.is_list()) {
    const Json& j = object.json();
    Json out = Json::array();
    for (const int64_t i : slice_indices(static_cast<int64_t>(j.size()), start, stop, stride)) {
      out.push_back(j[static_cast<size_t>(i)]);
    }
    return Value::data(std::move(out));
  }
  if (object.is_string()) {
    const std::string& s = object.string();
    const std::vector<size_t> b = text::char_boundaries(s);
    std::string out;
    for (const int64_t i : slice_indices(static_cast<int64_t>(b.size()) - 1, start, stop, stride)) {
      out.append(s, b[static_cast<size_t>(i)], b[static_cast<size_t>(i) + 1] - b[static_cast<size_t>(i)]);
    }
    return Value::data(std::move(out));
  }
  return Status::Error("'" + type_name(object) + "' object cannot be sliced");
}

Result<std::vector<Value>> iterate(const Value& value) {
  std::vector<Value> items;
  if (value.is_undefined()) return items;
  if (value.is_data()) {
    const Json& j = value.json();
    if (j.is_array()) {
      items.reserve(j.size());
      for (const Json& item : j) items.push_back(Value::element(value, item));
      return items;
    }
    if (j.is_object()) {
      for (const auto& [key, item] : j.items()) items.push_back(Value::data(key));
      return items;
    }
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      const std::vector<size_t> b = text::char_boundaries(s);
      for (size_t i = 0; i + 1 < b.size(); ++i) items.push_back(Value::data(s.substr(b[i], b[i + 1] - b[i])));
      return items;
    }
  }
  return Status::Error("'" + type_name(value) + "' object is not iterable");
}

}  // namespace kuiper::jinja
