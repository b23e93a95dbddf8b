// `sluice serve`: load a model repository into the engine, serve it over HTTP until SIGTERM or
// SIGINT, then shut down without losing an accepted request.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grpc/grpc_server.h"
#include "http/http_server.h"
#include "http/responses_handlers.h"
#include "llm/kv_events.h"
#include "llm/load_llm.h"

namespace sluice {

struct ServeOptions {
  std::string model_repository = "models";  // Directory of models/<name>/config.yaml.
  std::vector<std::string> models;          // Only these; empty: every model in the repository.
  // One model's own directory (its config.yaml, or a language model's files, at the root, as
  // KServe mounts a model at /mnt/models), served under `model_name` instead of a repository.
  std::string model_dir;
  std::string model_name;  // With model_dir or source; empty: the directory's (source's) name.
  // One model as people name it (llm/files/model_source.h): a GGUF file, a model's folder, or a
  // Hugging Face model id in the local cache ("Qwen/Qwen2.5-0.5B-Instruct[:Q4_K_M]"), served
  // under that id, the file's stem or the folder's name. Instead of a repository.
  std::string source;
  HttpServerOptions http;
  // The KServe v2 gRPC service, on http.host at this port (0: an ephemeral one); off when unset.
  // Its API key and memory budget are the HTTP server's.
  std::optional<uint16_t> grpc_port;
  size_t grpc_max_message_bytes = 64u << 20;  // Larger gRPC messages fail (RESOURCE_EXHAUSTED).
  int decode_threads = 2;                     // Image decode pool for /predict and /predictions.
  std::string predict_model;  // Serves /predict bodies that name no model; empty: the first
                              // model with preprocess.image.
  // After SIGTERM/SIGINT, readiness (/v2/health/ready, gRPC ServerReady) fails at once while
  // requests are still taken and answered (with Connection: close) for this long, so a load
  // balancer or Kubernetes stops sending new ones before the listener closes. A second signal
  // ends the delay early.
  Seconds drain_delay{0};
  Seconds shutdown_grace{30};  // Then the longest wait for in-flight requests.
  bool model_control = false;  // Allows POST /v2/repository/models/{m}/load and /unload.
  // Language models on demand: a request naming one in the repository that is not loaded loads
  // it and waits for the load, load_wait at most (then, or with zero, 503 with Retry-After while
  // it loads); one loaded so is unloaded after keep_alive idle (zero: kept); at most
  // max_loaded_models language models at once (0: no limit), the least recently used idle one
  // unloaded to make room.
  bool autoload = true;
  Seconds keep_alive{300};
  Seconds load_wait{60};
  int max_loaded_models = 0;
  // Bytes the loaded language models may take together, by their estimates (weights and a full
  // KV cache); a load past it unloads least recently used idle ones first, or is refused. 0: no
  // limit but the machine's (a load that would not fit in the memory the machine, or the
  // container, has left is refused the same way, never left to the OOM killer).
  int64_t max_model_memory = 0;
  // KV events for cache-aware routers (llm/kv_events.h): off while kv_events.endpoint is empty.
  llm::KvEventsOptions kv_events;
  bool console = true;         // The browser console at / (console/console.h).
  // Chrome / Perfetto trace-event JSON of the HTTP requests' stages; off when empty. Finished
  // (valid JSON) when the server stops.
  std::string trace_file;
  double trace_sample_rate = 1;              // Fraction of requests traced, in [0, 1].
  size_t trace_max_bytes = size_t{1} << 30;  // Later requests are dropped from the trace.
  ResponseStoreOptions responses_store;      // The Responses API's stored responses' bounds.
};

// Serves until a termination signal. Prints "Sluice listening on http://HOST:PORT" to stdout once
// ready, after "Sluice gRPC listening on HOST:PORT" when gRPC is on. A model that fails to load is
// reported (not ready, with its error) while the others serve. Language models (config.json +
// model.safetensors) load through `llm_loader` and serve on /v1/...; one that fails to load stops
// the server from starting. Returns an error only when the server cannot start at all.
// `llm_sizer` estimates a language model's memory before its load (null: no check).
Status RunServer(const ServeOptions& options, const BackendLoader& loader,
                 const llm::LlmLoader& llm_loader = nullptr,
                 const llm::LlmSizer& llm_sizer = nullptr);

}  // namespace sluice
