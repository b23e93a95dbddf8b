// HTTP responses and streamed bodies.
#include "http/exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/json_writer.h"

namespace sluice {

HttpResponse HttpResponse::Json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::Error(const Status& status) {
  HttpResponse r =
      Json(HttpStatusFor(status.code()), "{\"error\":" + JsonQuote(status.message()) + "}");
  if (status.code() == StatusCode::kUnavailable) {
    // Whole seconds (RFC 9110), at least 1.
    const double after = std::max(1.0, std::ceil(status.retry_after_seconds()));
    r.headers.emplace_back("Retry-After", std::to_string(static_cast<int64_t>(after)));
  }
  return r;
}

bool ResponseStream::Write(std::string data) {
  std::function<void()> wake;
  {
    MutexLock lock(mu_);
    if (gone_) return false;
    if (closed_) return true;
    if (pending_.size() + data.size() > kMaxPendingBytes) {
      gone_ = true;
      return false;
    }
    pending_ += data;
    wake = wake_;
  }
  if (wake) wake();
  return true;
}

void ResponseStream::Close() {
  std::function<void()> wake;
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    wake = wake_;
  }
  if (wake) wake();
}

bool ResponseStream::client_gone() const {
  MutexLock lock(mu_);
  return gone_;
}

void ResponseStream::Attach(std::function<void()> wake) {
  MutexLock lock(mu_);
  wake_ = std::move(wake);
}

std::string ResponseStream::Take(bool* closed) {
  MutexLock lock(mu_);
  *closed = closed_;
  return std::exchange(pending_, std::string());
}

void ResponseStream::MarkGone() {
  MutexLock lock(mu_);
  gone_ = true;
  wake_ = nullptr;
}

Status MemoryBudgetExceeded(const MemoryReservation& memory, size_t asked) {
  const MemoryBudget& budget = memory.budget();
  return Status::Unavailable(
             fmt::format("the server's memory budget is full: this request needs {} more bytes; "
                         "{} of {} are held by requests in flight",
                         asked, budget.in_use(), budget.limit()))
      .WithRetryAfter(1.0);
}

}  // namespace sluice
