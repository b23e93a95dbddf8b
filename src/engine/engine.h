// The model registry: one ModelScheduler per loaded model, found by name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "config/model_config.h"
#include "engine/model_scheduler.h"
#include "sluice/backend.h"

namespace sluice {

// Loads a model's runtime (the TorchScript backend in the binary; fakes in tests), so the engine
// itself never depends on a particular backend.
using BackendLoader = std::function<Result<std::shared_ptr<Backend>>(const ModelConfig& config)>;

// Told, from a worker's thread, that model `name`'s device failed for good (ModelScheduler's
// file comment); it must not wait on the model.
using DeviceFailureHandler = std::function<void(const std::string& name, const Status& why)>;

// Thread-safe. Models are added and removed while requests flow; a request holds a shared
// reference to its model's scheduler, so removing a model never pulls it from under a request.
class Engine {
 public:
  explicit Engine(BackendLoader loader, Clock& clock = Clock::Real());
  ~Engine();  // Stop().

  // Loads `config`'s model, creates its instances and starts its scheduler. kInvalidArgument when
  // a model of that name is already loaded.
  Status AddModel(const ModelConfig& config);

  // Stops (draining) and removes a model. kNotFound when it is not loaded.
  Status RemoveModel(const std::string& name);

  // The model's scheduler, or nullptr.
  std::shared_ptr<ModelScheduler> Find(const std::string& name) const;

  // Submits to the named model (kNotFound when it is not loaded); see ModelScheduler::Submit().
  Result<RequestId> Submit(const std::string& model, std::unique_ptr<InferRequest> request);

  std::vector<std::string> ModelNames() const;

  // Where models' device failures are reported (the repository reloads them); empty: nowhere.
  void SetDeviceFailureHandler(DeviceFailureHandler handler);

  // Stops every model (draining each) and removes them all.
  void Stop(StopMode mode = StopMode::kDrain);

 private:
  BackendLoader loader_;
  Clock& clock_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<ModelScheduler>> models_ GUARDED_BY(mu_);
  DeviceFailureHandler on_device_failure_ GUARDED_BY(mu_);
};

// `config` as `backend` loaded it: a GPU group that named no GPUs gets those it was loaded on.
ModelConfig LoadedConfig(const ModelConfig& config, const Backend& backend);

// Creates `config.instances.workers()` instances of `backend` (on GPU, one per copy slot).
Result<std::vector<std::shared_ptr<BackendInstance>>> CreateInstances(const ModelConfig& config,
                                                                      Backend& backend);

}  // namespace sluice
