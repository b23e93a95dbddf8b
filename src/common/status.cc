// Status names and their HTTP mapping.
#include "sluice/status.h"

#include <fmt/format.h>

namespace sluice {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kPayloadTooLarge:
      return "payload_too_large";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kPayloadTooLarge:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    // 499 is the de-facto "client closed request"; the client is gone, so it is only logged.
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", StatusCodeName(code_), message_);
}

}  // namespace sluice
