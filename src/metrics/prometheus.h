// Prometheus text exposition (format 0.0.4) of the engine's and the HTTP server's statistics.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/histogram.h"
#include "engine/model_stats.h"

namespace sluice {

// Counters kept by the HTTP server.
struct HttpStats {
  std::vector<std::pair<int, int64_t>> responses_by_status;  // (HTTP status, responses).
  int64_t open_connections = 0;
  int64_t accepted_connections = 0;
  int64_t refused_connections = 0;  // Over the connection limit.
  int64_t memory_budget_bytes = 0;  // The server's memory budget for requests in flight.
  int64_t memory_in_use_bytes = 0;  // What requests in flight hold of it.
  int64_t memory_refusals = 0;      // Requests answered 503 for want of it.
  // Work handed to a connection's I/O thread from another thread (a model's answer, or its
  // finish once sent in place; a decoded image's refusal): a thread hand-off each.
  int64_t handoffs = 0;
  // Answers sent from the thread that finished them (a model instance's, for a batch of one),
  // without waiting for the connection's I/O thread.
  int64_t answers_in_place = 0;
  HistogramSnapshot request_seconds;  // Request fully read -> response handed to the socket.
};

// Builds the exposition text, one metric family at a time (HELP, TYPE, samples).
class PrometheusWriter {
 public:
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // `labels` is preformatted ("model=\"m\",outcome=\"ok\""), may be empty.
  void Sample(std::string_view name, std::string_view labels, double value);
  // name_bucket{labels,le="..."} (cumulative), name_sum and name_count.
  void Histogram(std::string_view name, std::string_view labels, const HistogramSnapshot& h);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A label value, escaped (backslash, quote, newline).
std::string LabelValue(std::string_view value);

// Everything /metrics serves: per-model series labelled model="<name>", then the HTTP series.
std::string RenderMetrics(const std::vector<std::pair<std::string, ModelStatsSnapshot>>& models,
                          const HttpStats& http);

}  // namespace sluice
