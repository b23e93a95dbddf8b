// A fixed-bucket histogram that many threads record into without locks, in the shape Prometheus
// exports (upper bounds, a count and a sum).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace sluice {

// What a Histogram held at one moment.
struct HistogramSnapshot {
  std::vector<double> upper_bounds;  // Ascending; an implicit +Inf bucket follows the last.
  std::vector<uint64_t> counts;      // Per bucket, not cumulative; upper_bounds.size() + 1 long.
  uint64_t count = 0;                // All observations.
  double sum = 0;                    // Of all observed values.

  // Cumulative count of observations <= upper_bounds[i] (i == size(): all).
  uint64_t CumulativeCount(size_t i) const;
  // Mean of the observations; 0 when there are none.
  double Mean() const { return count == 0 ? 0 : sum / static_cast<double>(count); }
};

// Thread-safe and lock-free: Observe() is a handful of relaxed atomic operations. A snapshot taken
// while others observe may be off by the observations in flight, never torn per counter.
class Histogram {
 public:
  // `upper_bounds` ascending and unique.
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double value);
  HistogramSnapshot Snapshot() const;
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

  // Seconds, 50 µs to 10 s: the latency buckets every Sluice latency histogram shares, so series
  // from different models and servers aggregate.
  static std::vector<double> LatencySecondsBuckets();
  // 1, 2, 4, ... up to and including `max_batch_size` (which ends the list even when it is not a
  // power of two).
  static std::vector<double> BatchSizeBuckets(int max_batch_size);

 private:
  std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // upper_bounds_.size() + 1.
  std::atomic<double> sum_{0};
};

}  // namespace sluice
