// The HTTP load generator behind `sluice bench --url`: its own asynchronous Boost.Beast client,
// many keep-alive connections driven from one thread.
//
//   closed loop: `concurrency` connections, each sending its next request as soon as the last
//                answer arrives; latency = answer - send.
//   open loop:   requests scheduled as a Poisson process at `rate` per second onto a pool of
//                connections; latency = answer - *scheduled* time, so a server that falls behind
//                is charged for the queueing it causes (no coordinated omission).
// Requests sent during the warm-up period are excluded from the results.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/stats.h"
#include "bench/utilization.h"
#include "metrics/trace.h"
#include "sluice/status.h"

namespace sluice {

struct HttpTarget {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
};

// "http://127.0.0.1:8000" (a trailing path is ignored). Only plain http.
Result<HttpTarget> ParseHttpUrl(std::string_view url);

// A blocking GET, for metadata and /metrics. Returns the body of a 2xx answer, else an error
// with the status and body.
Result<std::string> HttpGet(const HttpTarget& target, const std::string& path);

// One request as sent on the wire, built once and reused.
struct HttpPayload {
  std::string method = "POST";
  std::string path;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  int samples = 1;  // Samples the request carries (for samples/s).
};

struct HttpLoadOptions {
  HttpTarget target;
  HttpPayload payload;
  int concurrency = 1;   // Closed loop: connections. Open loop: connections opened at the start.
  // Open loop: when an arrival finds every connection busy, the pool grows by one connection, up
  // to this many, so the arrival does not wait on the client's side for a connection (a server
  // that holds its answers would otherwise be measured through the client's queue). 0: the pool
  // stays at `concurrency`, and a late request's wait for a connection counts in its latency.
  int max_connections = 0;
  double rate = 0;       // Requests per second (open loop); 0: closed loop.
  Seconds duration{10};  // Measured period, after the warm-up.
  Seconds warmup{2};     // Sent but excluded.
  uint64_t seed = 1;     // Poisson arrivals.
  // When set (not owned), the measured requests it samples carry a sampled `traceparent` and are
  // traced from the client's side: delay (open loop), send, receive; the root span is the
  // request's latency as recorded. A server tracing too names the same trace id.
  TraceWriter* tracer = nullptr;
};

struct HttpLoadRun {
  std::vector<RequestRecord> records;  // Measured requests only.
  Summary summary;
  UtilizationAverages utilization;  // This machine (client and server when local).
  std::vector<UtilizationSample> utilization_samples;  // Over the whole level, warm-up included.
  int64_t transport_errors = 0;                     // Connections lost or refused (each retried).
  std::vector<std::string> first_transport_errors;  // The first few, e.g. "read: end of stream".
  int64_t unsent = 0;    // Open loop: scheduled but never sent before the end (server too slow).
  int connections = 0;   // Connections opened (open loop: the pool's size at the end).
  int64_t sent = 0;      // Requests written, warm-up included.
  int64_t answered = 0;  // Responses read, warm-up included; sent - answered were lost.
  int64_t unavailable_without_retry_after = 0;  // 503 answers lacking Retry-After.
};

// Counts a lost connection or call in `run`, keeping the first few descriptions.
void AddTransportError(HttpLoadRun& run, std::string what);

// Ends a level: stops `sampler`, then fills in `run`'s summary of its records, the utilisation
// over the measured period [measure_from, end) and the requests never sent.
void FinishLoadRun(HttpLoadRun& run, UtilizationSampler& sampler, Clock::time_point measure_from,
                   Clock::time_point end, int64_t unsent);

// Runs one load level. Fails only when no connection can be opened at all.
Result<HttpLoadRun> RunHttpLoad(const HttpLoadOptions& options);

// Sums of `name`_sum and `name`_count for `model` in Prometheus text, e.g. the batch-size
// histogram; {0, 0} when absent.
std::pair<double, double> ScrapeHistogram(std::string_view metrics, std::string_view name,
                                          std::string_view model);

}  // namespace sluice
