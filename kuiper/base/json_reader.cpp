#include "kuiper/base/json_reader.h"

#include <cmath>

namespace kuiper {

using nlohmann::json;

namespace {

const char* type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// A short rendering of a value for messages (a long string or array is cut).
std::string shown(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

}  // namespace

Status JsonReader::error(const std::string& problem) const {
  std::string message;
  for (const std::string* part : {&source_, &path_}) {
    if (!part->empty()) message += *part + ": ";
  }
  return Status::Error(message + problem);
}

JsonReader JsonReader::member(const nlohmann::json& value, const std::string& key) const {
  return JsonReader(value, source_, path_.empty() ? key : path_ + "." + key);
}

bool JsonReader::has(const std::string& key) const {
  if (!value_->is_object()) return false;
  auto it = value_->find(key);
  return it != value_->end() && !it->is_null();
}

Result<JsonReader> JsonReader::at(const std::string& key) const {
  if (!value_->is_object()) {
    return error(std::string("expected an object holding \"") + key + "\", got " +
                 type_name(*value_));
  }
  auto it = value_->find(key);
  if (it == value_->end()) return error("missing \"" + key + "\"");
  return member(*it, key);
}

Result<JsonReader> JsonReader::at(size_t index) const {
  if (!value_->is_array()) return error(std::string("expected an array, got ") + type_name(*value_));
  if (index >= value_->size()) {
    return error("has " + std::to_string(value_->size()) + " elements, no element " +
                 std::to_string(index));
  }
  return JsonReader((*value_)[index], source_, path_ + "[" + std::to_string(index) + "]");
}

Result<std::vector<JsonReader>> JsonReader::elements() const {
  if (!value_->is_array()) return error(std::string("expected an array, got ") + type_name(*value_));
  std::vector<JsonReader> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) {
    out.push_back(JsonReader((*value_)[i], source_, path_ + "[" + std::to_string(i) + "]"));
  }
  return out;
}

Result<std::vector<std::pair<std::string, JsonReader>>> JsonReader::members() const {
  if (!value_->is_object()) {
    return error(std::string("expected an object, got ") + type_name(*value_));
  }
  std::vector<std::pair<std::string, JsonReader>> out;
  out.reserve(value_->size());
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    out.emplace_back(it.key(), member(it.value(), it.key()));
  }
  return out;
}

Result<int64_t> JsonReader::to_int(int64_t lo, int64_t hi) const {
  const nlohmann::json& v = *value_;
  auto outside = [&](const std::string& value) {
    return error(value + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();  // the parser's type for every non-negative integer
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      return outside(std::to_string(u));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) return outside(std::to_string(i));
    return i;
  }
  return error(std::string("expected an integer, got ") + type_name(v) + " " + shown(v));
}

Result<uint64_t> JsonReader::to_uint64() const {
  if (value_->is_number_unsigned()) return value_->get<uint64_t>();
  if (value_->is_number_integer()) return error(value_->dump() + " is negative");
  return error(std::string("expected a non-negative integer, got ") + type_name(*value_) + " " +
               shown(*value_));
}

Result<double> JsonReader::to_double() const {
  if (!value_->is_number()) {
    return error(std::string("expected a number, got ") + type_name(*value_) + " " +
                 shown(*value_));
  }
  const double d = value_->get<double>();
  if (!std::isfinite(d)) return error("expected a finite number");
  return d;
}

Result<bool> JsonReader::to_bool() const {
  if (!value_->is_boolean()) {
    return error(std::string("expected a boolean, got ") + type_name(*value_) + " " +
                 shown(*value_));
  }
  return value_->get<bool>();
}

Result<std::string> JsonReader::to_string() const {
  if (!value_->is_string()) {
    return error(std::string("expected a string, got ") + type_name(*value_) + " " +
                 shown(*value_));
  }
  return value_->get<std::string>();
}

Result<std::vector<int64_t>> JsonReader::to_int_list(int64_t lo, int64_t hi) const {
  KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> items, elements());
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (const JsonReader& item : items) {
    KUIPER_ASSIGN_OR_RETURN(int64_t v, item.to_int(lo, hi));
    out.push_back(v);
  }
  return out;
}

Result<int64_t> JsonReader::get_int(const std::string& key, int64_t lo, int64_t hi) const {
  KUIPER_ASSIGN_OR_RETURN(JsonReader v, at(key));
  return v.to_int(lo, hi);
}

Result<int64_t> JsonReader::get_int_or(const std::string& key, int64_t fallback, int64_t lo,
                                       int64_t hi) const {
  return has(key) ? get_int(key, lo, hi) : Result<int64_t>(fallback);
}

Result<double> JsonReader::get_double(const std::string& key) const {
  KUIPER_ASSIGN_OR_RETURN(JsonReader v, at(key));
  return v.to_double();
}

Result<double> JsonReader::get_double_or(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : Result<double>(fallback);
}

Result<bool> JsonReader::get_bool(const std::string& key) const {
  KUIPER_ASSIGN_OR_RETURN(JsonReader v, at(key));
  return v.to_bool();
}

Result<bool> JsonReader::get_bool_or(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : Result<bool>(fallback);
}

Result<std::string> JsonReader::get_string(const std::string& key) const {
  KUIPER_ASSIGN_OR_RETURN(JsonReader v, at(key));
  return v.to_string();
}

Result<std::string> JsonReader::get_string_or(const std::string& key,
                                              const std::string& fallback) const {
  return has(key) ? get_string(key) : Result<std::string>(fallback);
}

}  // namespace kuiper
