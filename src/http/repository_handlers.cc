// Model repository extension handlers.
#include "http/repository_handlers.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <string>

#include "common/json_writer.h"

namespace sluice {

void RepositoryHandlers::AddRoutes(Router& router) {
  router.Post("/v2/repository/index",
              [this](const HttpRequest& r, const PathParams& p, Responder respond) {
                Index(r, p, std::move(respond));
              });
  router.Post("/v2/repository/models/{model}/load",
              [this](const HttpRequest& r, const PathParams& p, Responder respond) {
                Load(r, p, std::move(respond));
              });
  router.Post("/v2/repository/models/{model}/unload",
              [this](const HttpRequest& r, const PathParams& p, Responder respond) {
                Unload(r, p, std::move(respond));
              });
}

void RepositoryHandlers::Index(const HttpRequest& request, const PathParams&, Responder respond) {
  bool ready_only = false;
  if (!request.body.empty()) {
    thread_local simdjson::dom::parser parser;
    simdjson::dom::object body;
    if (parser.parse(request.body.data(), request.body.size()).get(body)) {
      respond(HttpResponse::Error(
          Status::InvalidArgument("the body must be a JSON object, e.g. {\"ready\": true}")));
      return;
    }
    simdjson::dom::element ready;
    if (!body["ready"].get(ready) && ready.get_bool().get(ready_only)) {
      respond(HttpResponse::Error(Status::InvalidArgument("\"ready\" must be true or false")));
      return;
    }
  }
  JsonWriter json;
  json.BeginArray();
  for (const ModelRepository::IndexEntry& entry : repository_.IndexEntries(ready_only)) {
    json.BeginObject().Field("name", entry.name).Field("version", entry.version);
    json.Field("state", entry.state);
    if (!entry.reason.empty()) json.Field("reason", entry.reason);
    json.EndObject();
  }
  json.EndArray();
  respond(HttpResponse::Json(200, json.str()));
}

void RepositoryHandlers::Load(const HttpRequest& request, const PathParams& params,
                              Responder respond) {
  Control(request, params, /*load=*/true, std::move(respond));
}

void RepositoryHandlers::Unload(const HttpRequest& request, const PathParams& params,
                                Responder respond) {
  Control(request, params, /*load=*/false, std::move(respond));
}

namespace {

// Triton's load and unload bodies, {"parameters": {...}}, as gRPC's messages carry them: an
// unload's boolean unload_dependents is taken (Sluice serves no ensembles, so there are none to
// unload); any other parameter (a load's config or files) is refused by name.
Status CheckControlBody(std::string_view body, bool load) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return Status::Ok();
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (parser.parse(body.data(), body.size()).get(root) != simdjson::SUCCESS) {
    return Status::InvalidArgument("the body must be a JSON object, e.g. {\"parameters\": {}}");
  }
  for (auto [key, value] : root) {
    if (key != "parameters") {
      return Status::InvalidArgument(fmt::format("'{}' is not supported", key));
    }
    simdjson::dom::object parameters;
    if (value.get(parameters) != simdjson::SUCCESS) {
      return Status::InvalidArgument("'parameters' must be an object");
    }
    for (auto [name, parameter] : parameters) {
      if (!load && name == "unload_dependents" && parameter.is_bool()) continue;
      return Status::InvalidArgument(fmt::format(
          "parameter '{}' is not supported: a model {} its folder in the repository", name,
          load ? "loads from" : "unloads as"));
    }
  }
  return Status::Ok();
}

}  // namespace

void RepositoryHandlers::Control(const HttpRequest& request, const PathParams& params, bool load,
                                 Responder respond) {
  if (!repository_.model_control()) {
    respond(HttpResponse::Json(
        403, R"({"error":"model control is disabled: start sluice serve with --model-control"})"));
    return;
  }
  if (Status body = CheckControlBody(request.body, load); !body.ok()) {
    return respond(HttpResponse::Error(body));
  }
  repository_.Change(std::string(params.Get("model")), load,
                     [respond = std::move(respond)](Status status) {
                       respond(status.ok() ? HttpResponse::Json(200, "{}")
                                           : HttpResponse::Error(status));
                     });
}

}  // namespace sluice
