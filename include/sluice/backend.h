// The narrow boundary between Sluice and a model runtime.
//
// A Backend is one loaded model. It hands out instances; each instance runs one whole batch at a
// time on the thread that attached it. The engine guarantees never two calls at once on one
// instance, so instances need no locking of their own.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

// What loading a model cost, for reports.
struct LoadReport {
  double load_seconds = 0;      // Reading and deserialising the model file.
  double optimize_seconds = 0;  // Freeze / optimise / precision and layout conversion.
  double warmup_seconds = 0;    // Warm-up runs at the configured batch sizes.
  std::string runtime;          // e.g. "libtorch 1.13.0".
  // Per warm-up batch size, the seconds of its last warm-up run: the first costs the batcher's
  // cost model knows.
  std::vector<std::pair<int, double>> warmup_batch_seconds;
};

// Not thread-safe: one thread at a time (see the file comment).
class BackendInstance {
 public:
  virtual ~BackendInstance() = default;

  // Applies this instance's thread budget to the calling thread. Call once from the thread that
  // will run the instance, before the first Run().
  virtual Status AttachToCurrentThread() = 0;

  // Runs one batch. `inputs` follow the model's declared inputs, each with the batch as its
  // leading dimension. Outputs follow the declared outputs, batch first. Never throws.
  virtual Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) = 0;

  // The rows a batch of `samples` runs as: a model compiled for fixed batch sizes runs the
  // smallest one that holds it. The engine lays each batch out at that size (requests' rows first,
  // the rest zero) so that the instance pads nothing itself; Run() then returns that many rows,
  // the padding's after the requests'.
  virtual int64_t BatchRows(int64_t samples) const { return samples; }

  // OK, or why the instance's device can run nothing more in this process (a sticky CUDA error):
  // asked after a failed Run(). May be called from any thread.
  virtual Status DeviceFailure() const { return Status::Ok(); }
};

// Thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;

  // Creates instance `index` (0-based, < the configured instance count).
  virtual Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) = 0;

  virtual const LoadReport& load_report() const = 0;

  // The GPUs the model was loaded on (every visible one where its config named none); empty on
  // CPU. Its instance count follows them (InstancesConfig::workers()).
  virtual std::vector<int> gpus() const { return {}; }
};

}  // namespace sluice
