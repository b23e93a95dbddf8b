// `sluice bench --url`: load levels (closed-loop concurrencies, open-loop rates) against any
// KServe v2 server, with the in-process bench's statistics, a table, result files and plots.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench/http_load.h"
#include "bench/results.h"

namespace sluice {

struct HttpBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;
  std::vector<int> concurrency{1, 8, 32, 64};  // Closed-loop levels.
  std::vector<double> rates;                   // Open-loop levels (requests/s); run after.
  int rate_connections = 64;                   // Connection pool for open-loop levels.
  Seconds duration{10};
  Seconds warmup{2};
  // What to send: "v2" (KServe v2 infer with random inputs), "predict" (base64 image JSON) or
  // "predictions" (raw image body). An image is needed for the last two.
  std::string endpoint = "v2";
  std::string input_file;  // PNG/JPEG for the image endpoints.
  bool binary = false;     // v2: binary-data extension for inputs and outputs.
  int samples_per_request = 1;
  uint64_t seed = 1;
  // gRPC instead of REST: `url` is the KServe v2 gRPC service's host:port, each call a
  // ModelInfer with raw contents (`binary`) or typed contents. Server-side batch and queue
  // figures come from `metrics_url`'s /metrics when given.
  bool grpc = false;
  std::string grpc_client = "h2";  // "h2" (nghttp2) or "grpc++" (gRPC C++); see grpc_load.h.
  std::string metrics_url;
  // HTTP only: traces the requests it samples from the client's side (see HttpLoadOptions).
  TraceWriter* tracer = nullptr;
};

struct HttpLevelResult {
  int concurrency = 0;
  double rate = 0;  // 0: closed loop.
  HttpLoadRun run;
  // From the server's /metrics over the level (0 when the server does not expose them).
  double mean_batch_size = 0;
  double mean_queue_ms = 0;
  double mean_compute_ms = 0;
};

// Builds the request every level sends (fetching the model's metadata for "v2").
Result<HttpPayload> BuildHttpPayload(const HttpBenchOptions& options, const HttpTarget& target);

// Runs every level in turn; `progress` gets a line per level.
Result<std::vector<HttpLevelResult>> RunHttpBench(
    const HttpBenchOptions& options, const std::function<void(const std::string&)>& progress);

// One row per level: requests/s, samples/s, latency percentiles, errors, server batch size.
std::string FormatHttpTable(const HttpBenchOptions& options,
                            const std::vector<HttpLevelResult>& levels);

// summary.csv, summary.json, run.json, per-level samples, and SVG plots of throughput and
// latency against concurrency (closed-loop levels).
Status WriteHttpBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                             const HttpBenchOptions& options,
                             const std::vector<HttpLevelResult>& levels);

}  // namespace sluice
