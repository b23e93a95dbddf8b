// The batch size x backend x precision sweep.
#include "bench/sweep.h"

#include <fmt/format.h>

#include <map>

#include "bench/plot.h"

namespace sluice {
namespace {

std::string CellName(BackendVariant backend, Precision precision) {
  return fmt::format("{} {}", BackendVariantName(backend), PrecisionName(precision));
}

}  // namespace

bool SweepRuns(BackendVariant backend, Precision precision) {
  return precision != Precision::kInt8 || backend.kind == BackendKind::kAotInductor;
}

Result<std::vector<SweepCell>> RunSweep(const ModelConfig& base, const SweepOptions& options,
                                        const BackendLoader& loader,
                                        const SweepProgress& progress) {
  if (options.batch_sizes.empty() || options.backends.empty() || options.precisions.empty()) {
    return Status::InvalidArgument("sweep: batch sizes, backends and precisions need a value each");
  }
  for (int b : options.batch_sizes) {
    if (b < 1 || b > base.max_batch_size) {
      return Status::InvalidArgument(
          fmt::format("sweep: batch size {} must be between 1 and the model's max_batch_size {}", b,
                      base.max_batch_size));
    }
  }
  int pairs = 0;
  for (Precision precision : options.precisions) {
    for (BackendVariant backend : options.backends) pairs += SweepRuns(backend, precision);
  }
  if (pairs == 0) return Status::InvalidArgument("sweep: int8 runs on aotinductor only");
  const int count = static_cast<int>(options.batch_sizes.size()) * pairs;
  std::vector<SweepCell> cells;
  for (Precision precision : options.precisions) {
    for (BackendVariant backend : options.backends) {
      if (!SweepRuns(backend, precision)) continue;
      ModelConfig config = base;
      config.precision = precision;
      config.backend = backend.kind;
      config.model_file = DefaultModelFile(backend.kind, precision);
      config.optimize.freeze = backend.freeze;
      config.warmup_batch_sizes = options.batch_sizes;
      if (progress) {
        progress(static_cast<int>(cells.size()), count,
                 fmt::format("loading {}", CellName(backend, precision)));
      }
      auto backend_loaded = loader(config);
      if (!backend_loaded.ok()) return backend_loaded.status();
      config = LoadedConfig(config, **backend_loaded);
      std::vector<std::unique_ptr<BackendInstance>> owned;
      std::vector<BackendInstance*> instances;
      for (int i = 0; i < config.instances.workers(); ++i) {
        auto instance = (*backend_loaded)->CreateInstance(i);
        if (!instance.ok()) return instance.status();
        instances.push_back(instance->get());
        owned.push_back(std::move(*instance));
      }
      for (int batch : options.batch_sizes) {
        if (progress) {
          progress(static_cast<int>(cells.size()), count,
                   fmt::format("batch {} {}", batch, CellName(backend, precision)));
        }
        InProcessOptions run_options;
        run_options.batch_size = batch;
        run_options.iterations = options.iterations;
        run_options.max_in_flight = options.max_in_flight;
        auto run = RunInProcessPipeline(config, instances, run_options);
        if (!run.ok()) return run.status();
        cells.push_back(SweepCell{batch, backend, precision, (*backend_loaded)->load_report(),
                                  std::move(*run)});
      }
    }
  }
  return cells;
}

namespace {

// "" when absent (no GPU): an empty CSV field.
std::string OptionalNumber(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f}", *v) : std::string();
}

}  // namespace

std::string SweepSummaryCsv(const std::vector<SweepCell>& cells) {
  std::string csv =
      "batch_size,backend,precision,requests,errors,samples_per_s,requests_per_s,latency_mean_s,"
      "latency_std_s,latency_min_s,latency_max_s,p50_s,p90_s,p95_s,p99_s,warmup_latency_s,"
      "machine_cpu_pct,process_cpu_pct,model_load_s,optimize_s,gpu_util_pct,gpu_mem_mib\n";
  for (const SweepCell& c : cells) {
    const Summary& s = c.run.summary;
    const LatencyStats& l = s.latency;
    csv += fmt::format(
        "{},{},{},{},{},{:.3f},{:.3f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},"
        "{:.6f},{:.1f},{:.1f},{:.4f},{:.4f},{},{}\n",
        c.batch_size, BackendVariantName(c.backend), PrecisionName(c.precision), s.requests,
        s.requests - s.ok_requests, s.samples_per_second, s.requests_per_second, l.mean, l.std,
        l.min, l.max, l.p50, l.p90, l.p95, l.p99, s.warmup_latency.value_or(0),
        c.run.utilization.machine_cpu_percent, c.run.utilization.process_cpu_percent,
        c.load.load_seconds, c.load.optimize_seconds, OptionalNumber(c.run.utilization.gpu_percent),
        OptionalNumber(c.run.utilization.gpu_memory_mib));
  }
  return csv;
}

std::string FormatSweepTable(const std::vector<SweepCell>& cells) {
  std::string out =
      fmt::format("{:>5} {:>18} {:>9} {:>12} {:>11} {:>11} {:>11} {:>6}\n", "batch", "backend",
                  "precision", "samples/s", "mean ms", "p50 ms", "p99 ms", "cpu %");
  const bool gpu = !cells.empty() && cells.front().run.utilization.gpu_percent.has_value();
  if (gpu) out.insert(out.size() - 1, fmt::format(" {:>6}", "gpu %"));
  for (const SweepCell& c : cells) {
    const Summary& s = c.run.summary;
    out += fmt::format(
        "{:>5} {:>18} {:>9} {:>12.1f} {:>11.2f} {:>11.2f} {:>11.2f} {:>6.0f}{}{}\n", c.batch_size,
        BackendVariantName(c.backend), PrecisionName(c.precision), s.samples_per_second,
        s.latency.mean * 1e3, s.latency.p50 * 1e3, s.latency.p99 * 1e3,
        c.run.utilization.machine_cpu_percent,
        gpu ? fmt::format(" {:>6.0f}", c.run.utilization.gpu_percent.value_or(0)) : std::string(),
        s.requests == s.ok_requests ? "" : "  (errors)");
  }
  return out;
}

Status WriteSweepResults(const std::filesystem::path& dir, const RunInfo& info,
                         const ModelConfig& base, const SweepOptions& options,
                         const std::vector<SweepCell>& cells) {
  SLUICE_RETURN_IF_ERROR(WriteTextFile(
      dir / "run.json", RunJson(info, [&](JsonWriter& json) {
        json.BeginObject().Key("model");
        WriteModelConfigJson(json, base);
        json.Key("sweep").BeginObject().Key("batch_sizes").BeginArray();
        for (int b : options.batch_sizes) json.Int(b);
        json.EndArray().Key("backends").BeginArray();
        for (BackendVariant b : options.backends) json.String(BackendVariantName(b));
        json.EndArray().Key("precisions").BeginArray();
        for (Precision p : options.precisions) json.String(PrecisionName(p));
        json.EndArray().Field("iterations", options.iterations).EndObject().EndObject();
      })));
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.csv", SweepSummaryCsv(cells)));

  JsonWriter summary;
  summary.BeginObject().Key("cells").BeginArray();
  for (const SweepCell& c : cells) {
    summary.BeginObject()
        .Field("batch_size", c.batch_size)
        .Field("backend", BackendVariantName(c.backend))
        .Field("precision", PrecisionName(c.precision));
    WriteLoadFields(summary, c.load);
    WriteSummaryFields(summary, c.run.summary, c.run.utilization);
    summary.EndObject();
  }
  summary.EndArray().EndObject();
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.json", summary.str() + "\n"));
  std::vector<UtilizationPart> utilization;
  for (const SweepCell& c : cells) {
    utilization.push_back({fmt::format("{} b{}", CellName(c.backend, c.precision), c.batch_size),
                           c.run.utilization_samples});
  }
  SLUICE_RETURN_IF_ERROR(WriteUtilizationCsv(dir, utilization));
  // Each cell's requests, for its latency histogram.
  std::error_code ec;
  std::filesystem::create_directories(dir / "samples", ec);
  if (ec) return Status::Internal(fmt::format("cannot create {}/samples", dir.string()));
  for (const SweepCell& c : cells) {
    SLUICE_RETURN_IF_ERROR(
        WriteTextFile(dir / "samples" /
                          fmt::format("{}-{}-b{}.csv", BackendVariantName(c.backend),
                                      PrecisionName(c.precision), c.batch_size),
                      SamplesCsv(c.run.records)));
  }

  // One series per (backend, precision), in the order first seen.
  std::vector<std::string> order;
  std::map<std::string, PlotSeries> throughput, latency;
  for (const SweepCell& c : cells) {
    std::string name = CellName(c.backend, c.precision);
    if (!throughput.count(name)) order.push_back(name);
    throughput[name].name = name;
    latency[name].name = name;
    throughput[name].points.emplace_back(c.batch_size, c.run.summary.samples_per_second);
    latency[name].points.emplace_back(c.batch_size, c.run.summary.latency.mean * 1e3);
  }
  PlotSpec t{.title = fmt::format("{}: throughput vs batch size", base.name),
             .x_label = "batch size",
             .y_label = "samples per second",
             .log2_x = true,
             .series = {}};
  PlotSpec l{.title = fmt::format("{}: average latency vs batch size", base.name),
             .x_label = "batch size",
             .y_label = "average latency (ms)",
             .log2_x = true,
             .series = {}};
  for (const std::string& name : order) {
    t.series.push_back(throughput[name]);
    l.series.push_back(latency[name]);
  }
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "throughput_vs_batch_size.svg", RenderLinePlotSvg(t)));
  return WriteTextFile(dir / "latency_vs_batch_size.svg", RenderLinePlotSvg(l));
}

}  // namespace sluice
