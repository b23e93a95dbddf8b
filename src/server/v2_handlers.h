// The handlers behind Sluice's routes: KServe v2 (health, metadata, infer), per-model stats and
// Prometheus metrics. Each is a named member function; AddRoutes() puts them in the route table.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codec/v2_codec.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "metrics/prometheus.h"
#include "server/router.h"

namespace sluice {

// The version ServerMetadata reports, over REST and gRPC.
inline constexpr std::string_view kServerVersion = "0.1.0";

// Thread-safe.
class V2Handlers {
 public:
  // `http_stats` reads the server's counters for /metrics.
  V2Handlers(Engine& engine, std::function<HttpStats()> http_stats, V2Limits limits = {});

  // Records why a model of the repository failed to load, so its metadata can say so.
  void SetLoadError(const std::string& model, std::string error);
  // Forgets a model's load error (it has loaded since).
  void ClearLoadError(const std::string& model);
  // The recorded load error of `model`; empty when none.
  std::string LoadError(const std::string& model) const;

  void AddRoutes(Router& router);
  // Whether some model of the repository failed to load (the server is then not ready).
  bool HasLoadErrors() const;
  // From now on the server is not ready (it is shutting down), whatever its models.
  void SetShuttingDown() { shutting_down_.store(true); }
  // Ready: every model of the repository loaded, and not shutting down.
  bool IsReady() const { return !shutting_down_.load() && !HasLoadErrors(); }

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
  Result<std::shared_ptr<ModelScheduler>> FindModel(const PathParams& params) const;

  Engine& engine_;
  std::function<HttpStats()> http_stats_;
  std::vector<std::function<std::string()>> extra_metrics_;
  const V2Limits limits_;
  mutable Mutex mu_;
  std::map<std::string, std::string> load_errors_ GUARDED_BY(mu_);
  std::atomic<bool> shutting_down_{false};
};

}  // namespace sluice
