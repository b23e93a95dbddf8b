#include "service/model_repository.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "common/json_writer.h"
#include "common/system_info.h"
#include "config/model_config.h"
#include "llm/llm_config.h"

namespace sluice {

namespace {

// A failed autoload is answered with its error this long before a request tries it again.
constexpr auto kRetryFailedAfter = std::chrono::seconds(30);

bool IsTensorModelDir(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "config.yaml", ec) && !llm::IsLanguageModelDir(dir.string());
}

// The names of the directories in `repository` that `keep` accepts, sorted.
std::vector<std::string> ListModelDirs(const std::filesystem::path& repository,
                                       bool (*keep)(const std::filesystem::path&)) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(repository, ec)) {
    if (entry.is_directory(ec) && keep(entry.path())) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool IsLanguageModelPath(const std::filesystem::path& dir) {
  return llm::IsLanguageModelDir(dir.string());
}

}  // namespace

std::filesystem::path ModelLocations::DirOf(const std::string& name) const {
  return single_model_name.empty() ? repository / name : repository;
}

std::vector<std::string> ModelLocations::TensorModels() const {
  if (single_model_name.empty()) return ListModelDirs(repository, IsTensorModelDir);
  if (IsTensorModelDir(repository)) return {single_model_name};
  return {};
}

std::vector<std::string> ModelLocations::LanguageModels() const {
  if (single_model_name.empty()) return ListModelDirs(repository, IsLanguageModelPath);
  if (IsLanguageModelPath(repository)) return {single_model_name};
  return {};
}

ModelRepository::ModelRepository(Engine& engine, V2Service& v2, ThreadPool& control_pool,
                                 RepositoryOptions options)
    : engine_(engine), v2_(v2), control_pool_(control_pool), options_(std::move(options)) {
  // A model whose device failed is reloaded: on a GPU left unusable the load fails and says why
  // (the model UNAVAILABLE, the server not ready), on one that recovered it serves again.
  engine_.SetDeviceFailureHandler([this](const std::string& name, const Status&) {
    Change(
        name, /*load=*/true,
        [name](Status status) {
          if (status.ok()) spdlog::info("model '{}' reloaded after its device failed", name);
        },
        /*unless_pending=*/true);
  });
}

Status ModelRepository::LoadModel(const std::string& name) {
  if (!IsValidModelName(name)) {
    v2_.SetLoadError(name, "invalid model name");
    return Status::InvalidArgument(fmt::format("invalid model name {}", JsonQuote(name)));
  }
  if (!options_.models.single_model_name.empty() && name != options_.models.single_model_name) {
    return Status::NotFound(fmt::format("no model '{}': this server serves only '{}'", name,
                                        options_.models.single_model_name));
  }
  const std::filesystem::path dir = options_.models.DirOf(name);
  if (llm::IsLanguageModelDir(dir.string())) return LoadLanguageModel(name);
  ModelConfigOverrides overrides;
  if (!options_.models.single_model_name.empty()) overrides.name = name;
  auto config = LoadModelConfig(dir, overrides);
  if (!config.ok()) {
    std::error_code ec;
    if (!std::filesystem::exists(dir / "config.yaml", ec)) {
      return Status::NotFound(fmt::format("no model '{}' in the repository ({} has no config.yaml)",
                                          name, dir.string()));
    }
    spdlog::error("model '{}' failed to load: {}", name, config.status().message());
    v2_.SetLoadError(name, config.status().message());
    return config.status();
  }
  // A reload drains the old instance pool first: requests already queued are still answered.
  if (engine_.Find(name)) (void)engine_.RemoveModel(name);
  Status status = engine_.AddModel(*config);
  if (!status.ok()) {
    spdlog::error("model '{}' failed to load: {}", name, status.message());
    v2_.SetLoadError(name, status.message());
    return status;
  }
  v2_.ClearLoadError(name);
  if (options_.on_tensor_model_loaded) options_.on_tensor_model_loaded(name, dir);
  const InstancesConfig& instances = config->instances;
  fmt::print(
      "loaded model '{}': {}, max_batch_size {}, max_queue_delay {} us, precision {}{}\n", name,
      instances.share_cores
          ? fmt::format("{} instance(s) sharing {} core(s)", instances.count, instances.pool_cores)
          : fmt::format("{} instance(s) x {} thread(s)", instances.count, instances.threads),
      config->max_batch_size, config->dynamic_batching.max_queue_delay.count(),
      PrecisionName(config->precision),
      config->precision_auto_note.empty()
          ? ""
          : fmt::format(" (auto: {})", config->precision_auto_note));
  std::fflush(stdout);
  return Status::Ok();
}

Status ModelRepository::LoadLanguageModel(const std::string& name) {
  if (!options_.llm_loader) {
    return Status::InvalidArgument("this server cannot serve language models");
  }
  if (engine_.Find(name)) {
    return Status::InvalidArgument(fmt::format("'{}' is served as a tensor model", name));
  }
  const std::filesystem::path dir = options_.models.DirOf(name);
  llm::LlmMemoryEstimate need;
  if (options_.llm_sizer) {
    // A directory that cannot be sized cannot be loaded either: the load says why.
    auto sized = options_.llm_sizer(dir.string());
    if (sized.ok()) need = *sized;
  }
  if (Status room = MakeRoom(name, need); !room.ok()) {
    spdlog::error("language model '{}' not loaded: {}", name, room.message());
    return room;
  }
  auto loaded = options_.llm_loader(dir.string());
  if (!loaded.ok()) {
    spdlog::error("language model '{}' failed to load: {}", name, loaded.status().message());
    v2_.SetLoadError(name, loaded.status().message());
    return Status(loaded.status().code(),
                  fmt::format("language model '{}': {}", name, loaded.status().message()));
  }
  v2_.ClearLoadError(name);
  {
    MutexLock lock(mu_);
    model_bytes_[name] = need.total();
  }
  const llm::StepModel& model = (*loaded)->model();
  const std::string cache = model.weights_cache();
  fmt::print(
      "language model '{}' ready: {} slots x {} tokens, weights {}, kernels {}, KV cache {} "
      "({} MiB){}{}\n",
      name, model.slots(), model.context_length(), model.weight_formats(), model.kernel_paths(),
      model.kv_cache_format(), model.kv_cache_bytes() >> 20, cache.empty() ? "" : ", ", cache);
  // New requests go to the new engine at once; the old one finishes those it accepted.
  std::shared_ptr<llm::LlmEngine> old = llm_service_.Add(name, std::move(*loaded));
  fmt::print("{} language model '{}'\n", old ? "reloaded" : "loaded", name);
  std::fflush(stdout);
  if (old) old->Stop();
  return Status::Ok();
}

std::vector<std::pair<std::string, std::string>> ModelRepository::Unloaded() const {
  std::vector<std::pair<std::string, std::string>> out;
  const auto served = llm_service_.models();
  const std::vector<std::string> names = options_.models.LanguageModels();
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  for (const std::string& name : names) {
    if (served.count(name) > 0) continue;
    auto changing = changing_.find(name);
    auto failed = failed_.find(name);
    if (changing != changing_.end() && changing->second.state == "LOADING") {
      out.emplace_back(name, "loading");
    } else if (failed != failed_.end() && now - failed->second.at < kRetryFailedAfter) {
      out.emplace_back(name, "error");
    } else {
      out.emplace_back(name, "unloaded");
    }
  }
  return out;
}

Status ModelRepository::UnloadLanguageModel(const std::string& name) {
  std::shared_ptr<llm::LlmEngine> engine = llm_service_.Remove(name);
  if (!engine) return Status::NotFound(fmt::format("model '{}' is not loaded", name));
  {
    MutexLock lock(mu_);
    use_.erase(name);
    model_bytes_.erase(name);
  }
  engine->Stop();  // Its accepted requests run to their end first.
  fmt::print("unloaded language model '{}'\n", name);
  std::fflush(stdout);
  return Status::Ok();
}

ModelRepository::~ModelRepository() { Stop(); }

void ModelRepository::Start() {
  if (options_.autoload) {
    llm_service_.SetAutoloader([this](const std::string& name) { return Autoload(name); });
    llm_service_.SetCatalog([this] { return Unloaded(); });
    if (options_.load_wait.count() > 0) {
      llm_service_.SetLoadWaiter([this](const std::string& name, std::function<void()> resume) {
        return WhenLoaded(name, std::move(resume));
      });
    }
  }
  // Idle models' keep_alive (the server's, a model's config's or a request's), waits that pass.
  watcher_ = std::thread([this] { Watch(); });
}

void ModelRepository::Stop() {
  engine_.SetDeviceFailureHandler({});
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (watcher_.joinable()) watcher_.join();
  Resume("", /*expired_only=*/false);  // Each is answered that the server is shutting down.
}

bool ModelRepository::WhenLoaded(const std::string& name, std::function<void()> resume) {
  {
    MutexLock lock(mu_);
    if (stopping_ || waiting_ >= options_.max_load_waiters) return false;
    auto pending = changing_.find(name);
    if (pending != changing_.end()) {
      if (pending->second.state != "LOADING") return false;
      waiters_[name].push_back(
          Waiter{std::chrono::steady_clock::now() + options_.load_wait, std::move(resume)});
      ++waiting_;
      return true;
    }
  }
  // No load pending: the one the request started may have run already (a load that fails at
  // once does), so the request is run again now and finds the model, or why it is not there.
  resume();
  return true;
}

void ModelRepository::Resume(const std::string& name, bool expired_only) {
  std::vector<std::function<void()>> resumes;
  {
    MutexLock lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (!name.empty() && it->first != name) {
        ++it;
        continue;
      }
      auto& list = it->second;
      auto keep = std::stable_partition(
          list.begin(), list.end(), [&](const Waiter& w) { return expired_only && w.until > now; });
      for (auto w = keep; w != list.end(); ++w) resumes.push_back(std::move(w->resume));
      waiting_ -= static_cast<size_t>(list.end() - keep);
      list.erase(keep, list.end());
      it = list.empty() ? waiters_.erase(it) : std::next(it);
    }
  }
  for (auto& resume : resumes) resume();
}

std::optional<Status> ModelRepository::Autoload(const std::string& name) {
  if (!IsValidModelName(name) || engine_.Find(name)) return std::nullopt;
  if (!options_.models.single_model_name.empty() && name != options_.models.single_model_name) {
    return std::nullopt;
  }
  if (!llm::IsLanguageModelDir(options_.models.DirOf(name).string())) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(mu_);
    if (stopping_) return Status::Unavailable("the server is shutting down");
    auto failed = failed_.find(name);
    // A load refused for want of room where models are busy is tried again sooner.
    const auto window =
        failed == failed_.end() || failed->second.why.retry_after_seconds() <= 0
            ? kRetryFailedAfter
            : std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(failed->second.why.retry_after_seconds()));
    if (failed != failed_.end() && now - failed->second.at < window) {
      const double wait = std::chrono::duration<double>(window - (now - failed->second.at)).count();
      std::string why = failed->second.why.message();
      const std::string prefix = fmt::format("language model '{}': ", name);
      if (why.starts_with(prefix)) why.erase(0, prefix.size());
      return Status::Unavailable(fmt::format("language model '{}' failed to load: {}", name, why))
          .WithRetryAfter(wait);
    }
  }
  const Status loading =
      Status::Unavailable(fmt::format("language model '{}' is loading", name)).WithRetryAfter(2);
  // A load asked for already (by a request or the repository API) answers when it has run.
  const bool started = Change(
      name, /*load=*/true,
      [this, name](Status status) {
        MutexLock lock(mu_);
        if (status.ok()) {
          failed_.erase(name);
          Use& use = use_[name];
          use.on_demand = true;
          use.since = std::chrono::steady_clock::now();
        } else {
          failed_[name] = Failure{std::chrono::steady_clock::now(), status};
        }
      },
      /*unless_pending=*/true);
  if (!started) return loading;
  fmt::print("loading language model '{}' for a request\n", name);
  std::fflush(stdout);
  return loading;
}

namespace {

// "1.25 GiB", or "3.40 MiB" below a GiB.
std::string Size(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= (1 << 30) ? fmt::format("{:.2f} GiB", b / (1 << 30))
                        : fmt::format("{:.2f} MiB", b / (1 << 20));
}

}  // namespace

Status ModelRepository::MakeRoom(const std::string& name, const llm::LlmMemoryEstimate& need) {
  const int64_t bytes = need.total();
  const std::string sizes = fmt::format("'{}' needs about {} (weights {}, KV cache {})", name,
                                        Size(bytes), Size(need.weights), Size(need.kv_cache));
  if (options_.max_model_memory > 0 && bytes > options_.max_model_memory) {
    return Status::Unavailable(
        fmt::format("{}: more than --max-model-memory {}", sizes, Size(options_.max_model_memory)));
  }
  int64_t freed = 0;  // Estimates of the models unloaded here (the machine's figure may lag).
  for (;;) {
    const auto models = llm_service_.models();
    const bool reload = models.count(name) > 0;
    const bool over_count = options_.max_loaded_models > 0 && !reload &&
                            static_cast<int>(models.size()) >= options_.max_loaded_models;
    int64_t held = 0;  // By the other loaded language models.
    {
      MutexLock lock(mu_);
      for (const auto& [loaded, engine] : models) {
        auto it = model_bytes_.find(loaded);
        if (loaded != name && it != model_bytes_.end()) held += it->second;
      }
    }
    const bool over_budget =
        options_.max_model_memory > 0 && bytes > 0 && held + bytes > options_.max_model_memory;
    std::optional<int64_t> available;
    if (bytes > 0) {
      available = options_.available_memory ? options_.available_memory() : AvailableMemoryBytes();
    }
    const bool over_machine = available && bytes > *available + freed;
    if (!over_count && !over_budget && !over_machine) return Status::Ok();
    if (over_machine && bytes > *available + freed + held) {
      // Not even with every other model unloaded: none is.
      return Status::Unavailable(
          fmt::format("{}; the machine has {} left", sizes, Size(*available + freed)));
    }

    std::string victim;
    std::chrono::steady_clock::time_point oldest = std::chrono::steady_clock::time_point::max();
    for (const auto& [loaded, engine] : models) {
      if (loaded == name) continue;
      const llm::LlmStats stats = engine->stats();
      if (stats.slots_busy + stats.waiting > 0) continue;
      MutexLock lock(mu_);
      auto use = use_.find(loaded);
      const auto since =
          use != use_.end() ? use->second.since : std::chrono::steady_clock::time_point::min();
      if (victim.empty() || since < oldest) {
        victim = loaded;
        oldest = since;
      }
    }
    if (victim.empty()) {
      if (over_count) {
        return Status::Unavailable(
                   fmt::format("{} language models are loaded (--max-loaded-models) and "
                               "every one is busy; '{}' cannot load now",
                               models.size(), name))
            .WithRetryAfter(5);
      }
      if (over_budget) {
        return Status::Unavailable(fmt::format("{}; the loaded language models hold {} of "
                                               "--max-model-memory {} and every one is busy",
                                               sizes, Size(held), Size(options_.max_model_memory)))
            .WithRetryAfter(5);
      }
      return Status::Unavailable(fmt::format("{}; the machine has {} left and every loaded "
                                             "language model is busy",
                                             sizes, Size(*available + freed)))
          .WithRetryAfter(5);
    }
    const char* why = over_count    ? "--max-loaded-models"
                      : over_budget ? "--max-model-memory"
                                    : "the machine's memory";
    fmt::print("unloading language model '{}', the least recently used, to load '{}' ({})\n",
               victim, name, why);
    std::fflush(stdout);
    int64_t victim_bytes = 0;
    {
      MutexLock lock(mu_);
      auto it = model_bytes_.find(victim);
      if (it != model_bytes_.end()) victim_bytes = it->second;
    }
    SLUICE_RETURN_IF_ERROR(UnloadLanguageModel(victim));
    freed += victim_bytes;
  }
}

void ModelRepository::Watch() {
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      wake_.WaitFor(lock, std::chrono::seconds(1));
      if (stopping_) return;
    }
    Resume("", /*expired_only=*/true);  // Their wait passed: 503 with Retry-After.
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, std::chrono::milliseconds>> expired;
    for (const auto& [name, engine] : llm_service_.models()) {
      const llm::LlmStats stats = engine->stats();
      const int64_t seen = stats.steps + stats.requests_finished;
      const bool busy = stats.slots_busy + stats.waiting > 0;
      MutexLock lock(mu_);
      Use& use = use_[name];
      if (use.seen != seen || busy || use.busy) use.since = now;
      use.seen = seen;
      use.busy = busy;
      // A request's keep_alive, else the model's config's (negative: kept), else the server's for
      // a model loaded by a request.
      std::optional<std::chrono::milliseconds> keep = engine->keep_alive();
      if (!keep) keep = engine->config().keep_alive;
      if (!keep && use.on_demand && options_.keep_alive.count() > 0) keep = options_.keep_alive;
      if (keep && keep->count() >= 0 && !busy && now - use.since >= *keep) {
        expired.emplace_back(name, *keep);
      }
    }
    for (const auto& [idle, keep] : expired) {
      const std::string name = idle;  // A lambda takes a copy, not a structured binding.
      const bool started = Change(
          name, /*load=*/false,
          [name](Status status) {
            if (!status.ok()) {
              spdlog::warn("idle model '{}' not unloaded: {}", name, status.message());
            }
          },
          /*unless_pending=*/true);
      if (started) {
        fmt::print("unloading language model '{}': idle for its keep_alive ({} s)\n", name,
                   std::chrono::duration<double>(keep).count());
        std::fflush(stdout);
      }
    }
  }
}

std::vector<ModelRepository::IndexEntry> ModelRepository::IndexEntries(bool ready_only) const {
  // Every model directory of the repository, and every loaded model (one may have been removed
  // from disk since it loaded).
  std::set<std::string> names;
  for (const std::string& name : options_.models.TensorModels()) {
    if (IsValidModelName(name)) names.insert(name);
  }
  for (const std::string& name : engine_.ModelNames()) names.insert(name);
  std::set<std::string> on_demand;  // The repository's language models, where requests load them.
  for (const std::string& name : options_.models.LanguageModels()) {
    names.insert(name);
    if (options_.autoload) on_demand.insert(name);
  }
  std::set<std::string> language;  // Served now.
  for (const auto& [name, engine] : llm_service_.models()) language.insert(name);
  names.insert(language.begin(), language.end());
  std::map<std::string, std::string> changing;
  std::map<std::string, std::string> failed;  // Autoloads refused or failed, within their wait.
  {
    MutexLock lock(mu_);
    for (const auto& [name, change] : changing_) changing.emplace(name, change.state);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [name, failure] : failed_) {
      if (now - failure.at < kRetryFailedAfter) failed.emplace(name, failure.why.message());
    }
  }
  std::vector<IndexEntry> out;
  for (const std::string& name : names) {
    std::shared_ptr<ModelScheduler> tensor_model = engine_.Find(name);
    const Status failure = tensor_model ? tensor_model->failure() : Status::Ok();
    const bool ready = (tensor_model != nullptr && failure.ok()) || language.count(name) > 0;
    if (ready_only && !ready) continue;
    IndexEntry& entry = out.emplace_back();
    entry.name = name;
    entry.version = "1";
    // A load or unload under way (Triton's LOADING and UNLOADING) names it; else whether it serves.
    auto change = changing.find(name);
    entry.state = change != changing.end() ? change->second : ready ? "READY" : "UNAVAILABLE";
    if (!ready) {
      std::string error = failure.ok() ? v2_.LoadError(name) : failure.message();
      if (auto refused = failed.find(name); refused != failed.end()) error = refused->second;
      entry.reason = !error.empty()          ? error
                     : on_demand.count(name) ? "not loaded; its first request loads it"
                                             : "not loaded";
    }
  }
  return out;
}

Status ModelRepository::UnloadModel(const std::string& name) {
  if (!engine_.Find(name)) {
    Status unloaded = UnloadLanguageModel(name);
    if (unloaded.code() != StatusCode::kNotFound) return unloaded;
  }
  Status status = engine_.RemoveModel(name);
  if (status.ok()) fmt::print("unloaded model '{}'\n", name);
  return status.ok() || status.code() != StatusCode::kNotFound
             ? status
             : Status::NotFound(fmt::format("model '{}' is not loaded", name));
}

bool ModelRepository::Change(const std::string& name, bool load, std::function<void(Status)> done,
                             bool unless_pending) {
  if (!IsValidModelName(name)) {
    done(Status::InvalidArgument(fmt::format("invalid model name {}", JsonQuote(name))));
    return true;
  }
  {
    MutexLock lock(mu_);
    if (unless_pending && changing_.count(name) > 0) return false;
    Pending& pending = changing_[name];
    pending.state = load ? "LOADING" : "UNLOADING";
    ++pending.pending;
  }
  auto finished = [this, name] {
    MutexLock lock(mu_);
    auto it = changing_.find(name);
    if (it != changing_.end() && --it->second.pending == 0) changing_.erase(it);
  };
  // `done` is shared so that it stays here if the pool refuses the task.
  auto shared_done = std::make_shared<std::function<void(Status)>>(std::move(done));
  bool queued = control_pool_.TrySubmit([this, name, load, shared_done, finished] {
    Status status = load ? LoadModel(name) : UnloadModel(name);
    finished();
    (*shared_done)(std::move(status));
    // Requests waiting for the model find it loaded, or why it is not, once nothing is pending.
    bool idle;
    {
      MutexLock lock(mu_);
      idle = changing_.count(name) == 0;
    }
    if (idle) Resume(name, /*expired_only=*/false);
  });
  if (!queued) {
    finished();
    (*shared_done)(Status::Unavailable("too many model loads and unloads waiting; retry later"));
  }
  return true;
}

}  // namespace sluice
