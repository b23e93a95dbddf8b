// The handlers behind Sluice's routes: KServe v2 (health, metadata, infer) over the v2 service,
// per-model stats and Prometheus metrics. Each is a named member function; AddRoutes() puts them
// in the route table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codec/v2_codec.h"
#include "engine/engine.h"
#include "http/router.h"
#include "metrics/prometheus.h"
#include "service/v2_service.h"

namespace sluice {

// Thread-safe. The REST front of the v2 service (service/v2_service.h): JSON (and the binary
// extension's bytes) in and out.
class V2Handlers {
 public:
  // `http_stats` reads the server's counters for /metrics.
  V2Handlers(V2Service& service, std::function<HttpStats()> http_stats);

  void AddRoutes(Router& router);

  // More series for /metrics (the language models', gRPC's), appended after the engine's in the
  // order added. Call before the servers start.
  void AddExtraMetrics(std::function<std::string()> render) {
    extra_metrics_.push_back(std::move(render));
  }

  void ServerMetadata(const HttpRequest&, const PathParams&, Responder respond);
  void Live(const HttpRequest&, const PathParams&, Responder respond);
  void Ready(const HttpRequest&, const PathParams&, Responder respond);
  void ModelMetadata(const HttpRequest&, const PathParams& params, Responder respond);
  void ModelReady(const HttpRequest&, const PathParams& params, Responder respond);
  void Infer(const HttpRequest& request, const PathParams& params, Responder respond);
  void ModelStats(const HttpRequest&, const PathParams& params, Responder respond);
  void Metrics(const HttpRequest&, const PathParams&, Responder respond);

 private:
  // The scheduler of the model named in `params` (and version, when given), or the error.
  Result<std::shared_ptr<ModelScheduler>> FindModel(const PathParams& params) const {
    return service_.FindModel(params.Get("model"), params.Get("version"));
  }

  V2Service& service_;
  std::function<HttpStats()> http_stats_;
  std::vector<std::function<std::string()>> extra_metrics_;
};

}  // namespace sluice
