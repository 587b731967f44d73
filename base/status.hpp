// Errors are values: every fallible boundary returns Status or Result<T>.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace atfill {

enum class StatusCode : unsigned char {
  kOk = 0,
  kInvalid,            // input does not follow the protocol or the syntax
  kCorrupt,            // bytes that should be self-consistent are not (hash mismatch, truncation)
  kNotFound,           // the thing asked for does not exist
  kUnsupported,        // valid but outside what atfill handles
  kOutOfRange,         // a size, depth or numeric limit was exceeded
  kIoError,            // the operating system said no
  kUnavailable,        // a peer or resource is not reachable now; retrying may help
  kCancelled,          // the work was asked to stop
  kResourceExhausted,  // a quota or cap was reached
  kInternal,           // a bug in atfill
};

std::string_view StatusCodeName(StatusCode code);

// Status is one pointer wide; the OK path allocates nothing.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);
  Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status Invalid(std::string msg) { return {StatusCode::kInvalid, std::move(msg)}; }
  static Status Corrupt(std::string msg) { return {StatusCode::kCorrupt, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The human sentence without the code name; empty when ok().
  const std::string& message() const;
  // "Invalid: <message>" or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(std::string_view prefix) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error, or OK when a value is held.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace atfill

#define ATFILL_CONCAT_INNER_(a, b) a##b
#define ATFILL_CONCAT_(a, b) ATFILL_CONCAT_INNER_(a, b)

#define ATFILL_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::atfill::Status _atfill_st = (expr);    \
    if (!_atfill_st.ok()) return _atfill_st; \
  } while (false)

#define ATFILL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// ATFILL_ASSIGN_OR_RETURN(auto x, ComputeX()); returns the error from the enclosing function.
#define ATFILL_ASSIGN_OR_RETURN(lhs, expr) \
  ATFILL_ASSIGN_OR_RETURN_IMPL_(ATFILL_CONCAT_(_atfill_res_, __LINE__), lhs, expr)
