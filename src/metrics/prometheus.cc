// Prometheus text rendering.
#include "metrics/prometheus.h"

#include <fmt/format.h>

#include <cmath>
#include <iterator>

namespace sluice {

std::string LabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

void PrometheusWriter::Family(std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PrometheusWriter::Sample(std::string_view name, std::string_view labels, double value) {
  if (labels.empty()) {
    fmt::format_to(std::back_inserter(out_), "{} {}\n", name, value);
  } else {
    fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, value);
  }
}

void PrometheusWriter::Histogram(std::string_view name, std::string_view labels,
                                 const HistogramSnapshot& h) {
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    cumulative += h.counts[i];
    fmt::format_to(std::back_inserter(out_), "{}_bucket{{{}le=\"{}\"}} {}\n", name, prefix,
                   h.upper_bounds[i], cumulative);
  }
  fmt::format_to(std::back_inserter(out_), "{}_bucket{{{}le=\"+Inf\"}} {}\n", name, prefix,
                 h.count);
  Sample(std::string(name) + "_sum", labels, h.sum);
  Sample(std::string(name) + "_count", labels, static_cast<double>(h.count));
}

std::string RenderMetrics(const std::vector<std::pair<std::string, ModelStatsSnapshot>>& models,
                          const HttpStats& http) {
  PrometheusWriter w;
  auto model_label = [](const std::string& name) { return "model=" + LabelValue(name); };

  w.Family("sluice_requests_total", "counter",
           "Requests answered by the engine, by model and outcome (refusals included).");
  for (const auto& [name, s] : models) {
    for (int code = 0; code < kStatusCodeCount; ++code) {
      w.Sample("sluice_requests_total",
               model_label(name) +
                   ",outcome=" + LabelValue(StatusCodeName(static_cast<StatusCode>(code))),
               static_cast<double>(s.requests_by_outcome[code]));
    }
  }
  struct Gauge {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const ModelStatsSnapshot&);
  };
  const Gauge gauges[] = {
      {"sluice_queue_requests", "gauge", "Requests waiting in the model's queue.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.queued_requests); }},
      {"sluice_queue_samples", "gauge", "Samples waiting in the model's queue.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.queued_samples); }},
      {"sluice_inflight_requests", "gauge", "Accepted requests not yet answered.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.inflight_requests); }},
      {"sluice_rejected_requests_total", "counter", "Requests refused at submission.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.rejected_requests); }},
      {"sluice_batches_total", "counter", "Batches run.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.batches); }},
      {"sluice_failed_batches_total", "counter",
       "Batches that failed and were retried request by request.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.failed_batches); }},
      {"sluice_instance_busy_seconds_total", "counter",
       "Time instances spent running batches, summed over instances; divide its rate by "
       "sluice_instances for the busy ratio.",
       [](const ModelStatsSnapshot& s) { return s.busy_seconds; }},
      {"sluice_instance_wakeups_total", "counter",
       "Times an instance waiting for work was woken: thread hand-offs at the model; against "
       "sluice_batches_total, the wake-ups that found nothing to run.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.instance_wakeups); }},
      {"sluice_instance_spin_catches_total", "counter",
       "Times an idle instance, spinning before it sleeps (instances.idle_spin_us), saw work "
       "arrive: thread hand-offs without a wake-up.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.spin_catches); }},
      {"sluice_instances", "gauge", "Model instances (workers).",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.instances); }},
      {"sluice_batch_target_size", "gauge",
       "The batch size the batcher forms now: adaptive, the cheapest per sample learned; fixed, "
       "max_batch_size.",
       [](const ModelStatsSnapshot& s) { return static_cast<double>(s.target_batch_size); }},
      {"sluice_batch_company_rate", "gauge",
       "Samples per second arriving while a request waits in the queue (decaying over ~1 s).",
       [](const ModelStatsSnapshot& s) { return s.company_rate; }},
      {"sluice_batch_drain_rate", "gauge",
       "Samples per second dispatched to instances while the queue held requests (decaying over "
       "~1 s); admission predicts a wait as the samples ahead over this rate at least.",
       [](const ModelStatsSnapshot& s) { return s.drain_rate; }},
      {"sluice_batch_wait_calibration", "gauge",
       "Observed over predicted queue waits, smoothed: the factor admission scales its "
       "predictions by.",
       [](const ModelStatsSnapshot& s) { return s.wait_calibration; }},
  };
  for (const Gauge& g : gauges) {
    w.Family(g.name, g.type, g.help);
    for (const auto& [name, s] : models) w.Sample(g.name, model_label(name), g.value(s));
  }
  w.Family("sluice_batch_cost_seconds", "gauge",
           "Learned seconds per batch on one instance, by batch size (smoothed; warm-up seeded).");
  for (const auto& [name, s] : models) {
    for (const auto& cost : s.batch_costs) {
      w.Sample("sluice_batch_cost_seconds",
               model_label(name) + ",batch_size=\"" + std::to_string(cost.batch_size) + "\"",
               cost.seconds);
    }
  }
  bool any_gpu = false;
  for (const auto& [name, s] : models) any_gpu |= !s.gpus.empty();
  if (any_gpu) {
    // Sampled every 100 ms from NVML while a model runs on the GPU (device/gpu_monitor.h).
    struct GpuGauge {
      const char* name;
      const char* help;
      double (*value)(const GpuDeviceReading&);
    };
    const GpuGauge gpu_gauges[] = {
        {"sluice_gpu_utilization_ratio",
         "Fraction of the last NVML sample period a kernel ran on the model's GPU (0-1).",
         [](const GpuDeviceReading& r) { return r.utilization_percent / 100.0; }},
        {"sluice_gpu_memory_used_bytes", "GPU memory in use on the model's GPU (all processes).",
         [](const GpuDeviceReading& r) { return r.memory_used_bytes; }},
        {"sluice_gpu_memory_total_bytes", "GPU memory of the model's GPU.",
         [](const GpuDeviceReading& r) { return r.memory_total_bytes; }},
    };
    for (const GpuGauge& g : gpu_gauges) {
      w.Family(g.name, "gauge", g.help);
      for (const auto& [name, s] : models) {
        for (const auto& [gpu, reading] : s.gpus) {
          w.Sample(g.name, model_label(name) + ",gpu=\"" + std::to_string(gpu) + "\"",
                   g.value(reading));
        }
      }
    }
  }
  struct Hist {
    const char* name;
    const char* help;
    const HistogramSnapshot ModelStatsSnapshot::*field;
  };
  const Hist hists[] = {
      {"sluice_batch_size", "Samples per batch.", &ModelStatsSnapshot::batch_size},
      {"sluice_queue_seconds", "Time from enqueue to dispatch, per request that ran.",
       &ModelStatsSnapshot::queue_seconds},
      {"sluice_compute_seconds", "Time per batch on an instance (collate, model, split).",
       &ModelStatsSnapshot::compute_seconds},
      {"sluice_request_seconds", "Time from enqueue to completion, per request.",
       &ModelStatsSnapshot::request_seconds},
  };
  for (const Hist& h : hists) {
    w.Family(h.name, "histogram", h.help);
    for (const auto& [name, s] : models) w.Histogram(h.name, model_label(name), s.*h.field);
  }

  w.Family("sluice_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, count] : http.responses_by_status) {
    w.Sample("sluice_http_responses_total", "code=\"" + std::to_string(code) + "\"",
             static_cast<double>(count));
  }
  w.Family("sluice_http_open_connections", "gauge", "Open client connections.");
  w.Sample("sluice_http_open_connections", "", static_cast<double>(http.open_connections));
  w.Family("sluice_http_connections_total", "counter", "Connections accepted.");
  w.Sample("sluice_http_connections_total", "", static_cast<double>(http.accepted_connections));
  w.Family("sluice_http_refused_connections_total", "counter",
           "Connections closed at once because the connection limit was reached.");
  w.Sample("sluice_http_refused_connections_total", "",
           static_cast<double>(http.refused_connections));
  w.Family("sluice_memory_budget_bytes", "gauge",
           "Server-wide budget for request bodies and the tensors decoded from them.");
  w.Sample("sluice_memory_budget_bytes", "", static_cast<double>(http.memory_budget_bytes));
  w.Family("sluice_memory_in_use_bytes", "gauge",
           "What requests being read or in flight hold of the memory budget.");
  w.Sample("sluice_memory_in_use_bytes", "", static_cast<double>(http.memory_in_use_bytes));
  w.Family("sluice_memory_budget_refusals_total", "counter",
           "Requests answered 503 because the memory budget could not hold them.");
  w.Sample("sluice_memory_budget_refusals_total", "", static_cast<double>(http.memory_refusals));
  w.Family("sluice_http_handoffs_total", "counter",
           "Work handed to an I/O thread from another thread (a model's answers to encode and "
           "write, or to finish once sent in place; a batch's answers for one I/O thread go "
           "together): a thread hand-off each.");
  w.Sample("sluice_http_handoffs_total", "", static_cast<double>(http.handoffs));
  w.Family("sluice_http_answers_in_place_total", "counter",
           "Answers sent from the model instance's thread that finished them (a batch of one), "
           "without waiting for the connection's I/O thread.");
  w.Sample("sluice_http_answers_in_place_total", "", static_cast<double>(http.answers_in_place));
  w.Family("sluice_http_request_seconds", "histogram",
           "Time from a request fully read to its response handed to the socket.");
  w.Histogram("sluice_http_request_seconds", "", http.request_seconds);
  return w.text();
}

}  // namespace sluice
