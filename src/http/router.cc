// Route table.
#include "http/router.h"

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

void Router::SetPublic(std::string_view method, std::string_view pattern) {
  if (Route* route = Find(method, pattern)) route->is_public = true;
}

bool Router::IsPublic(std::string_view method, std::string_view path) const {
  const Segments segments = SplitPath(path);
  PathParams params;
  for (const Route& route : routes_) {
    if (route.method == method && Match(route, {segments.data(), segments.size()}, params)) {
      return route.is_public;
    }
  }
  return false;
}

Router::Route* Router::Find(std::string_view method, std::string_view pattern) {
  const Segments segments = SplitPath(pattern);
  for (Route& route : routes_) {
    if (route.method == method && std::equal(route.segments.begin(), route.segments.end(),
                                             segments.begin(), segments.end())) {
      return &route;
    }
  }
  return nullptr;
}

void Router::SetAdmission(std::string_view method, std::string_view pattern, Admission admission) {
  if (Route* route = Find(method, pattern)) route->admission = std::move(admission);
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
