// Reading untrusted JSON (model files, checkpoints, tokenizers, prompt files) through one checked
// door: parsing never throws, and every read checks the value's type and range, so a hostile or
// broken file is an error naming the value (`config.json: text_config.num_hidden_layers: ...`),
// never an exception past the caller or a conversion with undefined behaviour.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"

namespace kuiper {

// Parses `text` (into nlohmann::json, or ordered_json where key order matters). Syntax errors
// and numbers beyond a double (1e999) are errors naming `source`: the one place JSON
// exceptions are caught.
template <typename JsonT = nlohmann::json>
Result<JsonT> parse_json(std::string_view text, const std::string& source) {
  try {
    return JsonT::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(source + " is not valid JSON: " + e.what());
  }
}

// One JSON value, with where it came from for messages: the source ("config.json") and the
// path inside it ("text_config.eos_token_id[1]"). It refers to a json the caller keeps alive.
class JsonReader {
 public:
  static constexpr int64_t kIntMin = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();

  // The root value of `source` (empty: messages name only the path).
  JsonReader(const nlohmann::json& value, std::string source)
      : value_(&value), source_(std::move(source)) {}
  const nlohmann::json& json() const { return *value_; }

  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }
  // An object holding `key` with a value other than null.
  bool has(const std::string& key) const;
  // Member `key` (required) or element `index` of an array.
  Result<JsonReader> at(const std::string& key) const;
  Result<JsonReader> at(size_t index) const;
  // The elements of an array, or the members of an object (path "parent.key").
  Result<std::vector<JsonReader>> elements() const;
  Result<std::vector<std::pair<std::string, JsonReader>>> members() const;

  // This value, checked: an integer (not a fraction, not 2e9 written as a float) in [lo, hi];
  // a finite number; a boolean; a string.
  Result<int64_t> to_int(int64_t lo = kIntMin, int64_t hi = kIntMax) const;
  Result<uint64_t> to_uint64() const;  // a non-negative integer (file offsets and sizes)
  Result<double> to_double() const;
  Result<bool> to_bool() const;
  Result<std::string> to_string() const;
  // An array of integers in [lo, hi].
  Result<std::vector<int64_t>> to_int_list(int64_t lo = kIntMin, int64_t hi = kIntMax) const;

  // Member reads: required, or `fallback` when the key is absent or null.
  Result<int64_t> get_int(const std::string& key, int64_t lo = kIntMin, int64_t hi = kIntMax) const;
  Result<int64_t> get_int_or(const std::string& key, int64_t fallback, int64_t lo = kIntMin,
                             int64_t hi = kIntMax) const;
  Result<double> get_double(const std::string& key) const;
  Result<double> get_double_or(const std::string& key, double fallback) const;
  Result<bool> get_bool(const std::string& key) const;
  Result<bool> get_bool_or(const std::string& key, bool fallback) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<std::string> get_string_or(const std::string& key, const std::string& fallback) const;

  // An error about this value: "<source>: <path>: <problem>".
  Status error(const std::string& problem) const;

 private:
  JsonReader(const nlohmann::json& value, std::string source, std::string path)
      : value_(&value), source_(std::move(source)), path_(std::move(path)) {}
  JsonReader member(const nlohmann::json& value, const std::string& key) const;
  const nlohmann::json* value_;
  std::string source_;
  std::string path_;
};

}  // namespace kuiper
