// Model repository extension handlers.
#include "server/repository_handlers.h"

#include <fmt/format.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "common/json_writer.h"
#include "llm/llm_config.h"

namespace sluice {

namespace {

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

RepositoryHandlers::RepositoryHandlers(Engine& engine, V2Service& v2, PredictHandlers& predict,
                                       ThreadPool& control_pool, RepositoryOptions options)
    : engine_(engine),
      v2_(v2),
      predict_(predict),
      control_pool_(control_pool),
      options_(std::move(options)) {}

Status RepositoryHandlers::LoadModel(const std::string& name) {
  if (!IsValidModelName(name)) {
    v2_.SetLoadError(name, "invalid model name");
    return Status::InvalidArgument(fmt::format("invalid model name {}", JsonQuote(name)));
  }
  if (!options_.models.single_model_name.empty() && name != options_.models.single_model_name) {
    return Status::NotFound(fmt::format("no model '{}': this server serves only '{}'", name,
                                        options_.models.single_model_name));
  }
  const std::filesystem::path dir = options_.models.DirOf(name);
  ModelConfigOverrides overrides;
  if (!options_.models.single_model_name.empty()) overrides.name = name;
  auto config = LoadModelConfig(dir, overrides);
  if (!config.ok()) {
    std::error_code ec;
    if (!std::filesystem::exists(dir / "config.yaml", ec)) {
      return Status::NotFound(fmt::format("no model '{}' in the repository ({} has no config.yaml)",
                                          name, dir.string()));
    }
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
  predict_.SetLabels(name, LoadLabels((dir / "labels.txt").string()));
  fmt::print(
      "loaded model '{}': {} instance(s) x {} thread(s), max_batch_size {}, "
      "max_queue_delay {} us\n",
      name, config->instances.count, config->instances.threads, config->max_batch_size,
      config->dynamic_batching.max_queue_delay.count());
  std::fflush(stdout);
  return Status::Ok();
}

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
  // Every model directory of the repository, and every loaded model (one may have been removed
  // from disk since it loaded).
  std::set<std::string> names;
  for (const std::string& name : options_.models.TensorModels()) {
    if (IsValidModelName(name)) names.insert(name);
  }
  for (const std::string& name : engine_.ModelNames()) names.insert(name);
  JsonWriter json;
  json.BeginArray();
  for (const std::string& name : names) {
    const bool ready = engine_.Find(name) != nullptr;
    if (ready_only && !ready) continue;
    json.BeginObject().Field("name", name).Field("version", "1");
    json.Field("state", ready ? "READY" : "UNAVAILABLE");
    if (!ready) {
      std::string error = v2_.LoadError(name);
      json.Field("reason", error.empty() ? "not loaded" : error);
    }
    json.EndObject();
  }
  json.EndArray();
  respond(HttpResponse::Json(200, json.str()));
}

void RepositoryHandlers::Load(const HttpRequest&, const PathParams& params, Responder respond) {
  Control(
      params, [this](const std::string& name) { return LoadModel(name); }, std::move(respond));
}

void RepositoryHandlers::Unload(const HttpRequest&, const PathParams& params, Responder respond) {
  Control(
      params,
      [this](const std::string& name) {
        Status status = engine_.RemoveModel(name);
        if (status.ok()) fmt::print("unloaded model '{}'\n", name);
        return status.ok() || status.code() != StatusCode::kNotFound
                   ? status
                   : Status::NotFound(fmt::format("model '{}' is not loaded", name));
      },
      std::move(respond));
}

void RepositoryHandlers::Control(const PathParams& params,
                                 std::function<Status(const std::string&)> work,
                                 Responder respond) {
  if (!options_.model_control) {
    respond(HttpResponse::Json(
        403, R"({"error":"model control is disabled: start sluice serve with --model-control"})"));
    return;
  }
  std::string name(params.Get("model"));
  if (!IsValidModelName(name)) {
    respond(HttpResponse::Error(
        Status::InvalidArgument(fmt::format("invalid model name {}", JsonQuote(name)))));
    return;
  }
  // The responder is shared so that it stays here if the pool refuses the task.
  auto shared_respond = std::make_shared<Responder>(std::move(respond));
  bool queued = control_pool_.TrySubmit([name, work = std::move(work), shared_respond] {
    Status status = work(name);
    if (status.ok()) {
      (*shared_respond)(HttpResponse::Json(200, "{}"));
    } else {
      (*shared_respond)(HttpResponse::Error(status));
    }
  });
  if (!queued) {
    (*shared_respond)(HttpResponse::Error(
        Status::Unavailable("too many model loads and unloads waiting; retry later")));
  }
}

}  // namespace sluice
