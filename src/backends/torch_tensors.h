// What the libtorch backends share: Sluice tensors to and from at::Tensor, thread budgets,
// warm-up. Includes torch headers, so only backends/ may include it.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <vector>

#include "common/core_pool.h"
#include "config/model_config.h"
#include "sluice/backend.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice::torch_backend {

at::ScalarType ToScalarType(DataType dtype);

// Views `in` (zero copy; the caller's buffer must outlive the returned tensor) after checking it
// against the declared input `spec`: same datatype, batch dimension first.
Result<at::Tensor> WrapInput(const Tensor& in, const TensorSpec& spec);

// Converts each output to its declared datatype (contiguous) and wraps it without a copy; the
// returned tensors keep the torch storage alive. Fails if the count differs from the config's.
Result<std::vector<Tensor>> WrapOutputs(const std::vector<at::Tensor>& outputs,
                                        const ModelConfig& config);

// Makes `threads` the calling thread's intra-op budget (OpenMP keeps it per thread).
Status SetIntraOpThreads(int threads);

// An instance's intra-op threads: its fixed `instances.threads`, or, with instances.share_cores,
// what the model's CorePool lends each run (one pool for all of the model's instances).
class RunThreads {
 public:
  // `pool`: MakeCorePool(config), shared by the instances; null keeps the fixed budget.
  RunThreads(const ModelConfig& config, std::shared_ptr<CorePool> pool)
      : fixed_(config.instances.threads), pool_(std::move(pool)) {}

  // Makes the fixed budget the calling thread's (AttachToCurrentThread).
  Status Attach();
  // This run's cores from the pool (an empty lease without one); keep it for the whole run.
  CoreLease Lease() { return pool_ ? CoreLease(*pool_) : CoreLease(); }
  // Makes the lease's cores the calling thread's budget (nothing to do when it has them already).
  Status Use(const CoreLease& lease);

 private:
  const int fixed_;
  std::shared_ptr<CorePool> pool_;
  int current_ = 0;  // The budget last set on the running thread.
};

// The pool of config.instances.pool_cores cores when share_cores is on; null otherwise.
std::shared_ptr<CorePool> MakeCorePool(const ModelConfig& config);

// The checks every backend makes: the model runs on the CPU (the only device of this build),
// `index` is one of the configured instances, `inputs` has one tensor per declared input.
Status CheckCpuDevice(const ModelConfig& config);
Status CheckInstanceIndex(int index, const ModelConfig& config);
Status CheckInputCount(const std::vector<Tensor>& inputs, const ModelConfig& config);

// Runs `instance` on zero inputs at each configured warm-up batch size, warmup_iterations times,
// on the calling thread (variable dimensions as 1), and records the time in
// report.warmup_seconds. A failure names the model.
Status WarmUp(BackendInstance& instance, const ModelConfig& config, LoadReport& report);

double SecondsSince(std::chrono::steady_clock::time_point start);

}  // namespace sluice::torch_backend
