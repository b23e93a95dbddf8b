// The route table: patterns of literal and {name} segments, each with its handler and an optional
// admission check, apart from the named handler functions they point to. What a handler receives
// and answers (HttpRequest, HttpResponse, Responder) is in exchange.h.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/exchange.h"
#include "sluice/status.h"

namespace sluice {

// Path parameters captured by {name} segments, in pattern order.
struct PathParams {
  std::vector<std::pair<std::string, std::string>> values;
  // The value of `name`; empty when absent.
  std::string_view Get(std::string_view name) const;
};

using Handler = std::function<void(const HttpRequest&, const PathParams&, Responder)>;
// Asked once a request's header has arrived, before its body is read: an error (an overloaded
// model, say) is answered at once and the body is never read. On success it may hand back a
// ticket, held (HttpRequest::admission) until the handler lets the request go. Runs on an I/O
// thread: it must be cheap and must not block.
using AdmissionTicket = std::shared_ptr<const void>;
using Admission = std::function<Result<AdmissionTicket>(const PathParams&)>;

// Thread-compatible: built before the server starts, then only read.
class Router {
 public:
  // `pattern` is a path whose segments are literals or {name}, e.g. "/v2/models/{model}/ready".
  void Add(std::string method, std::string_view pattern, Handler handler);
  void Get(std::string_view pattern, Handler handler) { Add("GET", pattern, std::move(handler)); }
  void Post(std::string_view pattern, Handler handler) { Add("POST", pattern, std::move(handler)); }

  // Adds an admission check to the route added with `method` and `pattern`.
  void SetAdmission(std::string_view method, std::string_view pattern, Admission admission);

  // Lets the route added with `method` and `pattern` answer without the API key (a page that
  // asks for the key; code and styles that hold no data). Every other route needs the key when
  // the server has one.
  void SetPublic(std::string_view method, std::string_view pattern);
  // Whether the route matching `method` and `path` needs no API key.
  bool IsPublic(std::string_view method, std::string_view path) const;

  // Calls the matching handler; 404 when no pattern matches the path, 405 (with Allow) when one
  // matches but not for this method.
  void Dispatch(const HttpRequest& request, Responder respond) const;
  // The matching route's admission check; OK (no ticket) when it has none or nothing matches
  // (Dispatch answers those).
  Result<AdmissionTicket> Admit(std::string_view method, std::string_view path) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;  // "{name}" for parameters.
    Handler handler;
    Admission admission;  // May be empty.
    bool is_public = false;
  };
  // The route added with `method` and exactly `pattern`; null when none was.
  Route* Find(std::string_view method, std::string_view pattern);
  // Whether `route`'s pattern matches the path's segments; fills `params` when it does.
  static bool Match(const Route& route, std::span<const std::string_view> segments,
                    PathParams& params);
  std::vector<Route> routes_;
};

}  // namespace sluice
