// Fixed-bucket lock-free histogram.
#include "common/histogram.h"

#include <algorithm>

namespace sluice {

uint64_t HistogramSnapshot::CumulativeCount(size_t i) const {
  uint64_t total = 0;
  for (size_t b = 0; b <= i && b < counts.size(); ++b) total += counts[b];
  return total;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  // First bucket whose upper bound is >= value (Prometheus buckets are "le").
  size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  s.upper_bounds = upper_bounds_;
  s.counts.resize(upper_bounds_.size() + 1);
  for (size_t i = 0; i < s.counts.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> Histogram::LatencySecondsBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10};
}

std::vector<double> Histogram::BatchSizeBuckets(int max_batch_size) {
  std::vector<double> bounds;
  for (int b = 1; b < max_batch_size; b *= 2) bounds.push_back(b);
  bounds.push_back(std::max(max_batch_size, 1));
  return bounds;
}

}  // namespace sluice
