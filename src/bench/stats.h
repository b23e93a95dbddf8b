// Benchmark statistics with the exact definitions of DESIGN.md ("Benchmark harness").
//
//   latency     = response_time - request_time, per request.
//   warm-up     = the first request (earliest request_time) after model load; reported alone and
//                 excluded from everything else.
//   throughput  = completed samples / (last response_time - first request_time), warm-up excluded.
//   percentiles = nearest rank: the smallest latency L such that at least p% of latencies <= L.
//   std         = sample standard deviation (n - 1 denominator); 0 for fewer than two requests.
//   compute     = response_time - start_time; queue = start_time - request_time (when the driver
//                 knows when a worker picked the request up).
// Latency statistics cover successful requests; failed ones are counted by kind.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "sluice/request.h"
#include "sluice/status.h"

namespace sluice {

// One request as the benchmark saw it.
struct RequestRecord {
  Clock::time_point request_time;   // Just before hand-over (enqueue / first byte written).
  Clock::time_point start_time;     // When a worker began running it (in-process only).
  Clock::time_point response_time;  // When the response was in hand.
  int samples = 1;                  // Batch size of the request.
  StatusCode outcome = StatusCode::kOk;
  int worker = -1;        // Instance that ran it, where known.
  uint64_t batch_id = 0;  // The engine batch it ran in (batched runs only; 0: none or unknown).
  int batch_size = 0;     // Samples in that batch (batched runs only).
  RequestTimes engine;    // The scheduler's stamps (batched runs only; unset otherwise).

  double latency_seconds() const { return SecondsBetween(request_time, response_time); }
};

// Seconds.
struct LatencyStats {
  int64_t count = 0;
  double mean = 0, std = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0, p999 = 0;
};

struct Summary {
  int64_t requests = 0;                   // Timed requests (warm-up excluded), any outcome.
  int64_t ok_requests = 0;                // Of those, successful.
  int64_t ok_samples = 0;                 // Samples in successful timed requests.
  std::map<std::string, int64_t> errors;  // Failed timed requests by StatusCodeName().
  std::optional<double> warmup_latency;   // Seconds; absent when warm-up was not separated.
  LatencyStats latency;
  double mean_compute_seconds = 0;  // Mean of response_time - start_time (model + split).
  double mean_queue_seconds = 0;    // Mean of start_time - request_time.
  double duration_seconds = 0;      // last response_time - first request_time (timed).
  // Batched runs: engine batches that ran timed requests, by size in samples, and their mean size.
  std::map<int, int64_t> batches_by_size;
  double mean_batch_size = 0;
  double samples_per_second = 0;
  double requests_per_second = 0;
};

// Nearest-rank percentile of an ascending-sorted, non-empty list; `p` in [0, 100].
double NearestRankPercentile(std::span<const double> sorted, double p);

// Latency statistics of a list of latencies (any order).
LatencyStats ComputeLatencyStats(std::vector<double> latencies);

// Summarises `records` (any order). With `first_is_warmup`, the record with the earliest
// request_time is the warm-up request.
Summary Summarize(std::span<const RequestRecord> records, bool first_is_warmup);

}  // namespace sluice
