// Status and Result<T>: errors as values across module boundaries.
//
// Each code says whether the caller may retry and maps to one HTTP status
// (see HttpStatusFor()).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // Bad input from the caller: 400. Do not retry unchanged.
  kNotFound,          // Unknown model, input or route: 404.
  kPayloadTooLarge,   // Body or tensor over a configured limit: 413.
  kUnavailable,       // Back-pressure (queue full, shutting down): 503, retry later.
  kDeadlineExceeded,  // The request's deadline passed before it ran: 504.
  kCancelled,         // The caller gave up (client disconnect); nobody is waiting.
  kInternal,          // A failure inside Sluice or the model: 500.
};
inline constexpr int kStatusCodeCount = static_cast<int>(StatusCode::kInternal) + 1;

// Short lower-case name of a code, e.g. "invalid_argument"; used in metrics labels.
std::string_view StatusCodeName(StatusCode code);

// The HTTP status a code is answered with.
int HttpStatusFor(StatusCode code);

// Thread-compatible value type.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status PayloadTooLarge(std::string m) {
    return {StatusCode::kPayloadTooLarge, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  // kUnavailable: when to try again, in seconds (0: unknown; HTTP then says 1).
  Status&& WithRetryAfter(double seconds) && {
    retry_after_seconds_ = seconds;
    return std::move(*this);
  }
  double retry_after_seconds() const { return retry_after_seconds_; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: <message>", or "ok".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  double retry_after_seconds_ = 0;
};

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design.
  Result(Status status) : value_(std::move(status)) {}  // NOLINT: must not be OK.

  bool ok() const { return std::holds_alternative<T>(value_); }
  // OK status when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(value_); }

  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace sluice

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define SLUICE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::sluice::Status sluice_status_ = (expr);        \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (false)
