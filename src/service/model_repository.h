// The model repository every front calls, as Triton's HTTP and gRPC fronts both call its core:
// the models a repository holds (tensor and language models), their loads, reloads and unloads,
// their states (READY, UNAVAILABLE, LOADING, UNLOADING) and load errors. HTTP's
// /v2/repository routes (http/repository_handlers.h), gRPC's RepositoryIndex and
// RepositoryModelLoad / Unload, the console and `sluice serve`'s start all go through it.
// Language models alike: a load (or reload) starts a new engine and serves it under the name in
// the generation service; an unload (or the reload) stops taking requests for the old one, which
// finishes those it accepted (streams run to their end) before it stops.
// Language models on demand (as Ollama and llama.cpp's router serve them): a request for one in
// the repository that is not loaded starts its load and waits for it (load_wait at most; then, or
// where waits are off, 503 with Retry-After: clients that retry, the OpenAI SDK among them, get
// their answer once it has loaded); one loaded so and idle for keep_alive (the server's, its
// config's or a request's) is unloaded; past max_loaded_models or the memory budget, the least
// recently used idle language model is unloaded before another loads.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
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
  // How a language model's directory loads (null: none served).
  llm::LlmLoader llm_loader;
  // Language models on demand (needs llm_loader): loaded by a request that names them.
  bool autoload = false;
  // An idle language model loaded by a request is unloaded after this long (zero: kept).
  std::chrono::milliseconds keep_alive{0};
  // A request for a language model that is loading waits this long at most for the load (zero:
  // answered 503 with Retry-After at once); max_load_waiters wait at once at most, the others
  // are answered at once.
  std::chrono::milliseconds load_wait{0};
  size_t max_load_waiters = 1024;
  // Language models loaded at once at most (0: no limit): a load past it unloads the least
  // recently used idle one first, or is refused (503) where every one is busy.
  int max_loaded_models = 0;
  // Sizes a language model before its load (null: no memory check). Loaded language models take
  // max_model_memory bytes together at most (0: no limit), and a load never more than the machine
  // has left: past either, least recently used idle ones are unloaded first, or the load is
  // refused (503) naming the sizes.
  llm::LlmSizer llm_sizer;
  int64_t max_model_memory = 0;
  // The memory the machine (or container) has left (null: AvailableMemoryBytes()).
  std::function<std::optional<int64_t>()> available_memory;
  // Called after a tensor model has loaded from `dir` (the server reads its labels.txt there).
  std::function<void(const std::string& name, const std::filesystem::path& dir)>
      on_tensor_model_loaded;
};

// Thread-safe. Loads and unloads run on `control_pool` (they take seconds and block on draining),
// never on a front's thread; a full pool answers 503.
class ModelRepository {
 public:
  ModelRepository(Engine& engine, V2Service& v2, ThreadPool& control_pool,
                  RepositoryOptions options);

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
  // is allowed is the front's to check. With `unless_pending`, nothing is done (and false
  // returned, `done` not called) where a load or unload of the model is queued or running.
  bool Change(const std::string& name, bool load, std::function<void(Status)> done,
              bool unless_pending = false);

  // The generation service's autoloader: nullopt where `name` is no language model of the
  // repository (its 404 stands); else kUnavailable with the wait a retry should leave, the load
  // started (or under way), or why the last load failed (for 30 s, then it is tried again).
  std::optional<Status> Autoload(const std::string& name);
  // The generation service's load waiter: true where a request may wait (false while stopping
  // or with max_load_waiters waiting). `resume` then runs once: on the control pool's thread when
  // the load of `name` has run, on the watcher's when load_wait has passed, in Stop(), or at once
  // where no load is pending (the one the request started has run already).
  bool WhenLoaded(const std::string& name, std::function<void()> resume);
  // The generation service's catalog: the repository's language models not loaded, each
  // "loading", "unloaded" or "error" (its last autoload failed, within its retry time).
  std::vector<std::pair<std::string, std::string>> Unloaded() const;
  // Starts the thread that unloads idle language models (keep_alive) and counts their use (for
  // max_loaded_models); Stop() ends it, and any later autoload, before the control pool goes.
  void Start();
  void Stop();
  ~ModelRepository();

  // Every model of the repository and every loaded one, with its state (READY, UNAVAILABLE,
  // LOADING, UNLOADING) and, where not ready, why; only the ready ones with `ready_only`. What
  // GET /v2/repository/index and gRPC's RepositoryIndex answer.
  struct IndexEntry {
    std::string name, version, state, reason;
  };
  std::vector<IndexEntry> IndexEntries(bool ready_only) const;

  // Whether the fronts may load and unload models (model control); each front checks it.
  bool model_control() const { return options_.model_control; }
  // The language models served, which the LLM fronts (OpenAI, Anthropic, Responses) find their
  // models in; the repository adds and removes them.
  llm::GenerationService& generation_service() { return llm_service_; }

 private:
  // Once a second: a language model's use seen since the last look restarts its idle time; one
  // loaded by a request and idle for keep_alive is unloaded.
  void Watch();
  // On the control pool, before a language model's load: unloads the least recently used idle
  // language model while max_loaded_models are loaded, or while `need` bytes do not fit
  // max_model_memory or the machine's memory (kUnavailable where every one is busy, or where the
  // model cannot fit at all).
  Status MakeRoom(const std::string& name, const llm::LlmMemoryEstimate& need);

  struct Use {
    int64_t seen = -1;  // Steps plus requests finished, at the last look.
    bool busy = false;  // Requests running or waiting, at the last look.
    std::chrono::steady_clock::time_point since;  // Its last use seen.
    bool on_demand = false;  // Loaded by a request: keep_alive applies.
  };

  // Runs the resumes of the requests waiting for `name` (all of them with an empty name, or
  // those whose wait has passed with `expired_only`), unlocked.
  void Resume(const std::string& name, bool expired_only);

  struct Waiter {
    std::chrono::steady_clock::time_point until;
    std::function<void()> resume;
  };

  struct Pending {
    std::string state;  // "LOADING" or "UNLOADING": the latest asked.
    int pending = 0;    // Loads and unloads of the model queued or running.
  };

  Engine& engine_;
  V2Service& v2_;
  // Declared first of what the repository holds: it goes last (its engines after the watcher).
  llm::GenerationService llm_service_{{}};
  ThreadPool& control_pool_;
  const RepositoryOptions options_;
  mutable Mutex mu_;
  std::map<std::string, Pending> changing_ GUARDED_BY(mu_);
  std::map<std::string, Use> use_ GUARDED_BY(mu_);  // Loaded language models.
  std::map<std::string, int64_t> model_bytes_ GUARDED_BY(mu_);  // Their estimates.
  struct Failure {
    std::chrono::steady_clock::time_point at;
    Status why;
  };
  std::map<std::string, Failure> failed_ GUARDED_BY(mu_);  // Language models' failed autoloads.
  std::map<std::string, std::vector<Waiter>> waiters_ GUARDED_BY(mu_);  // Requests, by model.
  size_t waiting_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  CondVar wake_;
  std::thread watcher_;
};

}  // namespace sluice
