// The KServe v2 inference service both fronts call: the REST routes (http/v2_handlers.h) and
// the gRPC service (grpc/grpc_server.h) parse and encode their own wire formats, and everything
// between is here: which models there are and why one failed to load, readiness, finding a model
// by name and version (with the errors both fronts answer alike), what a model's metadata says,
// and handing a parsed request to its model's scheduler. Neither front includes the other.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "codec/v2_codec.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "sluice/request.h"
#include "sluice/status.h"

namespace sluice {

// ServerMetadata's answer, over REST and gRPC.
inline constexpr std::string_view kServerName = "sluice";
inline constexpr std::string_view kServerVersion = "0.1.0";
inline constexpr std::string_view kServerExtensions[] = {"binary_tensor_data"};
// ModelMetadata's platform and the one version each model has.
inline constexpr std::string_view kModelPlatform = "pytorch_libtorch";
inline constexpr std::string_view kModelVersion = "1";

// When a request reached the server, and by when it must have run.
struct SubmitTiming {
  Clock::time_point arrived{};  // Its first bytes arrived (the epoch: not known).
  // Unset: the model's default timeout, counted from `arrived`.
  std::optional<Clock::time_point> deadline;
};

// Called once with a submitted request's result and the parsed request (its requested outputs,
// for the encoder), on an engine thread: it must return quickly (post the encoding elsewhere).
using V2Done = std::function<void(std::shared_ptr<const V2InferRequest>, InferResponse&&)>;

// Thread-safe.
class V2Service {
 public:
  explicit V2Service(Engine& engine, V2Limits limits = {}) : engine_(engine), limits_(limits) {}

  Engine& engine() const { return engine_; }
  const V2Limits& limits() const { return limits_; }

  // Records why a model of the repository failed to load, so lookups and metadata can say so.
  void SetLoadError(const std::string& model, std::string error);
  // Forgets a model's load error (it has loaded since).
  void ClearLoadError(const std::string& model);
  // The recorded load error of `model`; empty when none.
  std::string LoadError(const std::string& model) const;
  // Whether some model of the repository failed to load (the server is then not ready).
  bool HasLoadErrors() const;
  // From now on the server is not ready (it is shutting down), whatever its models.
  void SetShuttingDown() { shutting_down_.store(true); }
  // Ready: every model of the repository loaded, none failed since (its device), and not
  // shutting down.
  bool IsReady() const;

  // The scheduler of `name` at `version` ("" or "1"), or the error: kInvalidArgument for a name
  // that cannot be a model's, kNotFound for an unknown model or version, kUnavailable (naming the
  // reason) for a model that failed to load or whose device has failed since.
  Result<std::shared_ptr<ModelScheduler>> FindModel(std::string_view name,
                                                    std::string_view version) const;

  // Submits a parsed request to `scheduler` with its inputs (moved out of `request`) and its
  // timing; `done` gets the result once. The request's id (for Cancel), or the scheduler's refusal
  // (kUnavailable when full, with its retry-after; kDeadlineExceeded when its deadline passed
  // before it could be queued), in which case `done` is never called.
  static Result<RequestId> Submit(const std::shared_ptr<ModelScheduler>& scheduler,
                                  V2InferRequest request, SubmitTiming timing, V2Done done);

 private:
  Engine& engine_;
  const V2Limits limits_;
  mutable Mutex mu_;
  std::map<std::string, std::string, std::less<>> load_errors_ GUARDED_BY(mu_);
  std::atomic<bool> shutting_down_{false};
};

}  // namespace sluice
