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

HttpResponse HttpResponse::RenderedJson(int status, std::function<std::string()> render) {
  HttpResponse r;
  r.status = status;
  r.render = std::move(render);
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

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> PercentDecoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int high = HexDigit(text[i + 1]), low = HexDigit(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      out += static_cast<char>(high * 16 + low);
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

std::optional<std::vector<std::pair<std::string, std::string>>> QueryParameters(
    std::string_view query) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view piece = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    auto name = PercentDecoded(piece.substr(0, eq));
    auto value = PercentDecoded(eq == std::string_view::npos ? std::string_view()
                                                             : piece.substr(eq + 1));
    if (!name || !value) return std::nullopt;
    out.emplace_back(std::move(*name), std::move(*value));
  }
  return out;
}

bool ResponseStream::Write(std::string data) {
  const size_t size = data.size();
  return Queue(Piece{std::move(data), nullptr}, size);
}

bool ResponseStream::Post(std::function<std::string()> render, size_t weight) {
  return Queue(Piece{std::string(), std::move(render)}, weight);
}

bool ResponseStream::Queue(Piece piece, size_t weight) {
  std::function<void()> wake;
  std::vector<Piece> dropped;  // Destroyed after the lock.
  {
    MutexLock lock(mu_);
    if (gone_) return false;
    if (closed_) return true;
    if (pending_bytes_ + weight > kMaxPendingBytes) {
      gone_ = true;
      dropped.swap(pending_);
      pending_bytes_ = 0;
      return false;
    }
    pending_bytes_ += weight;
    if (!piece.render && !pending_.empty() && !pending_.back().render) {
      pending_.back().bytes += piece.bytes;  // Bytes after bytes: one piece.
    } else {
      pending_.push_back(std::move(piece));
    }
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
  std::vector<Piece> taken;
  {
    MutexLock lock(mu_);
    *closed = closed_;
    taken.swap(pending_);
    pending_bytes_ = 0;
  }
  if (taken.size() == 1 && !taken[0].render) return std::move(taken[0].bytes);
  std::string out;
  for (Piece& piece : taken) out += piece.render ? piece.render() : piece.bytes;
  return out;
}

void ResponseStream::MarkGone() {
  std::vector<Piece> dropped;  // Destroyed after the lock: renderers hold their writers.
  MutexLock lock(mu_);
  gone_ = true;
  wake_ = nullptr;
  dropped.swap(pending_);
  pending_bytes_ = 0;
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
