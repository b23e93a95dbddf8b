// Per-model statistics kept by the engine: what /metrics, /v2/models/{m}/stats and the benchmark
// report show.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "common/histogram.h"
#include "device/nvml.h"
#include "sluice/request.h"
#include "sluice/status.h"

namespace sluice {

struct ModelStatsSnapshot {
  int64_t queued_requests = 0;  // Gauges, at the moment of the snapshot.
  int64_t queued_samples = 0;
  int64_t inflight_requests = 0;  // Accepted and not yet completed (queued or running).
  // Every request the engine answered, refused or completed, by StatusCode.
  std::array<int64_t, kStatusCodeCount> requests_by_outcome{};
  int64_t rejected_requests = 0;      // Of those, refused by Submit() (never queued).
  int64_t batches = 0;                // Batches run (a retried batch counts once).
  int64_t failed_batches = 0;         // Batches that failed and were retried request by request.
  HistogramSnapshot batch_size;       // Samples per batch.
  HistogramSnapshot queue_seconds;    // enqueue -> dispatch, per request that ran.
  HistogramSnapshot compute_seconds;  // Per batch: collate + model + split.
  HistogramSnapshot request_seconds;  // enqueue -> completion, per completed request.
  double busy_seconds = 0;            // Summed over instances: time spent running batches.
  int64_t instance_wakeups = 0;       // Instances woken while waiting for work (a thread hand-off).
  int64_t spin_catches = 0;  // Idle instances that saw work arrive while spinning (no wake-up).
  int instances = 0;
  // The batcher: its policy, the batch size it forms now (adaptive: the cheapest per sample; fixed:
  // max_batch_size), the arrival rate it expects while a batch waits (samples/s), and the learned
  // cost of each batch size run so far.
  bool adaptive_batching = false;
  int target_batch_size = 0;
  double company_rate = 0;
  double drain_rate = 0;        // Samples/s dispatched while the queue held requests.
  double wait_calibration = 1;  // Observed over predicted queue waits (dynamic_batcher.h).
  double intake_seconds = 0;    // Header to queue (body read and decoded), smoothed.
  struct BatchCost {
    int batch_size;
    double seconds;
    int64_t batches;
  };
  std::vector<BatchCost> batch_costs;
  // GPU models: the latest reading of each of the model's GPUs (device/gpu_monitor.h), by ordinal.
  std::vector<std::pair<int, GpuDeviceReading>> gpus;

  int64_t requests(StatusCode code) const { return requests_by_outcome[static_cast<int>(code)]; }
  int64_t answered_requests() const;  // Sum of requests_by_outcome.
};

// Thread-safe and lock-free; every Record*() is a few relaxed atomic updates.
class ModelStats {
 public:
  ModelStats(int max_batch_size, int instances);

  // Submit() began with a request; it is in flight until completed or refused.
  void RecordSubmitted() { submitted_.fetch_add(1, std::memory_order_relaxed); }
  // Submit() refused it with `code` (it was never queued).
  void RecordRefused(StatusCode code);
  // A request left the engine with `code`; `times` as stamped, `now` its completion time.
  void RecordCompletion(StatusCode code, const RequestTimes& times, Clock::time_point now);
  // A batch ran (successfully or not) for `seconds` of instance time.
  void RecordBatch(int64_t samples, double seconds, bool failed);

  // `queued_*` come from the batcher, which owns the queue.
  ModelStatsSnapshot Snapshot(int64_t queued_requests, int64_t queued_samples) const;

 private:
  const int instances_;
  std::array<std::atomic<int64_t>, kStatusCodeCount> outcomes_{};
  // Written by submitting threads; the fields after them mostly by workers. Their own cache line,
  // so the two sides do not slow each other down. In flight = submitted - answered.
  alignas(64) std::atomic<int64_t> submitted_{0};
  std::atomic<int64_t> rejected_{0};
  alignas(64) std::atomic<int64_t> batches_{0};
  std::atomic<int64_t> failed_batches_{0};
  std::atomic<double> busy_seconds_{0};
  Histogram batch_size_;
  Histogram queue_seconds_;
  Histogram compute_seconds_;
  Histogram request_seconds_;
};

}  // namespace sluice
