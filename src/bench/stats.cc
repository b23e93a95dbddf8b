// Benchmark statistics (definitions in stats.h).
#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sluice {

double NearestRankPercentile(std::span<const double> sorted, double p) {
  const auto n = static_cast<double>(sorted.size());
  // The small slack keeps 99.9% of 1000 at rank 999 despite 0.999 * 1000 = 999.0000000000001.
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * n - 1e-9));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

LatencyStats ComputeLatencyStats(std::vector<double> latencies) {
  LatencyStats s;
  s.count = static_cast<int64_t>(latencies.size());
  if (latencies.empty()) return s;
  std::sort(latencies.begin(), latencies.end());
  const double n = static_cast<double>(latencies.size());
  s.mean = std::accumulate(latencies.begin(), latencies.end(), 0.0) / n;
  if (latencies.size() > 1) {
    double sq = 0;
    for (double v : latencies) sq += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(sq / (n - 1));
  }
  s.min = latencies.front();
  s.max = latencies.back();
  s.p50 = NearestRankPercentile(latencies, 50);
  s.p90 = NearestRankPercentile(latencies, 90);
  s.p95 = NearestRankPercentile(latencies, 95);
  s.p99 = NearestRankPercentile(latencies, 99);
  s.p999 = NearestRankPercentile(latencies, 99.9);
  return s;
}

Summary Summarize(std::span<const RequestRecord> records, bool first_is_warmup) {
  Summary s;
  if (records.empty()) return s;
  std::vector<const RequestRecord*> ordered;
  ordered.reserve(records.size());
  for (const RequestRecord& r : records) ordered.push_back(&r);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto* a, const auto* b) { return a->request_time < b->request_time; });
  std::span<const RequestRecord* const> timed(ordered);
  if (first_is_warmup) {
    s.warmup_latency = ordered.front()->latency_seconds();
    timed = timed.subspan(1);
  }
  if (timed.empty()) return s;

  std::vector<double> latencies;
  latencies.reserve(timed.size());
  Clock::time_point first_request = timed.front()->request_time;
  Clock::time_point last_response = timed.front()->response_time;
  for (const RequestRecord* r : timed) {
    last_response = std::max(last_response, r->response_time);
    ++s.requests;
    if (r->outcome == StatusCode::kOk) {
      ++s.ok_requests;
      s.ok_samples += r->samples;
      latencies.push_back(r->latency_seconds());
      if (r->start_time != Clock::time_point{}) {
        s.mean_compute_seconds += SecondsBetween(r->start_time, r->response_time);
        s.mean_queue_seconds += SecondsBetween(r->request_time, r->start_time);
      }
    } else {
      ++s.errors[std::string(StatusCodeName(r->outcome))];
    }
  }
  if (s.ok_requests > 0) {
    s.mean_compute_seconds /= static_cast<double>(s.ok_requests);
    s.mean_queue_seconds /= static_cast<double>(s.ok_requests);
  }
  s.latency = ComputeLatencyStats(std::move(latencies));
  std::map<uint64_t, int> batch_sizes;  // batch_id -> size.
  for (const RequestRecord* r : timed) {
    if (r->batch_id != 0) batch_sizes[r->batch_id] = r->batch_size;
  }
  int64_t batched_samples = 0;
  for (const auto& [id, size] : batch_sizes) {
    ++s.batches_by_size[size];
    batched_samples += size;
  }
  if (!batch_sizes.empty()) {
    s.mean_batch_size =
        static_cast<double>(batched_samples) / static_cast<double>(batch_sizes.size());
  }
  s.duration_seconds = SecondsBetween(first_request, last_response);
  if (s.duration_seconds > 0) {
    s.samples_per_second = static_cast<double>(s.ok_samples) / s.duration_seconds;
    s.requests_per_second = static_cast<double>(s.ok_requests) / s.duration_seconds;
  }
  return s;
}

}  // namespace sluice
