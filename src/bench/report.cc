// report.html, read back from result files.
#include "bench/report.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "bench/plot.h"
#include "bench/results.h"
#include "common/system_info.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using Element = simdjson::dom::element;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::optional<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A parsed JSON file; the parser must outlive the elements taken from it.
struct JsonFile {
  simdjson::dom::parser parser;
  Element root;
};

Result<std::unique_ptr<JsonFile>> ReadJson(const fs::path& path) {
  auto text = ReadText(path);
  if (!text) return Status::NotFound(fmt::format("no {}", path.string()));
  auto file = std::make_unique<JsonFile>();
  if (file->parser.parse(*text).get(file->root) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{} is not valid JSON", path.string()));
  }
  return file;
}

// The number at `key` (NaN when absent or not a number).
double Num(Element e, std::string_view key) {
  double v = kNaN;
  Element child;
  if (e[key].get(child) != simdjson::SUCCESS) return kNaN;
  if ((child.is_double() || child.is_int64() || child.is_uint64()) &&
      child.get_double().get(v) != simdjson::SUCCESS) {
    v = kNaN;
  }
  return v;
}
std::string Str(Element e, std::string_view key) {
  std::string_view v;
  if (e[key].get_string().get(v) != simdjson::SUCCESS) return "";
  return std::string(v);
}

// "a.b.c" -> value for every scalar under `e`.
void Flatten(Element e, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT:
      for (auto [key, value] : e.get_object()) {
        Flatten(value, prefix.empty() ? std::string(key) : prefix + "." + std::string(key), out);
      }
      break;
    case simdjson::dom::element_type::ARRAY: {
      bool scalars = true;
      for (Element item : e.get_array()) {
        scalars &= item.type() != simdjson::dom::element_type::OBJECT &&
                   item.type() != simdjson::dom::element_type::ARRAY;
      }
      if (scalars) {
        std::string joined;
        for (Element item : e.get_array()) {
          if (!joined.empty()) joined += ", ";
          std::string_view s;
          joined += item.get_string().get(s) == simdjson::SUCCESS ? std::string(s)
                                                                  : simdjson::minify(item);
        }
        out.emplace_back(prefix, "[" + joined + "]");
      } else {
        size_t i = 0;
        for (Element item : e.get_array()) Flatten(item, fmt::format("{}[{}]", prefix, i++), out);
      }
      break;
    }
    case simdjson::dom::element_type::STRING:
      out.emplace_back(prefix, std::string(e.get_string().value()));
      break;
    default:
      out.emplace_back(prefix, simdjson::minify(e));
  }
}

// Rows of a CSV file with a header line, as header -> field (fields hold no quoted commas but
// a trailing free-text one, which is not read).
std::vector<std::map<std::string, std::string>> ReadCsv(const fs::path& path) {
  std::vector<std::map<std::string, std::string>> rows;
  auto text = ReadText(path);
  if (!text) return rows;
  std::vector<std::string> header;
  size_t start = 0;
  while (start < text->size()) {
    size_t end = text->find('\n', start);
    if (end == std::string::npos) end = text->size();
    std::string_view line(text->data() + start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    std::vector<std::string> fields;
    size_t from = 0;
    while (true) {
      size_t comma = line.find(',', from);
      fields.emplace_back(
          line.substr(from, comma == std::string_view::npos ? line.npos : comma - from));
      if (comma == std::string_view::npos) break;
      from = comma + 1;
    }
    if (header.empty()) {
      header = std::move(fields);
      continue;
    }
    std::map<std::string, std::string>& row = rows.emplace_back();
    for (size_t i = 0; i < header.size() && i < fields.size(); ++i) row[header[i]] = fields[i];
  }
  return rows;
}

double ToDouble(const std::string& s) {
  if (s.empty()) return kNaN;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  return end == s.c_str() ? kNaN : v;
}

std::string F(double v, int digits = 1) {
  if (!std::isfinite(v)) return "–";
  return fmt::format("{:.{}f}", v, digits);
}
std::string Ms(double seconds) { return F(seconds * 1e3, 2); }

// Latencies (ms) of a samples CSV, the warm-up row left out.
std::vector<double> SampleLatenciesMs(const fs::path& path) {
  std::vector<double> out;
  for (auto& row : ReadCsv(path)) {
    if (row["warmup"] == "1") continue;
    double v = ToDouble(row["latency_s"]);
    if (std::isfinite(v)) out.push_back(v * 1e3);
  }
  return out;
}

// Histograms of several latency sets on shared bins from the lowest p0.5 to the highest p99.5
// (requests outside go in the end bins), as % of each set's requests.
std::optional<std::string> HistogramPlot(
    const std::string& title,
    const std::vector<std::pair<std::string, std::vector<double>>>& sets) {
  double lo = std::numeric_limits<double>::max(), hi = 0;
  for (const auto& [name, values] : sets) {
    if (values.empty()) continue;
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    lo = std::min(lo, v[static_cast<size_t>(0.005 * static_cast<double>(v.size() - 1))]);
    hi = std::max(hi, v[static_cast<size_t>(0.995 * static_cast<double>(v.size() - 1))]);
  }
  if (!(hi > 0)) return std::nullopt;
  if (!(hi > lo)) lo = 0;
  constexpr int kBins = 40;
  const double width = (hi - lo) / kBins;
  PlotSpec spec{title, "latency (ms)", "% of requests", false, {}};
  for (const auto& [name, values] : sets) {
    if (values.empty()) continue;
    std::vector<double> counts(kBins, 0);
    for (double v : values) {
      counts[static_cast<size_t>(std::clamp(static_cast<int>((v - lo) / width), 0, kBins - 1))] +=
          1;
    }
    PlotSeries series{name, {}};
    for (int b = 0; b < kBins; ++b) {
      series.points.emplace_back(lo + (b + 0.5) * width,
                                 100.0 * counts[static_cast<size_t>(b)] / values.size());
    }
    spec.series.push_back(std::move(series));
  }
  return RenderLinePlotSvg(spec);
}

// CPU (and GPU) utilisation over the run, from utilization.csv.
// `process` names whose CPU the process column is (the bench's own process over HTTP).
std::optional<std::string> UtilizationPlot(const fs::path& dir, const std::string& title,
                                           const std::string& process = "process CPU %") {
  auto rows = ReadCsv(dir / "utilization.csv");
  if (rows.empty()) return std::nullopt;
  PlotSeries machine{"machine CPU %", {}}, own{process, {}}, gpu{"GPU %", {}};
  for (auto& row : rows) {
    const double t = ToDouble(row["time_s"]);
    machine.points.emplace_back(t, ToDouble(row["machine_cpu_percent"]));
    own.points.emplace_back(t, ToDouble(row["process_cpu_percent"]));
    const double g = ToDouble(row["gpu_percent"]);
    if (std::isfinite(g)) gpu.points.emplace_back(t, g);
  }
  PlotSpec spec{title, "time (s)", "utilisation (%)", false, {machine, own}};
  if (!gpu.points.empty()) spec.series.push_back(gpu);
  return RenderLinePlotSvg(spec);
}

// The machine and versions from run.json, then the configuration.
void ReadAbout(Element run, ReportRun& out) {
  out.about = {{"command", Str(run, "command")},
               {"started", Str(run, "started")},
               {"folder", out.dir.string()}};
  Element machine;
  if (run["machine"].get(machine) == simdjson::SUCCESS) {
    out.about.emplace_back("CPU", Str(machine, "cpu_model"));
    out.about.emplace_back("cores", F(Num(machine, "cores"), 0));
  }
  Element versions;
  if (run["versions"].get(versions) == simdjson::SUCCESS) {
    out.about.emplace_back("sluice", Str(versions, "sluice"));
    out.about.emplace_back("libtorch", Str(versions, "runtime"));
  }
  out.about.emplace_back("commit", Str(run, "git_commit"));
  Element config;
  if (run["config"].get(config) == simdjson::SUCCESS) Flatten(config, "", out.config);
}

// The columns every latency summary (WriteSummaryFields) gives.
std::vector<std::string> SummaryCells(Element s) {
  Element l;
  if (s["latency_seconds"].get(l) != simdjson::SUCCESS) return {};
  Element u;
  double machine = kNaN, process = kNaN;
  // Too short a run for a sample (one every 100 ms) has no utilisation, not 0%.
  if (s["utilization"].get(u) == simdjson::SUCCESS && Num(u, "samples") > 0) {
    machine = Num(u, "machine_cpu_percent");
    process = Num(u, "process_cpu_percent");
  }
  const double requests = Num(s, "requests"), ok = Num(s, "ok_requests");
  return {F(requests, 0),
          F(requests - ok, 0),
          F(Num(s, "samples_per_second")),
          F(Num(s, "requests_per_second")),
          Ms(Num(l, "mean")) + " ± " + Ms(Num(l, "std")),
          Ms(Num(l, "p50")),
          Ms(Num(l, "p90")),
          Ms(Num(l, "p99")),
          Ms(Num(l, "p99.9")),
          Ms(Num(l, "max")),
          F(machine, 0) + " / " + F(process, 0)};
}
const std::vector<std::string> kSummaryHeader = {
    "requests", "errors", "samples/s", "requests/s", "mean ± std ms",          "p50 ms",
    "p90 ms",   "p99 ms", "p99.9 ms",  "max ms",     "CPU % machine / process"};

void ReadInProcess(Element run, Element summary, ReportRun& out) {
  Element bench = run["config"]["bench"];
  out.kind = "in-process bench";
  out.model = Str(run["config"]["model"], "name");
  out.title = fmt::format("In-process bench of {} (batch size {})", out.model,
                          F(Num(bench, "batch_size"), 0));
  ReportTable t{"Summary (warm-up excluded)", kSummaryHeader, {SummaryCells(summary)}};
  out.tables.push_back(t);
  out.tables.push_back(
      {"Load and warm-up",
       {"model load s", "optimise s", "engine warm-up s", "first request ms"},
       {{F(Num(summary, "model_load_seconds"), 3), F(Num(summary, "optimize_seconds"), 3),
         F(Num(summary, "engine_warmup_seconds"), 3),
         Ms(Num(summary, "warmup_latency_seconds"))}}});
  out.throughput_unit = "samples/s";
  out.throughput = {{"run", Num(summary, "samples_per_second")}};
  out.p99_ms = {{"run", Num(summary["latency_seconds"], "p99") * 1e3}};

  // The engine ceiling, when compared.
  if (auto ceiling = ReadJson(out.dir / "ceiling.json"); ceiling.ok()) {
    Element c = (*ceiling)->root;
    ReportTable rounds{"Pipeline against the engine ceiling (interleaved rounds)",
                       {"round", "ceiling samples/s", "pipeline samples/s", "pipeline / ceiling"},
                       {}};
    int i = 0;
    for (Element r : c["rounds"].get_array()) {
      rounds.rows.push_back({F(++i, 0), F(Num(r, "ceiling_samples_per_second")),
                             F(Num(r, "pipeline_samples_per_second")), F(Num(r, "ratio"), 3)});
    }
    rounds.rows.push_back({"median", F(Num(c, "median_ceiling_samples_per_second")),
                           F(Num(c, "median_pipeline_samples_per_second")),
                           F(Num(c, "median_ratio"), 3)});
    out.tables.push_back(rounds);
    out.kind = "in-process bench against the ceiling";
  }

  // Latency over the run (100 time bins: mean and max) and its histogram.
  auto rows = ReadCsv(out.dir / "samples.csv");
  std::vector<std::pair<double, double>> points;  // (request time s, latency ms)
  for (auto& row : rows) {
    if (row["warmup"] == "1") continue;
    points.emplace_back(ToDouble(row["request_time_s"]), ToDouble(row["latency_s"]) * 1e3);
  }
  if (!points.empty()) {
    double t_end = 0;
    for (auto [t, l] : points) t_end = std::max(t_end, t);
    constexpr int kBins = 100;
    std::vector<double> sum(kBins, 0), max(kBins, 0), count(kBins, 0);
    for (auto [t, l] : points) {
      size_t b = static_cast<size_t>(
          std::clamp(static_cast<int>(t / std::max(t_end, 1e-9) * kBins), 0, kBins - 1));
      sum[b] += l;
      count[b] += 1;
      max[b] = std::max(max[b], l);
    }
    PlotSeries mean{"mean", {}}, worst{"max", {}};
    for (size_t b = 0; b < kBins; ++b) {
      if (count[b] == 0) continue;
      const double t = (static_cast<double>(b) + 0.5) * t_end / kBins;
      mean.points.emplace_back(t, sum[b] / count[b]);
      worst.points.emplace_back(t, max[b]);
    }
    out.plots.push_back(RenderLinePlotSvg(
        {out.model + ": latency over the run", "time (s)", "latency (ms)", false, {mean, worst}}));
    std::vector<double> latencies;
    for (auto [t, l] : points) latencies.push_back(l);
    if (auto h = HistogramPlot(out.model + ": latency histogram", {{"requests", latencies}})) {
      out.plots.push_back(*h);
    }
  }
  if (auto u = UtilizationPlot(out.dir, out.model + ": utilisation over time")) {
    out.plots.push_back(*u);
  }
}

void ReadHttp(Element run, Element summary, ReportRun& out) {
  Element config = run["config"];
  const std::string transport = Str(config, "transport");
  const bool grpc = transport == "grpc";
  out.kind = grpc ? "gRPC bench" : "HTTP bench";
  out.model = Str(config, "model");
  const std::string form =
      Str(config, "endpoint") == "v2" || Str(config, "endpoint").empty()
          ? (simdjson::minify(config["binary"]) == "true" ? (grpc ? "raw" : "binary")
                                                          : (grpc ? "typed" : "JSON"))
          : Str(config, "endpoint");
  out.title = fmt::format("{} of {} at {} ({})", out.kind, out.model, Str(config, "url"), form);
  out.throughput_unit = "requests/s";
  out.x_label = "concurrency (connections)";
  std::vector<std::string> header = {"connections", "rate"};
  header.insert(header.end(), kSummaryHeader.begin(), kSummaryHeader.end());
  header.push_back("server batch");
  ReportTable table{"Levels (warm-up excluded)", header, {}};
  PlotSeries rps{out.model, {}}, p50{"p50", {}}, p90{"p90", {}}, p99{"p99", {}};
  PlotSeries curve50{"p50", {}}, curve99{"p99", {}};
  std::vector<std::pair<std::string, std::vector<double>>> histograms;
  for (Element level : summary["levels"].get_array()) {
    const double c = Num(level, "concurrency"), rate = Num(level, "rate");
    std::vector<std::string> row = {F(c, 0), rate > 0 ? F(rate, 0) : "closed"};
    std::vector<std::string> cells = SummaryCells(level);
    row.insert(row.end(), cells.begin(), cells.end());
    row.push_back(F(Num(level, "server_mean_batch_size")));
    table.rows.push_back(row);
    const double r = Num(level, "requests_per_second");
    Element l = level["latency_seconds"];
    const std::string key = rate > 0 ? fmt::format("{:g} requests/s offered", rate)
                                     : fmt::format("{:g} connections", c);
    out.throughput.emplace_back(key, r);
    out.p99_ms.emplace_back(key, Num(l, "p99") * 1e3);
    curve50.points.emplace_back(r, Num(l, "p50") * 1e3);
    curve99.points.emplace_back(r, Num(l, "p99") * 1e3);
    const std::string samples = rate > 0 ? fmt::format("samples_rate{:.0f}.csv", rate)
                                         : fmt::format("samples_c{:g}.csv", c);
    histograms.emplace_back(rate > 0 ? fmt::format("{:g}/s", rate) : fmt::format("c{:g}", c),
                            SampleLatenciesMs(out.dir / samples));
    if (rate > 0) continue;
    rps.points.emplace_back(c, r);
    out.throughput_by_x.emplace_back(c, r);
    p50.points.emplace_back(c, Num(l, "p50") * 1e3);
    p90.points.emplace_back(c, Num(l, "p90") * 1e3);
    p99.points.emplace_back(c, Num(l, "p99") * 1e3);
  }
  out.tables.push_back(table);
  if (!rps.points.empty()) {
    out.plots.push_back(RenderLinePlotSvg(
        {out.model + ": throughput vs concurrency", out.x_label, "requests/s", true, {rps}}));
    out.plots.push_back(RenderLinePlotSvg({out.model + ": latency vs concurrency",
                                           out.x_label,
                                           "latency (ms)",
                                           true,
                                           {p50, p90, p99}}));
  }
  if (!curve50.points.empty()) {
    out.plots.push_back(RenderLinePlotSvg({out.model + ": latency against throughput",
                                           "requests/s",
                                           "latency (ms)",
                                           false,
                                           {curve50, curve99}}));
  }
  if (auto h = HistogramPlot(out.model + ": latency histograms by level", histograms)) {
    out.plots.push_back(*h);
  }
  if (auto u = UtilizationPlot(out.dir, out.model + ": utilisation over time (all levels)",
                               "bench CPU %")) {
    out.plots.push_back(*u);
  }
}

void ReadSweep(Element run, Element summary, ReportRun& out) {
  out.kind = "sweep";
  out.model = Str(run["config"]["model"], "name");
  out.title = fmt::format("Sweep of {} (batch size × backend × precision)", out.model);
  out.throughput_unit = "samples/s";
  out.x_label = "batch size";
  std::vector<std::string> header = {"batch", "backend", "precision"};
  header.insert(header.end(), kSummaryHeader.begin(), kSummaryHeader.end());
  header.push_back("load s");
  ReportTable table{"Cells (warm-up excluded)", header, {}};
  std::vector<std::string> order;
  std::map<std::string, PlotSeries> throughput, latency, curve, cpu;
  for (Element cell : summary["cells"].get_array()) {
    const double b = Num(cell, "batch_size");
    const std::string name = Str(cell, "backend") + " " + Str(cell, "precision");
    std::vector<std::string> row = {F(b, 0), Str(cell, "backend"), Str(cell, "precision")};
    std::vector<std::string> cells = SummaryCells(cell);
    row.insert(row.end(), cells.begin(), cells.end());
    row.push_back(F(Num(cell, "model_load_seconds"), 2));
    table.rows.push_back(row);
    if (!throughput.count(name)) order.push_back(name);
    const double sps = Num(cell, "samples_per_second");
    Element l = cell["latency_seconds"];
    throughput[name].points.emplace_back(b, sps);
    latency[name].points.emplace_back(b, Num(l, "p50") * 1e3);
    curve[name].points.emplace_back(sps, Num(l, "p50") * 1e3);
    cpu[name].points.emplace_back(b, Num(cell["utilization"], "samples") > 0
                                         ? Num(cell["utilization"], "machine_cpu_percent")
                                         : kNaN);
    const std::string key = fmt::format("batch {:g}, {}", b, name);
    out.throughput.emplace_back(key, sps);
    out.p99_ms.emplace_back(key, Num(l, "p99") * 1e3);
    if (out.throughput_by_x.size() < 64 && name == order.front()) {
      out.throughput_by_x.emplace_back(b, sps);
    }
  }
  out.tables.push_back(table);
  auto series = [&](std::map<std::string, PlotSeries>& by_name) {
    std::vector<PlotSeries> s;
    for (const std::string& name : order) {
      by_name[name].name = name;
      s.push_back(by_name[name]);
    }
    return s;
  };
  out.plots.push_back(RenderLinePlotSvg({out.model + ": throughput vs batch size", "batch size",
                                         "samples/s", true, series(throughput)}));
  out.plots.push_back(RenderLinePlotSvg({out.model + ": p50 latency vs batch size", "batch size",
                                         "latency (ms)", true, series(latency)}));
  out.plots.push_back(RenderLinePlotSvg({out.model + ": latency against throughput (batch sizes)",
                                         "samples/s", "p50 latency (ms)", false, series(curve)}));
  std::vector<PlotSeries> cpu_series = series(cpu);
  std::erase_if(cpu_series, [](const PlotSeries& s) {
    return std::none_of(s.points.begin(), s.points.end(),
                        [](const auto& p) { return std::isfinite(p.second); });
  });
  if (!cpu_series.empty()) {
    out.plots.push_back(RenderLinePlotSvg({out.model + ": machine CPU by cell (cells of 100 ms+)",
                                           "batch size", "machine CPU (%)", true, cpu_series}));
  }
  // Latency histograms at each series' largest batch size (samples/<backend>-<precision>-b<n>.csv).
  std::map<std::string, std::pair<double, std::string>> largest;  // series -> (batch, file)
  for (Element cell : summary["cells"].get_array()) {
    const double b = Num(cell, "batch_size");
    const std::string name = Str(cell, "backend") + " " + Str(cell, "precision");
    if (!largest.count(name) || largest[name].first < b) {
      largest[name] = {
          b, fmt::format("{}-{}-b{:g}.csv", Str(cell, "backend"), Str(cell, "precision"), b)};
    }
  }
  std::vector<std::pair<std::string, std::vector<double>>> histograms;
  std::set<double> batches;
  for (const std::string& name : order) {
    auto latencies = SampleLatenciesMs(out.dir / "samples" / largest[name].second);
    if (latencies.empty()) continue;
    batches.insert(largest[name].first);
    histograms.emplace_back(fmt::format("{} b{:g}", name, largest[name].first),
                            std::move(latencies));
  }
  if (auto h = HistogramPlot(
          out.model + (batches.size() == 1
                           ? fmt::format(": latency histograms at batch {:g}", *batches.begin())
                           : std::string(": latency histograms at each largest batch")),
          histograms)) {
    out.plots.push_back(*h);
  }
  if (auto u = UtilizationPlot(out.dir, out.model + ": utilisation over time (all cells)")) {
    out.plots.push_back(*u);
  }
}

void ReadLlm(Element run, Element summary, ReportRun& out) {
  Element config = run["config"];
  out.kind = "LLM bench";
  out.model = Str(config, "model");
  out.title = fmt::format("LLM bench of {} at {} ({:g} prompt, {:g} output tokens)", out.model,
                          Str(config, "url"), Num(config, "mean_prompt_tokens"),
                          Num(config, "output_tokens"));
  out.throughput_unit = "output tokens/s";
  out.x_label = "concurrent streams";
  ReportTable table{
      "Levels",
      {"streams", "rate", "ok / requests", "output tokens/s", "TTFT median ms", "TTFT p99 ms",
       "TPOT median ms", "TPOT p99 ms", "ITL median ms", "E2EL median ms"},
      {}};
  PlotSeries tokens{"output tokens/s", {}}, ttft{"TTFT median", {}}, ttft99{"TTFT p99", {}},
      tpot{"TPOT median", {}}, curve{"E2EL median", {}};
  std::vector<std::pair<std::string, std::vector<double>>> histograms;
  for (Element level : summary["levels"].get_array()) {
    const double c = Num(level, "concurrency"), rate = Num(level, "rate");
    const double tps = Num(level, "output_tokens_per_second");
    table.rows.push_back({F(c, 0), rate > 0 ? F(rate, 1) : "closed",
                          F(Num(level, "ok"), 0) + " / " + F(Num(level, "requests"), 0), F(tps),
                          F(Num(level["ttft"], "median_ms")), F(Num(level["ttft"], "p99_ms")),
                          F(Num(level["tpot"], "median_ms"), 2), F(Num(level["tpot"], "p99_ms"), 2),
                          F(Num(level["itl"], "median_ms"), 2),
                          F(Num(level["e2el"], "median_ms"))});
    const std::string key =
        rate > 0 ? fmt::format("{:g} requests/s", rate) : fmt::format("{:g} streams", c);
    out.throughput.emplace_back(key, tps);
    out.p99_ms.emplace_back(key, Num(level["e2el"], "p99_ms"));
    curve.points.emplace_back(tps, Num(level["e2el"], "median_ms"));
    std::vector<double> e2el;
    const std::string file =
        c > 0 ? fmt::format("requests-c{:g}.csv", c) : fmt::format("requests-r{:g}.csv", rate);
    for (auto& row : ReadCsv(out.dir / file)) {
      if (row["ok"] != "1") continue;
      e2el.push_back((ToDouble(row["done_s"]) - ToDouble(row["sent_s"])) * 1e3);
    }
    histograms.emplace_back(c > 0 ? fmt::format("{:g} streams", c) : fmt::format("{:g}/s", rate),
                            e2el);
    if (c <= 0) continue;
    tokens.points.emplace_back(c, tps);
    out.throughput_by_x.emplace_back(c, tps);
    ttft.points.emplace_back(c, Num(level["ttft"], "median_ms"));
    ttft99.points.emplace_back(c, Num(level["ttft"], "p99_ms"));
    tpot.points.emplace_back(c, Num(level["tpot"], "median_ms"));
  }
  out.tables.push_back(table);
  if (!tokens.points.empty()) {
    out.plots.push_back(RenderLinePlotSvg({out.model + ": output tokens/s vs streams",
                                           out.x_label,
                                           "output tokens/s",
                                           true,
                                           {tokens}}));
    out.plots.push_back(RenderLinePlotSvg(
        {out.model + ": time to first token", out.x_label, "TTFT (ms)", true, {ttft, ttft99}}));
    out.plots.push_back(RenderLinePlotSvg(
        {out.model + ": time per output token", out.x_label, "TPOT (ms)", true, {tpot}}));
  }
  if (!curve.points.empty()) {
    out.plots.push_back(RenderLinePlotSvg({out.model + ": latency against throughput",
                                           "output tokens/s",
                                           "end-to-end latency (ms)",
                                           false,
                                           {curve}}));
  }
  if (auto h = HistogramPlot(out.model + ": end-to-end latency histograms", histograms)) {
    out.plots.push_back(*h);
  }
}

// The libtorch profiler's operators (profile-*-ops.json, one per instance), summed.
void ReadProfile(ReportRun& out) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("profile-", 0) == 0 && name.size() > 9 &&
        name.compare(name.size() - 9, 9, "-ops.json") == 0) {
      files.push_back(entry.path());
    }
  }
  if (files.empty()) return;
  std::sort(files.begin(), files.end());
  struct Totals {
    double calls = 0, self_ms = 0, total_ms = 0;
  };
  std::map<std::string, Totals> ops;
  double runs = 0, self_sum = 0;
  std::vector<std::string> traces;
  for (const fs::path& file : files) {
    auto json = ReadJson(file);
    if (!json.ok()) continue;
    Element root = (*json)->root;
    runs += Num(root, "runs");
    traces.push_back(Str(root, "trace"));
    simdjson::dom::array list;
    if (root["operators"].get_array().get(list) != simdjson::SUCCESS) continue;
    for (Element op : list) {
      Totals& t = ops[Str(op, "name")];
      t.calls += Num(op, "calls");
      t.self_ms += Num(op, "self_ms");
      t.total_ms += Num(op, "total_ms");
      self_sum += Num(op, "self_ms");
    }
  }
  std::vector<std::pair<std::string, Totals>> ranked(ops.begin(), ops.end());
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.second.self_ms > b.second.self_ms; });
  std::string joined;
  for (const std::string& t : traces) joined += (joined.empty() ? "" : ", ") + t;
  ReportTable table{fmt::format("Top operators by self time (libtorch profiler, {:g} model runs; "
                                "traces: {})",
                                runs, joined),
                    {"operator", "calls", "self ms", "total ms", "self % of listed"},
                    {}};
  for (size_t i = 0; i < ranked.size() && i < 20; ++i) {
    const auto& [name, t] = ranked[i];
    table.rows.push_back({name, F(t.calls, 0), F(t.self_ms, 3), F(t.total_ms, 3),
                          F(self_sum > 0 ? 100 * t.self_ms / self_sum : 0, 1)});
  }
  out.tables.push_back(table);
}

std::string Table(const ReportTable& t) {
  std::string html =
      fmt::format("<h3>{}</h3>\n<table class=\"data\"><thead><tr>", EscapeXml(t.title));
  for (const std::string& h : t.header) html += "<th>" + EscapeXml(h) + "</th>";
  html += "</tr></thead><tbody>\n";
  for (const auto& row : t.rows) {
    html += "<tr>";
    for (const std::string& cell : row) html += "<td>" + EscapeXml(cell) + "</td>";
    html += "</tr>\n";
  }
  return html + "</tbody></table>\n";
}

std::string Figure(const std::string& svg) {
  // The SVG's own XML prolog-free document is valid inline HTML.
  return "<figure class=\"plot\">" + svg + "</figure>\n";
}

// Runs of one kind and model, compared with the first of them at the keys they share.
std::string Comparisons(const std::vector<ReportRun>& runs) {
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> groups;
  std::vector<std::pair<std::string, std::string>> order;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto key = std::make_pair(runs[i].kind, runs[i].model);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(i);
  }
  std::string html;
  for (const auto& key : order) {
    const std::vector<size_t>& members = groups[key];
    if (members.size() < 2) continue;
    const ReportRun& base = runs[members[0]];
    ReportTable t{fmt::format("{} of {}: {} runs against run {}", key.first, key.second,
                              members.size(), members[0] + 1),
                  {"level"},
                  {}};
    for (size_t m : members) {
      t.header.push_back(fmt::format("run {} {}", m + 1, base.throughput_unit));
      if (m != members[0]) {
        t.header.push_back(fmt::format("run {} / run {}", m + 1, members[0] + 1));
        t.header.push_back(fmt::format("p99 run {} / run {}", m + 1, members[0] + 1));
      }
    }
    for (size_t k = 0; k < base.throughput.size(); ++k) {
      const std::string& level = base.throughput[k].first;
      const double value = base.throughput[k].second;
      std::vector<std::string> row = {level, F(value)};
      bool shared = true;
      for (size_t j = 1; j < members.size(); ++j) {
        const ReportRun& other = runs[members[j]];
        auto it = std::find_if(other.throughput.begin(), other.throughput.end(),
                               [&](const auto& p) { return p.first == level; });
        auto p99 = std::find_if(other.p99_ms.begin(), other.p99_ms.end(),
                                [&](const auto& p) { return p.first == level; });
        if (it == other.throughput.end() || p99 == other.p99_ms.end()) {
          shared = false;
          break;
        }
        row.push_back(F(it->second));
        row.push_back(F(it->second / value, 3));
        row.push_back(F(p99->second / base.p99_ms[k].second, 3));
      }
      if (shared) t.rows.push_back(row);
    }
    if (t.rows.empty()) continue;
    html += Table(t);
    PlotSpec overlay{fmt::format("{} of {}: throughput by run", key.first, key.second),
                     base.x_label,
                     base.throughput_unit,
                     true,
                     {}};
    for (size_t m : members) {
      if (runs[m].throughput_by_x.empty()) continue;
      overlay.series.push_back({fmt::format("run {}", m + 1), runs[m].throughput_by_x});
    }
    if (overlay.series.size() >= 2)
      html += "<div class=\"plots\">" + Figure(RenderLinePlotSvg(overlay)) + "</div>\n";
  }
  return html;
}

constexpr const char* kStyle = R"(
body{font-family:sans-serif;margin:2em auto;max-width:1500px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:2px solid #1f77b4;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse;margin:.5em 0;font-size:.85em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f0f4f8}td:first-child,th:first-child{text-align:left}
table.meta td,table.config td{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:1em}
figure.plot{margin:0;border:1px solid #ddd;flex:0 1 600px}
figure.plot svg{display:block;width:100%;height:auto}
details{margin:.5em 0}nav li{margin:.2em 0}code{font-size:.9em}
)";

}  // namespace

Result<ReportRun> ReadRunForReport(const fs::path& dir) {
  auto run_file = ReadJson(dir / "run.json");
  if (!run_file.ok()) return run_file.status();
  auto summary_file = ReadJson(dir / "summary.json");
  if (!summary_file.ok()) {
    return Status::InvalidArgument(
        fmt::format("{}: {}", dir.string(), summary_file.status().message()));
  }
  ReportRun out;
  out.dir = dir;
  Element run = (*run_file)->root, summary = (*summary_file)->root;
  ReadAbout(run, out);
  Element config;
  if (run["config"].get(config) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}/run.json has no config", dir.string()));
  }
  try {
    Element unused;
    if (config["sweep"].get(unused) == simdjson::SUCCESS) {
      ReadSweep(run, summary, out);
    } else if (config["bench"].get(unused) == simdjson::SUCCESS) {
      ReadInProcess(run, summary, out);
    } else if (config["prompt_words"].get(unused) == simdjson::SUCCESS) {
      ReadLlm(run, summary, out);
    } else if (config["url"].get(unused) == simdjson::SUCCESS) {
      ReadHttp(run, summary, out);
    } else {
      return Status::InvalidArgument(
          fmt::format("{}/run.json is of no kind of run this version reports", dir.string()));
    }
    ReadProfile(out);
  } catch (const simdjson::simdjson_error& e) {
    return Status::InvalidArgument(
        fmt::format("{}: unexpected result files ({})", dir.string(), e.what()));
  }
  return out;
}

Result<std::vector<fs::path>> FindRunDirectories(const std::vector<fs::path>& paths) {
  std::vector<fs::path> dirs;
  for (const fs::path& path : paths) {
    std::error_code ec;
    if (fs::exists(path / "run.json", ec)) {
      dirs.push_back(path);
      continue;
    }
    if (!fs::is_directory(path, ec)) {
      return Status::InvalidArgument(fmt::format(
          "{} is not a results folder (no run.json) nor a folder of them", path.string()));
    }
    std::vector<fs::path> inside;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_directory() && fs::exists(entry.path() / "run.json")) {
        inside.push_back(entry.path());
      }
    }
    if (inside.empty()) {
      return Status::InvalidArgument(
          fmt::format("{} holds no results folder (none with a run.json)", path.string()));
    }
    std::sort(inside.begin(), inside.end());
    dirs.insert(dirs.end(), inside.begin(), inside.end());
  }
  return dirs;
}

std::string RenderReportHtml(const std::vector<ReportRun>& runs, const std::string& title) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>{0}</title>\n<style>{1}</style></head>\n<body>\n<h1>{0}</h1>\n"
      "<p>Written {2} on {3} ({4} cores) by sluice at commit {5}. {6} run(s).</p>\n",
      EscapeXml(title), kStyle, EscapeXml(LocalTimestamp()), EscapeXml(CpuModelName()), CoreCount(),
      EscapeXml(GitCommit()), runs.size());
  if (runs.size() > 1) {
    html += "<nav><ol>\n";
    for (size_t i = 0; i < runs.size(); ++i) {
      html += fmt::format("<li><a href=\"#run-{}\">{}</a></li>\n", i + 1, EscapeXml(runs[i].title));
    }
    html += "</ol></nav>\n";
    std::string comparisons = Comparisons(runs);
    if (!comparisons.empty()) {
      html += "<section id=\"comparisons\"><h2>Comparisons</h2>\n" + comparisons + "</section>\n";
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const ReportRun& r = runs[i];
    html += fmt::format("<section class=\"run\" id=\"run-{}\">\n<h2>{}{}</h2>\n", i + 1,
                        runs.size() > 1 ? fmt::format("Run {}: ", i + 1) : std::string(),
                        EscapeXml(r.title));
    html += "<table class=\"meta\">\n";
    for (const auto& [k, v] : r.about) {
      html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", EscapeXml(k),
                          k == "command" ? "<code>" + EscapeXml(v) + "</code>" : EscapeXml(v));
    }
    html += "</table>\n<details><summary>Configuration</summary>\n<table class=\"config\">\n";
    for (const auto& [k, v] : r.config) {
      html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", EscapeXml(k), EscapeXml(v));
    }
    html += "</table></details>\n";
    for (const ReportTable& t : r.tables) html += Table(t);
    html += "<div class=\"plots\">\n";
    for (const std::string& svg : r.plots) html += Figure(svg);
    html += "</div>\n</section>\n";
  }
  return html + "</body></html>\n";
}

Status WriteRunReport(const fs::path& dir) {
  auto run = ReadRunForReport(dir);
  if (!run.ok()) return run.status();
  return WriteTextFile(dir / "report.html",
                       RenderReportHtml({*run}, "Sluice report: " + run->title));
}

Status WriteMergedReport(const std::vector<fs::path>& dirs, const fs::path& out) {
  auto found = FindRunDirectories(dirs);
  if (!found.ok()) return found.status();
  std::vector<ReportRun> runs;
  for (const fs::path& dir : *found) {
    auto run = ReadRunForReport(dir);
    if (!run.ok()) return run.status();
    runs.push_back(std::move(*run));
  }
  return WriteTextFile(out,
                       RenderReportHtml(runs, fmt::format("Sluice report: {} runs", runs.size())));
}

}  // namespace sluice
