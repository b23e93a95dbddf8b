// HTTP benchmark levels, payloads, table and result files.
#include "bench/http_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <simdjson.h>

#include <fstream>
#include <iterator>
#include <optional>

#include "bench/grpc_load.h"
#include "bench/payload.h"
#include "bench/plot.h"
#include "codec/base64.h"
#include "codec/v2_codec.h"
#include "common/json_writer.h"

namespace sluice {
namespace {

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("cannot read '{}'", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The model's inputs as the server describes them (GET /v2/models/{m}).
Result<std::vector<TensorSpec>> FetchInputs(const HttpTarget& target, const std::string& model) {
  auto body = HttpGet(target, "/v2/models/" + model);
  if (!body.ok()) return body.status();
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::array inputs;
  if (parser.parse(*body).get(doc) || doc["inputs"].get_array().get(inputs)) {
    return Status::InvalidArgument("the server's model metadata has no \"inputs\" array");
  }
  std::vector<TensorSpec> specs;
  for (simdjson::dom::element input : inputs) {
    std::string_view name, datatype;
    simdjson::dom::array shape;
    if (input["name"].get_string().get(name) || input["datatype"].get_string().get(datatype) ||
        input["shape"].get_array().get(shape)) {
      return Status::InvalidArgument("malformed input in the server's model metadata");
    }
    auto dtype = ParseDataType(datatype);
    if (!dtype) {
      return Status::InvalidArgument(
          fmt::format("input '{}' has datatype {}, which random "
                      "payloads do not cover",
                      name, datatype));
    }
    TensorSpec spec{std::string(name), *dtype, {}};
    bool first = true;
    for (simdjson::dom::element dim : shape) {
      int64_t d = 0;
      if (dim.get_int64().get(d)) return Status::InvalidArgument("non-integer dimension");
      if (!first) spec.shape.push_back(d);  // The first (batch) dimension is ours to choose.
      first = false;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace

Result<HttpPayload> BuildHttpPayload(const HttpBenchOptions& o, const HttpTarget& target) {
  HttpPayload payload;
  payload.samples = o.samples_per_request;
  if (o.endpoint == "predict" || o.endpoint == "predictions") {
    if (o.input_file.empty()) {
      return Status::InvalidArgument(fmt::format("--endpoint {} needs --input IMAGE", o.endpoint));
    }
    auto image = ReadWholeFile(o.input_file);
    if (!image.ok()) return image.status();
    if (o.endpoint == "predict") {
      payload.path = "/predict";
      payload.body = fmt::format("{{\"model\":{},\"image\":\"{}\"}}", JsonQuote(o.model),
                                 Base64Encode(*image));
    } else {
      payload.path = "/predictions/" + o.model;
      payload.content_type = "application/octet-stream";
      payload.body = std::move(*image);
    }
    payload.samples = 1;
    return payload;
  }
  if (o.endpoint != "v2") {
    return Status::InvalidArgument(
        fmt::format("--endpoint must be v2, predict or predictions (got '{}')", o.endpoint));
  }
  auto specs = FetchInputs(target, o.model);
  if (!specs.ok()) return specs.status();
  ModelConfig config;
  config.name = o.model;
  config.inputs = *specs;
  auto inputs = MakeRandomInputs(config, o.samples_per_request, o.seed);
  if (!inputs.ok()) return inputs.status();
  payload.path = fmt::format("/v2/models/{}/infer", o.model);
  std::string json = "{\"inputs\":[";
  std::string binary;
  for (size_t i = 0; i < inputs->size(); ++i) {
    const Tensor& t = (*inputs)[i];
    if (i) json += ',';
    json +=
        fmt::format("{{\"name\":{},\"datatype\":\"{}\",\"shape\":[{}]", JsonQuote((*specs)[i].name),
                    DataTypeName(t.dtype()), fmt::join(t.shape(), ","));
    if (o.binary) {
      json += fmt::format(",\"parameters\":{{\"binary_data_size\":{}}}}}", t.byte_size());
      binary.append(static_cast<const char*>(t.data()), t.byte_size());
    } else {
      json += ",\"data\":";
      AppendJsonValues(t, json);
      json += '}';
    }
  }
  json += "]";
  if (o.binary) json += ",\"parameters\":{\"binary_data_output\":true}";
  json += "}";
  if (o.binary) {
    payload.content_type = "application/octet-stream";
    payload.headers.emplace_back("Inference-Header-Content-Length", std::to_string(json.size()));
    payload.body = json + binary;
  } else {
    payload.body = std::move(json);
  }
  return payload;
}

Result<std::vector<HttpLevelResult>> RunHttpBench(
    const HttpBenchOptions& o, const std::function<void(const std::string&)>& progress) {
  if (o.model.empty()) return Status::InvalidArgument("name the model with --model");
  // One level's load, over REST or gRPC, and where the server's /metrics are (if anywhere).
  std::function<Result<HttpLoadRun>(int, double, uint64_t)> run_level;
  std::optional<HttpTarget> metrics;
  if (o.grpc) {
    if (o.tracer != nullptr) {
      return Status::InvalidArgument("--trace traces HTTP requests; gRPC calls are not traced");
    }
    auto target = ParseGrpcTarget(o.url);
    if (!target.ok()) return target.status();
    auto client = ParseGrpcClient(o.grpc_client);
    if (!client.ok()) return client.status();
    if (!o.endpoint.empty() && o.endpoint != "v2") {
      return Status::InvalidArgument("--grpc sends KServe v2 ModelInfer calls: no --endpoint");
    }
    if (!o.metrics_url.empty()) {
      auto m = ParseHttpUrl(o.metrics_url);
      if (!m.ok()) return m.status();
      metrics = *m;
    }
    run_level = [&o, target = *target, client = *client](int connections, double rate,
                                                         uint64_t seed) {
      GrpcLoadOptions load;
      load.target = target;
      load.client = client;
      load.model = o.model;
      load.samples_per_request = o.samples_per_request;
      load.raw = o.binary;
      load.concurrency = connections;
      load.rate = rate;
      load.duration = o.duration;
      load.warmup = o.warmup;
      load.seed = seed;
      return RunGrpcLoad(load);
    };
  } else {
    auto target = ParseHttpUrl(o.url);
    if (!target.ok()) return target.status();
    auto payload = BuildHttpPayload(o, *target);
    if (!payload.ok()) return payload.status();
    metrics = *target;
    run_level = [&o, target = *target, payload = *payload](int connections, double rate,
                                                           uint64_t seed) {
      HttpLoadOptions load;
      load.target = target;
      load.payload = payload;
      load.concurrency = connections;
      load.rate = rate;
      load.duration = o.duration;
      load.warmup = o.warmup;
      load.seed = seed;
      load.tracer = o.tracer;
      return RunHttpLoad(load);
    };
  }

  std::vector<std::pair<int, double>> levels;  // (connections, rate)
  for (int c : o.concurrency) levels.emplace_back(c, 0.0);
  for (double r : o.rates) levels.emplace_back(o.rate_connections, r);
  std::vector<HttpLevelResult> results;
  for (size_t i = 0; i < levels.size(); ++i) {
    const auto [connections, rate] = levels[i];
    progress(rate > 0
                 ? fmt::format("[{}/{}] open loop {} requests/s on {} connections, {:.0f} s", i + 1,
                               levels.size(), rate, connections, (o.warmup + o.duration).count())
                 : fmt::format("[{}/{}] concurrency {}, {:.0f} s", i + 1, levels.size(),
                               connections, (o.warmup + o.duration).count()));
    Result<std::string> before = Status::NotFound("no metrics");
    if (metrics) before = HttpGet(*metrics, "/metrics");
    auto run = run_level(connections, rate, o.seed + i);
    if (!run.ok()) return run.status();
    Result<std::string> after = Status::NotFound("no metrics");
    if (metrics) after = HttpGet(*metrics, "/metrics");
    HttpLevelResult level{connections, rate, std::move(*run)};
    if (before.ok() && after.ok()) {
      auto delta = [&](std::string_view name) {
        auto [s0, c0] = ScrapeHistogram(*before, name, o.model);
        auto [s1, c1] = ScrapeHistogram(*after, name, o.model);
        return c1 > c0 ? (s1 - s0) / (c1 - c0) : 0.0;
      };
      level.mean_batch_size = delta("sluice_batch_size");
      level.mean_queue_ms = delta("sluice_queue_seconds") * 1e3;
      level.mean_compute_ms = delta("sluice_compute_seconds") * 1e3;
    }
    results.push_back(std::move(level));
  }
  return results;
}

std::string FormatHttpTable(const HttpBenchOptions& o, const std::vector<HttpLevelResult>& levels) {
  std::string out =
      fmt::format("{} benchmark of {} at {} ({}{}{}; {:.0f} s per level after {:.0f} s warm-up)\n",
                  o.grpc ? "gRPC" : "HTTP", o.model, o.url, o.grpc ? "ModelInfer" : o.endpoint,
                  o.endpoint == "v2"
                      ? (o.binary ? (o.grpc ? " raw" : " binary") : (o.grpc ? " typed" : " JSON"))
                      : "",
                  o.grpc ? ", client " + o.grpc_client : "", o.duration.count(), o.warmup.count());
  out += fmt::format("{:>6} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>6}\n",
                     "conns", "rate", "req/s", "samples/s", "p50 ms", "p90 ms", "p99 ms", "mean ms",
                     "errors", "batch", "cpu %");
  for (const HttpLevelResult& l : levels) {
    const Summary& s = l.run.summary;
    out += fmt::format(
        "{:>6} {:>8} {:>10.1f} {:>10.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7} {:>6.1f} "
        "{:>6.0f}\n",
        l.concurrency, l.rate > 0 ? fmt::format("{:.0f}", l.rate) : std::string("closed"),
        s.requests_per_second, s.samples_per_second, s.latency.p50 * 1e3, s.latency.p90 * 1e3,
        s.latency.p99 * 1e3, s.latency.mean * 1e3, s.requests - s.ok_requests + l.run.unsent,
        l.mean_batch_size, l.run.utilization.machine_cpu_percent);
  }
  return out;
}

Status WriteHttpBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                             const HttpBenchOptions& o,
                             const std::vector<HttpLevelResult>& levels) {
  std::string run = RunJson(info, [&](JsonWriter& json) {
    json.BeginObject()
        .Field("url", o.url)
        .Field("transport", o.grpc ? "grpc" : "http")
        .Field("client", o.grpc ? o.grpc_client : "beast")
        .Field("model", o.model)
        .Field("endpoint", o.endpoint)
        .Field("binary", o.binary)
        .Field("samples_per_request", o.samples_per_request)
        .Field("duration_seconds", o.duration.count())
        .Field("warmup_seconds", o.warmup.count())
        .Field("seed", static_cast<int64_t>(o.seed))
        .EndObject();
  });
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "run.json", run));
  std::string csv =
      "concurrency,rate,requests,ok_requests,requests_per_second,samples_per_second,"
      "p50_s,p90_s,p95_s,p99_s,mean_s,max_s,unsent,transport_errors,server_mean_batch_size,"
      "server_mean_queue_ms,server_mean_compute_ms,machine_cpu_percent\n";
  JsonWriter json;
  json.BeginObject().Key("levels").BeginArray();
  for (const HttpLevelResult& l : levels) {
    const Summary& s = l.run.summary;
    csv += fmt::format(
        "{},{},{},{},{:.3f},{:.3f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{},"
        "{:.3f},{:.3f},{:.3f},{:.1f}\n",
        l.concurrency, l.rate, s.requests, s.ok_requests, s.requests_per_second,
        s.samples_per_second, s.latency.p50, s.latency.p90, s.latency.p95, s.latency.p99,
        s.latency.mean, s.latency.max, l.run.unsent, l.run.transport_errors, l.mean_batch_size,
        l.mean_queue_ms, l.mean_compute_ms, l.run.utilization.machine_cpu_percent);
    json.BeginObject().Field("concurrency", l.concurrency).Field("rate", l.rate);
    WriteSummaryFields(json, s, l.run.utilization);
    json.Field("unsent", l.run.unsent)
        .Field("transport_errors", l.run.transport_errors)
        .Field("server_mean_batch_size", l.mean_batch_size)
        .EndObject();
    const std::string name = l.rate > 0 ? fmt::format("samples_rate{:.0f}.csv", l.rate)
                                        : fmt::format("samples_c{}.csv", l.concurrency);
    SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / name, SamplesCsv(l.run.records)));
  }
  json.EndArray().EndObject();
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.csv", csv));
  std::vector<UtilizationPart> utilization;
  for (const HttpLevelResult& l : levels) {
    utilization.push_back(
        {l.rate > 0 ? fmt::format("rate {:g}", l.rate) : fmt::format("c{}", l.concurrency),
         l.run.utilization_samples});
  }
  SLUICE_RETURN_IF_ERROR(WriteUtilizationCsv(dir, utilization));
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.json", json.str() + "\n"));

  PlotSeries throughput{o.model, {}}, p50{"p50", {}}, p99{"p99", {}};
  for (const HttpLevelResult& l : levels) {
    if (l.rate > 0) continue;
    throughput.points.emplace_back(l.concurrency, l.run.summary.requests_per_second);
    p50.points.emplace_back(l.concurrency, l.run.summary.latency.p50 * 1e3);
    p99.points.emplace_back(l.concurrency, l.run.summary.latency.p99 * 1e3);
  }
  if (!throughput.points.empty()) {
    PlotSpec t{fmt::format("{} over HTTP: throughput", o.model),
               "concurrency (connections)",
               "requests/s",
               true,
               {throughput}};
    PlotSpec lat{fmt::format("{} over HTTP: latency", o.model),
                 "concurrency (connections)",
                 "latency (ms)",
                 true,
                 {p50, p99}};
    SLUICE_RETURN_IF_ERROR(
        WriteTextFile(dir / "throughput_vs_concurrency.svg", RenderLinePlotSvg(t)));
    SLUICE_RETURN_IF_ERROR(
        WriteTextFile(dir / "latency_vs_concurrency.svg", RenderLinePlotSvg(lat)));
  }
  return Status::Ok();
}

}  // namespace sluice
