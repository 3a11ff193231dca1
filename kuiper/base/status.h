// Errors as values: every fallible public function returns Status or Result<T>.
// A Status carries one human-readable message meant for the user (it names the file, flag or
// tensor at fault), so callers can print it as is.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace kuiper {

class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message), false); }

  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("loading model.bin: ") to an error; success stays success.
  Status With(const std::string& context) const {
    return ok_ ? *this : Error(context + ": " + message_);
  }

 private:
  Status(std::string message, bool ok) : ok_(ok), message_(std::move(message)) {}
  bool ok_ = true;
  std::string message_;
};

// A value or the Status explaining why there is none. status() is Ok exactly when there is a
// value, so `return result.status();` forwards success as well as failure.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // From an error. An Ok status carries no value, so it becomes an error saying so.
  Result(Status status)  // NOLINT: implicit by design
      : status_(status.ok() ? Status::Error("a Result was made from an Ok status without a value")
                            : std::move(status)) {}
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // Reading the value of an error is a programming error: it aborts with the message rather than
  // returning garbage.
  T& value() & { return checked(), *value_; }
  const T& value() const& { return checked(), *value_; }
  T&& value() && { return checked(), std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  void checked() const {
    if (!value_) {
      std::fprintf(stderr, "kuiper: value of a failed Result: %s\n", status_.message().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace kuiper

#define KUIPER_CONCAT_INNER(a, b) a##b
#define KUIPER_CONCAT(a, b) KUIPER_CONCAT_INNER(a, b)

#define KUIPER_RETURN_IF_ERROR(expr)               \
  do {                                             \
    ::kuiper::Status kuiper_status_ = (expr);      \
    if (!kuiper_status_.ok()) return kuiper_status_; \
  } while (0)

#define KUIPER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// KUIPER_ASSIGN_OR_RETURN(auto x, FunctionReturningResult());
#define KUIPER_ASSIGN_OR_RETURN(lhs, expr) \
  KUIPER_ASSIGN_OR_RETURN_IMPL(KUIPER_CONCAT(kuiper_result_, __LINE__), lhs, expr)
