// Route table.
#include "server/router.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cmath>

#include "common/json_writer.h"

namespace sluice {
namespace {

// A path's segments, held inline up to a depth no route has (no allocation per request).
using Segments = boost::container::small_vector<std::string_view, 12>;

Segments SplitPath(std::string_view path) {
  Segments segments;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) segments.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return segments;
}

}  // namespace

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

std::string_view PathParams::Get(std::string_view name) const {
  for (const auto& [key, value] : values) {
    if (key == name) return value;
  }
  return {};
}

void Router::Add(std::string method, std::string_view pattern, Handler handler) {
  Route route{std::move(method), {}, std::move(handler), nullptr};
  for (std::string_view segment : SplitPath(pattern)) route.segments.emplace_back(segment);
  routes_.push_back(std::move(route));
}

Status MemoryBudgetExceeded(const MemoryReservation& memory, size_t asked) {
  const MemoryBudget& budget = memory.budget();
  return Status::Unavailable(
             fmt::format("the server's memory budget is full: this request needs {} more bytes; "
                         "{} of {} are held by requests in flight",
                         asked, budget.in_use(), budget.limit()))
      .WithRetryAfter(1.0);
}

void Router::SetAdmission(std::string_view method, std::string_view pattern, Admission admission) {
  const Segments segments = SplitPath(pattern);
  for (Route& route : routes_) {
    if (route.method == method && std::equal(route.segments.begin(), route.segments.end(),
                                             segments.begin(), segments.end())) {
      route.admission = std::move(admission);
      return;
    }
  }
}

bool Router::Match(const Route& route, std::span<const std::string_view> segments,
                   PathParams& params) {
  if (route.segments.size() != segments.size()) return false;
  params.values.clear();
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string& want = route.segments[i];
    if (want.size() > 2 && want.front() == '{' && want.back() == '}') {
      params.values.emplace_back(want.substr(1, want.size() - 2), std::string(segments[i]));
    } else if (want != segments[i]) {
      return false;
    }
  }
  return true;
}

Result<AdmissionTicket> Router::Admit(std::string_view method, std::string_view path) const {
  const Segments segments = SplitPath(path);
  PathParams params;
  for (const Route& route : routes_) {
    if (route.method != method || !Match(route, {segments.data(), segments.size()}, params))
      continue;
    return route.admission ? route.admission(params) : AdmissionTicket();
  }
  return AdmissionTicket();
}

void Router::Dispatch(const HttpRequest& request, Responder respond) const {
  const Segments segments = SplitPath(request.path);
  std::string allowed;
  PathParams params;
  for (const Route& route : routes_) {
    if (!Match(route, {segments.data(), segments.size()}, params)) continue;
    if (route.method != request.method) {
      if (allowed.find(route.method) == std::string::npos) {
        allowed += allowed.empty() ? route.method : ", " + route.method;
      }
      continue;
    }
    route.handler(request, params, std::move(respond));
    return;
  }
  if (!allowed.empty()) {
    HttpResponse r =
        HttpResponse::Json(405, "{\"error\":" +
                                    JsonQuote(fmt::format("method {} is not allowed here; use {}",
                                                          request.method, allowed)) +
                                    "}");
    r.headers.emplace_back("Allow", allowed);
    respond(std::move(r));
    return;
  }
  respond(HttpResponse::Error(
      Status::NotFound(fmt::format("no route for {} {}", request.method, request.path))));
}

}  // namespace sluice
