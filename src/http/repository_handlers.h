// The KServe v2 model repository extension: list the repository's models with their state, and
// (only when model control is enabled) load, reload and unload models while the server runs.
//   POST /v2/repository/index                  [{"name", "version", "state", "reason"}, ...]
//                                              (state READY, UNAVAILABLE, LOADING or UNLOADING)
//   POST /v2/repository/models/{model}/load    loads models/<model> (reloads it when loaded)
//   POST /v2/repository/models/{model}/unload  drains the model's queue, then removes it
// Language models alike: a load (or reload) starts a new engine and serves it under the name; an
// unload (or the reload) stops taking requests for the old one, which finishes those it accepted
// (streams run to their end) before it stops.
// With model control off, load and unload answer 403: a server exposed to clients cannot have its
// models swapped by them unless its operator says so.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "http/predict_handlers.h"
#include "http/router.h"
#include "llm/generation_service.h"
#include "llm/load_llm.h"
#include "service/v2_service.h"

namespace sluice {

// Where the served models' directories are: a repository holding <name>/ for each model, or one
// model's own directory (its config.yaml at the root) served under a given name, as KServe mounts
// a model at /mnt/models.
struct ModelLocations {
  std::filesystem::path repository;  // The repository, or the single model's directory.
  std::string single_model_name;     // Set: `repository` is this one model's directory.

  // The directory model `name` loads from (for a single model, whatever the name).
  std::filesystem::path DirOf(const std::string& name) const;
  // Tensor models (a config.yaml, not a language model), sorted.
  std::vector<std::string> TensorModels() const;
  // Language models (config.json + model.safetensors), sorted.
  std::vector<std::string> LanguageModels() const;
};

struct RepositoryOptions {
  ModelLocations models;
  bool model_control = false;  // Load and unload routes allowed; off: 403.
  // Language models: how a directory loads (null: none served), and where they are served.
  llm::LlmLoader llm_loader;
  llm::GenerationService* llm_service = nullptr;
};

// Thread-safe. Loads and unloads run on `control_pool` (they take seconds and block on draining),
// never on an I/O thread; a full pool answers 503.
class RepositoryHandlers {
 public:
  RepositoryHandlers(Engine& engine, V2Service& v2, PredictHandlers& predict,
                     ThreadPool& control_pool, RepositoryOptions options);

  // Loads `name` from the repository (reloading it when already loaded) and records the outcome
  // where /v2/models/{name} reports it. Blocks for the load; the caller picks the thread.
  Status LoadModel(const std::string& name);
  // A language model's load, reload (the old engine finishes what it accepted) and unload.
  Status LoadLanguageModel(const std::string& name);
  Status UnloadLanguageModel(const std::string& name);
  // Unloads `name`, a tensor or language model (kNotFound where it is not loaded).
  Status UnloadModel(const std::string& name);

  // Model control as every front asks for it (the HTTP routes, gRPC's RepositoryModelLoad and
  // RepositoryModelUnload): loads (or reloads) or unloads `name` on the control pool and calls
  // `done` with the outcome, from the pool's thread or, for a bad name or a full pool (503), this
  // one. The index shows the model LOADING or UNLOADING until it has run. Whether model control
  // is allowed is the front's to check.
  void Change(const std::string& name, bool load, std::function<void(Status)> done);

  void AddRoutes(Router& router);
  void Index(const HttpRequest& request, const PathParams&, Responder respond);
  void Load(const HttpRequest&, const PathParams& params, Responder respond);
  void Unload(const HttpRequest&, const PathParams& params, Responder respond);

 private:
  // 403 when model control is off, 400 for a body's parameter not taken; otherwise Change,
  // answered with its status.
  void Control(const HttpRequest& request, const PathParams& params, bool load,
               Responder respond);

  struct Pending {
    std::string state;  // "LOADING" or "UNLOADING": the latest asked.
    int pending = 0;    // Loads and unloads of the model queued or running.
  };

  Engine& engine_;
  V2Service& v2_;
  PredictHandlers& predict_;
  ThreadPool& control_pool_;
  const RepositoryOptions options_;
  mutable Mutex mu_;
  std::map<std::string, Pending> changing_ GUARDED_BY(mu_);
};

}  // namespace sluice
