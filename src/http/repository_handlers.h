// The KServe v2 model repository extension over HTTP, on the model repository
// (service/model_repository.h): list the repository's models with their state, and (only when
// model control is enabled) load, reload and unload models while the server runs.
//   POST /v2/repository/index                  [{"name", "version", "state", "reason"}, ...]
//                                              (state READY, UNAVAILABLE, LOADING or UNLOADING)
//   POST /v2/repository/models/{model}/load    loads models/<model> (reloads it when loaded)
//   POST /v2/repository/models/{model}/unload  drains the model's queue, then removes it
// With model control off, load and unload answer 403: a server exposed to clients cannot have its
// models swapped by them unless its operator says so.
#pragma once

#include "http/router.h"
#include "service/model_repository.h"

namespace sluice {

// Thread-safe, as the repository is.
class RepositoryHandlers {
 public:
  explicit RepositoryHandlers(ModelRepository& repository) : repository_(repository) {}

  void AddRoutes(Router& router);
  void Index(const HttpRequest& request, const PathParams&, Responder respond);
  void Load(const HttpRequest&, const PathParams& params, Responder respond);
  void Unload(const HttpRequest&, const PathParams& params, Responder respond);

 private:
  // 403 when model control is off, 400 for a body's parameter not taken; otherwise the
  // repository's Change, answered with its status.
  void Control(const HttpRequest& request, const PathParams& params, bool load,
               Responder respond);

  ModelRepository& repository_;
};

}  // namespace sluice
