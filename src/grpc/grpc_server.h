// The KServe v2 gRPC service (inference.GRPCInferenceService): the gRPC front of the v2 service
// (service/v2_service.h) that the REST routes also call; no thread waits on a request. ModelInfer
// runs on gRPC's asynchronous API: a completion queue's thread decodes the message, submits it to
// the model's scheduler and returns; the scheduler's completion fills the response and finishes the
// call. The other RPCs run on the callback API. A call the client cancels (or whose deadline
// passes) cancels its queued request, as a disconnect does over HTTP; the call's deadline is the
// request's deadline.
//
// Status codes follow the REST mapping: INVALID_ARGUMENT (400), NOT_FOUND (404),
// RESOURCE_EXHAUSTED (413), UNAVAILABLE with a "retry-after" trailer (503), DEADLINE_EXCEEDED
// (504), INTERNAL (500), UNAUTHENTICATED (401).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "service/v2_service.h"
#include "sluice/status.h"

namespace sluice {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";  // Address to bind; loopback unless told otherwise.
  uint16_t port = 0;               // 0: an ephemeral port (see GrpcServer::port()).
  // When set, every RPC but ServerLive and ServerReady needs the metadata
  // "authorization: Bearer <key>" or "x-api-key: <key>"; otherwise UNAUTHENTICATED.
  std::string api_key;
  // Largest request and response message; larger ones fail with RESOURCE_EXHAUSTED.
  size_t max_message_bytes = 64u << 20;
  // Threads polling the connections and running ModelInfer calls (one completion queue each).
  // One: decoding a call and submitting it is short next to the model's work, and on 2 cores a
  // second poller only competes with the model's workers.
  int threads = 1;
  // Memory gRPC's transport may hold for all calls together (its resource quota); 0: gRPC's own
  // default.
  size_t memory_budget_bytes = 0;
  // Triton's model control: RepositoryModelLoad and RepositoryModelUnload call it with the model's
  // name and whether to load, and it calls `done` once with the outcome, from any thread, before
  // the server shuts down (it waits for the calls). Unset: model control is off and both RPCs
  // fail with PERMISSION_DENIED.
  std::function<void(const std::string& name, bool load, std::function<void(Status)> done)>
      model_control;
  // Triton's RepositoryIndex: every model of the repository, with its state (READY, UNAVAILABLE,
  // LOADING, UNLOADING) and the reason it is not ready; only the ready ones when asked. Unset:
  // the RPC fails with UNIMPLEMENTED.
  struct IndexEntry {
    std::string name, version, state, reason;
  };
  std::function<std::vector<IndexEntry>(bool ready_only)> repository_index;
};

// Thread-safe. Start() once; Shutdown() once, from any thread.
class GrpcServer {
 public:
  // `service` outlives the server.
  GrpcServer(GrpcServerOptions options, V2Service& service);
  ~GrpcServer();  // Shutdown() with no grace.
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Binds and starts serving. kUnavailable when the address cannot be bound.
  Status Start();
  // The bound port.
  uint16_t port() const;
  // Stops taking calls, lets calls in flight finish for up to `grace`, then cancels the rest
  // (their queued requests are cancelled) and waits for them.
  void Shutdown(Clock::duration grace);

  // Prometheus series: sluice_grpc_requests_total{method,code} and
  // sluice_grpc_request_seconds{method} (call start to finish).
  std::string RenderMetrics() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
