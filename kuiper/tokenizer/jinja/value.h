// Values of the Jinja interpreter and the Python semantics Jinja gives them: truthiness, str(),
// ==, <, `in`, arithmetic, attribute and item access, iteration, and json.dumps as Hugging
// Face's tojson calls it. Data is JSON (what chat messages and tools are); the few things JSON
// cannot hold are their own kinds: Jinja's Undefined, namespace()/loop objects, macros and
// built-in functions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/jinja/ast.h"

namespace kuiper::jinja {

struct Object;
struct MacroDefinition;  // the interpreter's; a macro value only carries it

class Value {
 public:
  enum class Kind { kUndefined, kData, kObject, kMacro, kFunction };

  Value() = default;  // undefined, with no reason recorded

  // `reason` is what Jinja would say on misuse: "'foo' is undefined".
  static Value undefined(std::string reason);
  static Value data(Json json);
  // `element` lives inside `container`'s JSON; the value shares that storage instead of copying
  // (messages are read many times per render).
  static Value element(const Value& container, const Json& element);
  static Value object(std::shared_ptr<Object> object);
  static Value macro(std::shared_ptr<const MacroDefinition> macro, std::string name);
  static Value function(std::string name);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_data() const { return kind_ == Kind::kData; }
  bool is_string() const { return is_data() && data_->is_string(); }
  bool is_integer() const { return is_data() && data_->is_number_integer(); }  // not bool
  bool is_mapping() const { return is_data() && data_->is_object(); }
  bool is_list() const { return is_data() && data_->is_array(); }

  const Json& json() const { return *data_; }  // only for is_data()
  const std::string& string() const { return data_->get_ref<const std::string&>(); }  // only for is_string()
  int64_t integer() const { return data_->get<int64_t>(); }  // only for is_integer()
  const std::shared_ptr<Object>& object() const { return object_; }
  const std::shared_ptr<const MacroDefinition>& macro() const { return macro_; }
  // The undefined reason, or the macro or function name.
  const std::string& text() const { return text_; }

 private:
  Kind kind_ = Kind::kUndefined;
  std::shared_ptr<const Json> data_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<const MacroDefinition> macro_;
  std::string text_;
};

// namespace() objects (attributes assignable with {% set ns.x = ... %}) and the loop variable.
struct Object {
  std::string type_name;  // "Namespace" or "LoopContext", as Python would name them
  bool assignable = false;
  std::map<std::string, Value> attributes;
};

// The error Jinja raises when an Undefined is used for more than printing or testing.
Status undefined_error(const Value& value);

// Python's type name: str, int, float, bool, NoneType, list, dict, ...
std::string type_name(const Value& value);

bool truthy(const Value& value);

// Python's str(): strings as they are, None, True, 1.5, ['a', 1], {'k': 'v'}; Undefined is "".
std::string to_string(const Value& value);

// Python's float repr: the shortest text that reads back as the same double.
std::string python_float(double value);

// The JSON data a value stands for, to store it in a list or dict or dump it.
Result<Json> to_json(const Value& value);

struct JsonFormat {
  int indent = -1;  // < 0: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps with the given options (Hugging Face's tojson: ensure_ascii=False).
std::string dump_json(const Json& json, const JsonFormat& format);

bool equal(const Value& a, const Value& b);
Result<bool> less(const Value& a, const Value& b);
Result<bool> contains(const Value& container, const Value& item);  // item in container

// What one render may build, so a hostile template ('a' * 10000000000, a string doubled in a
// loop) is a clear error instead of exhausting memory: far above any chat prompt.
constexpr size_t kMaxStringBytes = size_t{16} << 20;  // one string, and the whole output
constexpr size_t kMaxListItems = size_t{1} << 20;

// Errors when a string or list built by the template passes the limits above.
Status check_size(const Value& v);

// + - * / // % ** on numbers, strings and lists, with Python's rules; an int64 overflow (Python
// integers have none) and a result past the limits are errors.
Result<Value> arithmetic(const std::string& op, const Value& a, const Value& b);
Result<Value> negate(const std::string& sign, const Value& operand);

// obj.name: a mapping's key or an object's attribute; Undefined when absent.
Result<Value> get_attribute(const Value& object, const std::string& name);
// obj[key]: list and string indices (negative from the end) and mapping keys.
Result<Value> get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists and strings.
Result<Value> get_slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop,
                        std::optional<int64_t> step);

// The items a for loop visits: list elements, mapping keys, string characters; none for
// Undefined.
Result<std::vector<Value>> iterate(const Value& value);

}  // namespace kuiper::jinja
