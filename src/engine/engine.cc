// Model registry.
#include "engine/engine.h"

#include <fmt/format.h>

#include <utility>

namespace sluice {

Result<std::vector<std::shared_ptr<BackendInstance>>> CreateInstances(const ModelConfig& config,
                                                                      Backend& backend) {
  std::vector<std::shared_ptr<BackendInstance>> instances;
  for (int i = 0; i < config.instances.workers(); ++i) {
    auto instance = backend.CreateInstance(i);
    if (!instance.ok()) return instance.status();
    instances.push_back(std::move(*instance));
  }
  return instances;
}

Engine::Engine(BackendLoader loader, Clock& clock) : loader_(std::move(loader)), clock_(clock) {}

Engine::~Engine() { Stop(); }

Status Engine::AddModel(const ModelConfig& config) {
  {
    MutexLock lock(mu_);
    if (models_.count(config.name)) {
      return Status::InvalidArgument(fmt::format("model '{}' is already loaded", config.name));
    }
  }
  // Loading takes seconds: done without the lock, so other models keep serving.
  auto backend = loader_(config);
  if (!backend.ok()) return backend.status();
  const ModelConfig loaded = LoadedConfig(config, **backend);
  auto instances = CreateInstances(loaded, **backend);
  if (!instances.ok()) return instances.status();
  // Workers report from their threads; the engine outlives them (Stop() joins them).
  auto on_failure = [this, name = config.name](const Status& why) {
    DeviceFailureHandler handler;
    {
      MutexLock lock(mu_);
      handler = on_device_failure_;
    }
    if (handler) handler(name, why);
  };
  auto scheduler = ModelScheduler::Start(loaded, std::move(*instances), clock_, on_failure);
  if (!scheduler.ok()) return scheduler.status();
  (*scheduler)->SeedCosts((*backend)->load_report().warmup_batch_seconds);
  MutexLock lock(mu_);
  auto [it, inserted] = models_.emplace(config.name, std::move(*scheduler));
  if (!inserted) {
    return Status::InvalidArgument(fmt::format("model '{}' is already loaded", config.name));
  }
  return Status::Ok();
}

Status Engine::RemoveModel(const std::string& name) {
  std::shared_ptr<ModelScheduler> scheduler;
  {
    MutexLock lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) return Status::NotFound(fmt::format("model '{}' is not loaded", name));
    scheduler = std::move(it->second);
    models_.erase(it);
  }
  scheduler->Stop(StopMode::kDrain);
  return Status::Ok();
}

std::shared_ptr<ModelScheduler> Engine::Find(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

Result<RequestId> Engine::Submit(const std::string& model, std::unique_ptr<InferRequest> request) {
  std::shared_ptr<ModelScheduler> scheduler = Find(model);
  if (!scheduler) return Status::NotFound(fmt::format("model '{}' is not loaded", model));
  return scheduler->Submit(std::move(request));
}

void Engine::SetDeviceFailureHandler(DeviceFailureHandler handler) {
  MutexLock lock(mu_);
  on_device_failure_ = std::move(handler);
}

ModelConfig LoadedConfig(const ModelConfig& config, const Backend& backend) {
  ModelConfig loaded = config;
  if (loaded.instances.on_gpu() && loaded.instances.gpus.empty()) {
    loaded.instances.gpus = backend.gpus();
  }
  return loaded;
}

std::vector<std::string> Engine::ModelNames() const {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, scheduler] : models_) names.push_back(name);
  return names;
}

void Engine::Stop(StopMode mode) {
  std::map<std::string, std::shared_ptr<ModelScheduler>> models;
  {
    MutexLock lock(mu_);
    models.swap(models_);
  }
  for (auto& [name, scheduler] : models) scheduler->Stop(mode);
}

}  // namespace sluice
