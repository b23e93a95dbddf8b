// One model's scheduler: its dynamic batcher and its pool of instances, each on its own worker
// thread.
//
// Guarantees, which callers and backends may rely on:
//  - One batch at a time per instance: an instance is only ever called from its own worker
//    thread, and a worker asks the batcher for a batch only when its instance is free.
//  - Every accepted request completes exactly once (its callback runs once), whatever happens:
//    success, model failure, deadline, cancellation or shutdown.
//  - A batch that fails in the model is retried request by request, so one bad input fails alone.
//  - An instance whose device failed for good (BackendInstance::DeviceFailure()) fails the model:
//    from then on it takes no request (kUnavailable, naming the failure) and reports the failure
//    once to `on_device_failure`, which reloads it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "batching/dynamic_batcher.h"
#include "common/mutex.h"
#include "config/model_config.h"
#include "engine/model_stats.h"
#include "sluice/backend.h"
#include "sluice/request.h"

namespace sluice {

// What happens to queued requests when the scheduler stops.
enum class StopMode {
  kDrain,   // They run (batched at once, without waiting for company), then the workers exit.
  kReject,  // They complete with kUnavailable without running.
};

struct SchedulerOptions {
  BatcherOptions batcher;
  Micros default_timeout{0};  // Deadline for requests that set none; 0: none.
};

// The batcher and timeout settings of a validated model config.
SchedulerOptions SchedulerOptionsFromConfig(const ModelConfig& config);

// Checks `request`'s inputs against the model's declared inputs: count, datatype, rank, fixed
// dimensions, one leading (batch) dimension shared by all inputs, 1..max_batch_size samples.
Status ValidateRequestInputs(const ModelConfig& config, const InferRequest& request);

// Thread-safe. Submit() and Cancel() never wait on a model run.
class ModelScheduler {
 public:
  // Starts one worker per instance (each attaches its instance to its thread) and a deadline
  // timer. Fails, with nothing left running, when an instance cannot attach.
  static Result<std::unique_ptr<ModelScheduler>> Start(
      ModelConfig config, std::vector<std::shared_ptr<BackendInstance>> instances,
      Clock& clock = Clock::Real(), std::function<void(const Status&)> on_device_failure = {});

  ModelScheduler(const ModelScheduler&) = delete;
  ModelScheduler& operator=(const ModelScheduler&) = delete;
  ~ModelScheduler();  // Stop(StopMode::kDrain).

  // On OK takes the request, assigns and returns its id, and will call its callback exactly once.
  // On error the callback is never called and the request is dropped; the caller answers with the
  // status: kInvalidArgument (inputs do not match the model), kDeadlineExceeded, kUnavailable
  // (queue full or stopping: retry later).
  Result<RequestId> Submit(std::unique_ptr<InferRequest> request);
  // Whether Submit() would now take a one-sample request: asked before a request's body is read
  // and decoded, so an overloaded model refuses it without that work. A refusal (kUnavailable,
  // with a retry-after when the predicted wait is too long) counts as a refused request. Hold the
  // ticket until the request is submitted (or dropped): meanwhile it counts as queued.
  Result<std::shared_ptr<const void>> Admit();

  // Cancels a queued request: it completes with kCancelled, is never run, and its queue slot is
  // freed at once. Returns false when it is no longer queued (running or done) or unknown.
  bool Cancel(RequestId id);

  // Stops accepting requests, deals with queued ones per `mode`, waits for running batches and
  // joins every thread. Idempotent; the first call's mode wins.
  void Stop(StopMode mode = StopMode::kDrain);

  // OK, or the device failure that made the model stop taking requests (see the file comment).
  Status failure() const;

  ModelStatsSnapshot stats() const;
  // Seeds the batcher's cost model: (batch size, seconds) of warm-up runs.
  void SeedCosts(const std::vector<std::pair<int, double>>& costs);
  const BatchCostModel& cost_model() const { return batcher_.cost_model(); }
  const ModelConfig& config() const { return config_; }

 private:
  ModelScheduler(ModelConfig config, std::vector<std::shared_ptr<BackendInstance>> instances,
                 Clock& clock);

  void WorkerLoop(size_t index);
  void TimerLoop();
  void RunBatch(BackendInstance& instance, int instance_index, Batch& batch);
  void Complete(std::unique_ptr<InferRequest> request, InferResponse response);
  // Records `instance`'s device failure, if it has one (the first only), and reports it.
  bool CheckDevice(const BackendInstance& instance);

  const ModelConfig config_;
  const SchedulerOptions options_;
  Clock& clock_;
  std::vector<std::shared_ptr<BackendInstance>> instances_;
  DynamicBatcher batcher_;
  ModelStats stats_;
  std::atomic<RequestId> next_request_id_{1};
  std::atomic<uint64_t> next_batch_id_{1};

  std::function<void(const Status&)> on_device_failure_;
  std::atomic<bool> failed_{false};  // failure_ is set: read without the lock on every request.
  mutable Mutex failure_mu_;
  Status failure_ GUARDED_BY(failure_mu_);

  std::vector<std::thread> workers_;
  std::thread timer_;
  std::once_flag stop_once_;
};

}  // namespace sluice
