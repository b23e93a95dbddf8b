// Result files.
#include "bench/results.h"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <ctime>
#include <fstream>
#include <optional>

#include "common/system_info.h"

namespace sluice {

Result<std::filesystem::path> CreateRunDirectory(const std::filesystem::path& base,
                                                 std::string_view label) {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  localtime_r(&now, &local);
  std::array<char, 32> stamp{};
  std::strftime(stamp.data(), stamp.size(), "%Y%m%d-%H%M%S", &local);
  std::string name = fmt::format("{}-{}", stamp.data(), label);
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec) return Status::Internal(fmt::format("cannot create {}: {}", base.string(), ec.message()));
  for (int n = 1; n < 1000; ++n) {
    std::filesystem::path dir = base / (n == 1 ? name : fmt::format("{}-{}", name, n));
    if (std::filesystem::create_directory(dir, ec)) return dir;
    if (ec)
      return Status::Internal(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  }
  return Status::Internal(fmt::format("no free run directory name under {}", base.string()));
}

Status WriteTextFile(const std::filesystem::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) return Status::Internal(fmt::format("cannot write {}", path.string()));
  return Status::Ok();
}

std::string RunJson(const RunInfo& info, const std::function<void(JsonWriter&)>& write_config) {
  JsonWriter json;
  json.BeginObject()
      .Field("started", LocalTimestamp())
      .Field("command", info.command_line)
      .Key("machine")
      .BeginObject()
      .Field("cpu_model", CpuModelName())
      .Field("cores", CoreCount())
      .EndObject()
      .Key("versions")
      .BeginObject()
      .Field("sluice", "0.1.0")
      .Field("runtime", info.runtime)
      .EndObject()
      .Field("git_commit", GitCommit())
      .Key("config");
  write_config(json);
  json.EndObject();
  return json.str() + "\n";
}

void WriteModelConfigJson(JsonWriter& json, const ModelConfig& c) {
  json.BeginObject()
      .Field("name", c.name)
      .Field("model_path", c.model_path().string())
      .Field("max_batch_size", c.max_batch_size)
      .Key("instances")
      .BeginObject()
      .Field("count", c.instances.count)
      .Field("device", c.instances.device)
      .Field("threads", c.instances.threads)
      .Field("shared_cores", c.instances.share_cores ? c.instances.pool_cores : 0)
      .EndObject()
      .Field("precision", PrecisionName(c.precision));
  // The report's configuration table shows it: how `precision: auto` chose.
  if (!c.precision_auto_note.empty()) json.Field("precision_auto", c.precision_auto_note);
  json.Key("optimize")
      .BeginObject()
      .Field("freeze", c.optimize.freeze)
      .Field("channels_last", c.optimize.channels_last)
      .EndObject()
      .Key("inputs")
      .BeginArray();
  for (const TensorSpec& s : c.inputs) {
    json.BeginObject().Field("name", s.name).Field("datatype", DataTypeName(s.datatype));
    json.Key("shape").BeginArray();
    for (int64_t d : s.shape) json.Int(d);
    json.EndArray().EndObject();
  }
  json.EndArray().Key("warmup_batch_sizes").BeginArray();
  for (int b : c.warmup_batch_sizes) json.Int(b);
  json.EndArray().EndObject();
}

void WriteLoadFields(JsonWriter& json, const LoadReport& load) {
  json.Field("model_load_seconds", load.load_seconds)
      .Field("optimize_seconds", load.optimize_seconds)
      .Field("engine_warmup_seconds", load.warmup_seconds);
}

void WriteSummaryFields(JsonWriter& json, const Summary& s, const UtilizationAverages& u) {
  json.Field("requests", s.requests)
      .Field("ok_requests", s.ok_requests)
      .Field("ok_samples", s.ok_samples)
      .Key("errors")
      .BeginObject();
  for (const auto& [kind, count] : s.errors) json.Field(kind, count);
  json.EndObject().Key("warmup_latency_seconds");
  if (s.warmup_latency) {
    json.Double(*s.warmup_latency);
  } else {
    json.Null();
  }
  const LatencyStats& l = s.latency;
  json.Key("latency_seconds")
      .BeginObject()
      .Field("mean", l.mean)
      .Field("std", l.std)
      .Field("min", l.min)
      .Field("max", l.max)
      .Field("p50", l.p50)
      .Field("p90", l.p90)
      .Field("p95", l.p95)
      .Field("p99", l.p99)
      .Field("p99.9", l.p999)
      .EndObject()
      .Field("duration_seconds", s.duration_seconds)
      .Field("samples_per_second", s.samples_per_second)
      .Field("requests_per_second", s.requests_per_second)
      .Key("utilization")
      .BeginObject()
      .Field("samples", u.samples)
      .Field("machine_cpu_percent", u.machine_cpu_percent)
      .Field("process_cpu_percent", u.process_cpu_percent)
      .Key("gpu_percent");
  u.gpu_percent ? json.Double(*u.gpu_percent) : json.Null();
  json.Key("gpu_memory_mib");
  u.gpu_memory_mib ? json.Double(*u.gpu_memory_mib) : json.Null();
  json.EndObject();
}

std::string SamplesCsv(std::span<const RequestRecord> records) {
  std::string csv =
      "index,request_time_s,response_time_s,latency_s,samples,outcome,worker,warmup\n";
  if (records.empty()) return csv;
  Clock::time_point origin = records.front().request_time;
  for (const RequestRecord& r : records) origin = std::min(origin, r.request_time);
  for (size_t i = 0; i < records.size(); ++i) {
    const RequestRecord& r = records[i];
    csv += fmt::format(
        "{},{:.9f},{:.9f},{:.9f},{},{},{},{}\n", i, SecondsBetween(origin, r.request_time),
        SecondsBetween(origin, r.response_time), r.latency_seconds(), r.samples,
        StatusCodeName(r.outcome), r.worker, r.request_time == origin && i == 0 ? 1 : 0);
  }
  return csv;
}

Status WriteUtilizationCsv(const std::filesystem::path& dir,
                           const std::vector<UtilizationPart>& parts) {
  std::optional<Clock::time_point> origin;
  std::string csv =
      "label,time_s,machine_cpu_percent,process_cpu_percent,gpu_percent,gpu_memory_mib\n";
  for (const UtilizationPart& part : parts) {
    for (const UtilizationSample& s : part.samples) {
      if (!origin) origin = s.time;
      csv += fmt::format("{},{:.3f},{:.2f},{:.2f},", part.label, SecondsBetween(*origin, s.time),
                         s.machine_cpu_percent, s.process_cpu_percent);
      csv +=
          s.gpu ? fmt::format("{:.2f},{:.1f}\n", s.gpu->utilization_percent, s.gpu->memory_used_mib)
                : std::string(",\n");
    }
  }
  if (!origin) return Status::Ok();
  return WriteTextFile(dir / "utilization.csv", csv);
}

void TraceInProcessRecords(std::span<const RequestRecord> records, std::string_view model,
                           TraceWriter& tracer) {
  std::vector<const RequestRecord*> order;
  for (const RequestRecord& r : records) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [](const RequestRecord* a, const RequestRecord* b) {
    return a->request_time < b->request_time;
  });
  TraceLanes lanes;
  for (const RequestRecord* r : order) {
    if (!tracer.ShouldSample()) continue;
    RequestTrace trace;
    trace.name = fmt::format("infer {}", model);
    trace.model = std::string(model);
    trace.start = r->request_time;
    trace.lane = lanes.Assign(r->request_time, r->response_time);
    trace.status = r->outcome == StatusCode::kOk ? 200 : HttpStatusFor(r->outcome);
    if (r->engine.enqueue != Clock::time_point{}) {
      trace.End(TraceStage::kSubmit, r->engine.enqueue);
      trace.End(TraceStage::kQueue, r->engine.dispatch);
      trace.End(TraceStage::kBatch, r->engine.compute_start);
      trace.End(TraceStage::kCompute, r->engine.compute_end);
      trace.batch_id = r->batch_id;
      trace.batch_size = r->batch_size;
      trace.instance = r->worker;
    } else if (r->start_time != Clock::time_point{}) {
      trace.End(TraceStage::kQueue, r->start_time);
      trace.End(TraceStage::kCompute, r->response_time);
      trace.instance = r->worker;
    }
    trace.End(TraceStage::kComplete, r->response_time);
    tracer.Record(std::move(trace));
  }
}

Status WriteBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                         const ModelConfig& config, const InProcessOptions& options,
                         const LoadReport& load, const BenchRun& run) {
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "run.json", RunJson(info, [&](JsonWriter& json) {
                                         json.BeginObject().Key("model");
                                         WriteModelConfigJson(json, config);
                                         json.Key("bench")
                                             .BeginObject()
                                             .Field("mode", "in-process")
                                             .Field("batch_size", options.batch_size)
                                             .Field("iterations", options.iterations)
                                             .Field("max_in_flight", options.max_in_flight)
                                             .Field("distinct_payloads", options.distinct_payloads)
                                             .Field("seed", static_cast<int64_t>(options.seed))
                                             .EndObject()
                                             .EndObject();
                                       })));
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "samples.csv", SamplesCsv(run.records)));
  SLUICE_RETURN_IF_ERROR(WriteUtilizationCsv(dir, {{"run", run.utilization_samples}}));
  JsonWriter summary;
  summary.BeginObject();
  WriteLoadFields(summary, load);
  WriteSummaryFields(summary, run.summary, run.utilization);
  summary.EndObject();
  return WriteTextFile(dir / "summary.json", summary.str() + "\n");
}

}  // namespace sluice
