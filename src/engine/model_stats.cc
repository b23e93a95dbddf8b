// Per-model statistics.
#include "engine/model_stats.h"

namespace sluice {

int64_t ModelStatsSnapshot::answered_requests() const {
  int64_t total = 0;
  for (int64_t n : requests_by_outcome) total += n;
  return total;
}

ModelStats::ModelStats(int max_batch_size, int instances)
    : instances_(instances),
      batch_size_(Histogram::BatchSizeBuckets(max_batch_size)),
      queue_seconds_(Histogram::LatencySecondsBuckets()),
      compute_seconds_(Histogram::LatencySecondsBuckets()),
      request_seconds_(Histogram::LatencySecondsBuckets()) {}

void ModelStats::RecordRefused(StatusCode code) {
  outcomes_[static_cast<int>(code)].fetch_add(1, std::memory_order_release);
  rejected_.fetch_add(1, std::memory_order_relaxed);
}

void ModelStats::RecordCompletion(StatusCode code, const RequestTimes& times,
                                  Clock::time_point now) {
  outcomes_[static_cast<int>(code)].fetch_add(1, std::memory_order_release);
  if (times.dispatch != Clock::time_point{}) {
    queue_seconds_.Observe(SecondsBetween(times.enqueue, times.dispatch));
  }
  request_seconds_.Observe(SecondsBetween(times.enqueue, now));
}

void ModelStats::RecordBatch(int64_t samples, double seconds, bool failed) {
  batches_.fetch_add(1, std::memory_order_relaxed);
  if (failed) failed_batches_.fetch_add(1, std::memory_order_relaxed);
  busy_seconds_.fetch_add(seconds, std::memory_order_relaxed);
  batch_size_.Observe(static_cast<double>(samples));
  compute_seconds_.Observe(seconds);
}

ModelStatsSnapshot ModelStats::Snapshot(int64_t queued_requests, int64_t queued_samples) const {
  ModelStatsSnapshot s;
  s.queued_requests = queued_requests;
  s.queued_samples = queued_samples;
  // Answers are read first: a request answered after this read is still counted in flight,
  // never the reverse (which could make the count negative).
  for (int i = 0; i < kStatusCodeCount; ++i) {
    s.requests_by_outcome[i] = outcomes_[i].load(std::memory_order_acquire);
  }
  s.inflight_requests = submitted_.load(std::memory_order_acquire) - s.answered_requests();
  s.rejected_requests = rejected_.load(std::memory_order_relaxed);
  s.batches = batches_.load(std::memory_order_relaxed);
  s.failed_batches = failed_batches_.load(std::memory_order_relaxed);
  s.batch_size = batch_size_.Snapshot();
  s.queue_seconds = queue_seconds_.Snapshot();
  s.compute_seconds = compute_seconds_.Snapshot();
  s.request_seconds = request_seconds_.Snapshot();
  s.busy_seconds = busy_seconds_.load(std::memory_order_relaxed);
  s.instances = instances_;
  return s;
}

}  // namespace sluice
