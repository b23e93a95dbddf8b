// The KServe v2 service under both fronts.
#include "service/v2_service.h"

#include <fmt/format.h>

#include "common/json_writer.h"
#include "config/model_config.h"

namespace sluice {

void V2Service::SetLoadError(const std::string& model, std::string error) {
  MutexLock lock(mu_);
  load_errors_[model] = std::move(error);
}

void V2Service::ClearLoadError(const std::string& model) {
  MutexLock lock(mu_);
  load_errors_.erase(model);
}

std::string V2Service::LoadError(const std::string& model) const {
  MutexLock lock(mu_);
  auto it = load_errors_.find(model);
  return it == load_errors_.end() ? "" : it->second;
}

bool V2Service::HasLoadErrors() const {
  MutexLock lock(mu_);
  return !load_errors_.empty();
}

bool V2Service::IsReady() const {
  if (shutting_down_.load() || HasLoadErrors()) return false;
  for (const std::string& name : engine_.ModelNames()) {
    std::shared_ptr<ModelScheduler> scheduler = engine_.Find(name);
    if (scheduler && !scheduler->failure().ok()) return false;
  }
  return true;
}

Result<std::shared_ptr<ModelScheduler>> V2Service::FindModel(std::string_view name,
                                                             std::string_view version) const {
  if (!IsValidModelName(name)) {
    return Status::InvalidArgument(
        fmt::format("invalid model name {}: use letters, digits, '_', '.', '-'", JsonQuote(name)));
  }
  if (!version.empty() && version != kModelVersion) {
    return Status::NotFound(fmt::format("model '{}' has no version {}", name, JsonQuote(version)));
  }
  std::shared_ptr<ModelScheduler> scheduler = engine_.Find(std::string(name));
  if (!scheduler) {
    MutexLock lock(mu_);
    auto it = load_errors_.find(name);
    if (it != load_errors_.end()) {
      return Status::Unavailable(fmt::format("model '{}' failed to load: {}", name, it->second));
    }
    return Status::NotFound(fmt::format("unknown model '{}'", name));
  }
  if (Status failure = scheduler->failure(); !failure.ok()) return failure;
  return scheduler;
}

Result<RequestId> V2Service::Submit(const std::shared_ptr<ModelScheduler>& scheduler,
                                    V2InferRequest request, SubmitTiming timing, V2Done done) {
  auto infer = std::make_unique<InferRequest>();
  infer->inputs = std::move(request.inputs);
  infer->deadline = timing.deadline;
  infer->arrived = timing.arrived;
  auto meta = std::make_shared<const V2InferRequest>(std::move(request));
  infer->done = [meta = std::move(meta), done = std::move(done)](InferResponse&& response) {
    done(meta, std::move(response));
  };
  return scheduler->Submit(std::move(infer));
}

}  // namespace sluice
