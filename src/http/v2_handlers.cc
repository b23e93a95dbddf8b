// KServe v2, stats and metrics handlers.
#include "http/v2_handlers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_writer.h"

namespace sluice {
namespace {

void WriteTensorSpecs(JsonWriter& json, std::string_view key,
                      const std::vector<TensorSpec>& specs) {
  json.Key(key).BeginArray();
  for (const TensorSpec& spec : specs) {
    json.BeginObject().Field("name", spec.name).Field("datatype", DataTypeName(spec.datatype));
    json.Key("shape").BeginArray().Int(-1);
    for (int64_t d : spec.shape) json.Int(d);
    json.EndArray().EndObject();
  }
  json.EndArray();
}

double StageMillis(Clock::time_point from, Clock::time_point to) {
  return from == Clock::time_point{} || to < from ? 0 : SecondsBetween(from, to) * 1e3;
}

void WriteHistogram(JsonWriter& json, std::string_view key, const HistogramSnapshot& h) {
  json.Key(key).BeginObject().Field("count", static_cast<int64_t>(h.count)).Field("sum", h.sum);
  json.Key("buckets").BeginArray();
  for (size_t i = 0; i < h.counts.size(); ++i) {
    json.BeginObject();
    if (i < h.upper_bounds.size()) {
      json.Field("le", h.upper_bounds[i]);
    } else {
      json.Field("le", "+Inf");
    }
    json.Field("count", static_cast<int64_t>(h.counts[i])).EndObject();
  }
  json.EndArray().EndObject();
}

}  // namespace

V2Handlers::V2Handlers(V2Service& service, std::function<HttpStats()> http_stats)
    : service_(service), http_stats_(std::move(http_stats)) {}

void V2Handlers::AddRoutes(Router& router) {
  auto bind = [this](auto method) {
    return [this, method](const HttpRequest& r, const PathParams& p, Responder respond) {
      (this->*method)(r, p, std::move(respond));
    };
  };
  router.Get("/v2", bind(&V2Handlers::ServerMetadata));
  router.Get("/v2/health/live", bind(&V2Handlers::Live));
  router.Get("/v2/health/ready", bind(&V2Handlers::Ready));
  router.Get("/v2/models/{model}", bind(&V2Handlers::ModelMetadata));
  router.Get("/v2/models/{model}/versions/{version}", bind(&V2Handlers::ModelMetadata));
  router.Get("/v2/models/{model}/ready", bind(&V2Handlers::ModelReady));
  router.Get("/v2/models/{model}/versions/{version}/ready", bind(&V2Handlers::ModelReady));
  router.Post("/v2/models/{model}/infer", bind(&V2Handlers::Infer));
  router.Post("/v2/models/{model}/versions/{version}/infer", bind(&V2Handlers::Infer));
  // An overloaded model refuses before the body is read; other errors wait for the handler.
  auto admit = [this](const PathParams& params) -> Result<AdmissionTicket> {
    auto model = FindModel(params);
    if (!model.ok()) return AdmissionTicket();
    return (*model)->Admit();
  };
  router.SetAdmission("POST", "/v2/models/{model}/infer", admit);
  router.SetAdmission("POST", "/v2/models/{model}/versions/{version}/infer", admit);
  router.Get("/v2/models/{model}/stats", bind(&V2Handlers::ModelStats));
  router.Get("/metrics", bind(&V2Handlers::Metrics));
}

void V2Handlers::ServerMetadata(const HttpRequest&, const PathParams&, Responder respond) {
  JsonWriter json;
  json.BeginObject().Field("name", kServerName).Field("version", kServerVersion);
  json.Key("extensions").BeginArray();
  for (std::string_view extension : kServerExtensions) json.String(extension);
  json.EndArray().EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void V2Handlers::Live(const HttpRequest&, const PathParams&, Responder respond) {
  respond(HttpResponse::Json(200, "{\"live\":true}"));
}

void V2Handlers::Ready(const HttpRequest&, const PathParams&, Responder respond) {
  const bool ready = service_.IsReady();
  respond(HttpResponse::Json(ready ? 200 : 503, fmt::format("{{\"ready\":{}}}", ready)));
}

void V2Handlers::ModelMetadata(const HttpRequest&, const PathParams& params, Responder respond) {
  auto model = FindModel(params);
  if (!model.ok()) {
    respond(HttpResponse::Error(model.status()));
    return;
  }
  const ModelConfig& config = (*model)->config();
  JsonWriter json;
  json.BeginObject().Field("name", config.name).Key("versions").BeginArray();
  json.String(kModelVersion).EndArray().Field("platform", kModelPlatform);
  WriteTensorSpecs(json, "inputs", config.inputs);
  WriteTensorSpecs(json, "outputs", config.outputs);
  // Beyond the v2 schema (clients read the fields they know): how the model runs.
  json.Key("parameters").BeginObject().Field("precision", PrecisionName(config.precision));
  if (!config.precision_auto_note.empty()) {
    json.Field("precision_chosen_by", "auto: " + config.precision_auto_note);
  }
  if (config.backend) json.Field("backend", BackendKindName(*config.backend));
  json.Field("model_file", config.model_file);
  json.Field("device", config.instances.device).Field("instances", config.instances.count);
  if (config.instances.share_cores) json.Field("shared_cores", config.instances.pool_cores);
  // Whether /predictions/{model} takes a PNG or JPEG for the first input.
  json.Field("image_input", config.preprocess_image.has_value());
  json.EndObject();
  json.EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void V2Handlers::ModelReady(const HttpRequest&, const PathParams& params, Responder respond) {
  auto model = FindModel(params);
  if (!model.ok()) {
    respond(HttpResponse::Error(model.status()));
    return;
  }
  respond(HttpResponse::Json(
      200, fmt::format("{{\"name\":{},\"ready\":true}}", JsonQuote((*model)->config().name))));
}

void V2Handlers::Infer(const HttpRequest& request, const PathParams& params, Responder respond) {
  auto model = FindModel(params);
  if (!model.ok()) {
    respond(HttpResponse::Error(model.status()));
    return;
  }
  const ModelConfig& config = (*model)->config();
  if (request.trace) request.trace->model = config.name;
  Result<V2InferRequest> parsed = Status::Internal("unset");
  if (request.inference_header_length) {
    const size_t header_size = *request.inference_header_length;
    if (header_size == 0) {
      parsed = ParseV2RawInput(request.body, config);
    } else if (header_size > request.body.size()) {
      parsed = Status::InvalidArgument(
          fmt::format("Inference-Header-Content-Length {} exceeds the body's {} bytes", header_size,
                      request.body.size()));
    } else {
      std::string_view body = request.body;
      parsed = ParseV2InferRequest(body.substr(0, header_size), body.substr(header_size), config,
                                   service_.limits());
    }
  } else {
    parsed = ParseV2InferRequest(request.body, {}, config, service_.limits());
  }
  if (!parsed.ok()) {
    respond(HttpResponse::Error(parsed.status()));
    return;
  }

  size_t tensor_bytes = 0;
  for (const Tensor& input : parsed->inputs) tensor_bytes += input.byte_size();
  if (request.memory && !request.memory->Grow(tensor_bytes)) {
    respond(HttpResponse::Error(MemoryBudgetExceeded(*request.memory, tensor_bytes)));
    return;
  }

  std::shared_ptr<ModelScheduler> scheduler = *model;
  const Clock::time_point received = request.received;
  // The engine calls back on a worker thread: encoding moves to the connection's thread, so model
  // instances never wait on JSON (except after a batch of one, which nothing waits behind).
  // The request's memory stays counted until its answer is encoded.
  V2Done done = [scheduler, received, post = request.post, respond, memory = request.memory,
                 trace = request.trace](std::shared_ptr<const V2InferRequest> meta,
                                        InferResponse&& response) mutable {
    post([scheduler, meta = std::move(meta), received, respond = std::move(respond),
          memory = std::move(memory), trace = std::move(trace),
          response = std::move(response)]() mutable {
      if (trace) trace->SetEngineTimes(response);
      if (!response.status.ok()) {
        respond(HttpResponse::Error(response.status));
        return;
      }
      const Clock::time_point encode_start = Clock::Real().Now();
      if (trace) trace->End(TraceStage::kRespond, encode_start);
      auto encoded = EncodeV2InferResponse(scheduler->config(), *meta, response.outputs);
      if (!encoded.ok()) {
        respond(HttpResponse::Error(encoded.status()));
        return;
      }
      HttpResponse http;
      http.body = std::move(encoded->body);
      if (encoded->has_binary) {
        http.content_type = "application/octet-stream";
        http.headers.emplace_back("Inference-Header-Content-Length",
                                  std::to_string(encoded->json_size));
      }
      const RequestTimes& t = response.times;
      http.headers.emplace_back(
          "Server-Timing",
          fmt::format("decode;dur={:.3f}, queue;dur={:.3f}, infer;dur={:.3f}, encode;dur={:.3f}",
                      StageMillis(received, t.enqueue), StageMillis(t.enqueue, t.compute_start),
                      StageMillis(t.compute_start, t.compute_end),
                      StageMillis(encode_start, Clock::Real().Now())));
      if (trace) trace->End(TraceStage::kEncode, Clock::Real().Now());
      respond(std::move(http));
    });
  };
  auto id = V2Service::Submit(scheduler, std::move(*parsed), {request.arrived, std::nullopt},
                              std::move(done));
  if (!id.ok()) {
    respond(HttpResponse::Error(id.status()));
    return;
  }
  // A client that goes away while its request is queued frees the slot; the request never runs.
  if (request.on_disconnect) {
    request.on_disconnect([scheduler, id = *id] { scheduler->Cancel(id); });
  }
}

void V2Handlers::ModelStats(const HttpRequest&, const PathParams& params, Responder respond) {
  auto model = FindModel(params);
  if (!model.ok()) {
    respond(HttpResponse::Error(model.status()));
    return;
  }
  ModelStatsSnapshot s = (*model)->stats();
  JsonWriter json;
  json.BeginObject().Field("model", (*model)->config().name);
  json.Field("queued_requests", s.queued_requests)
      .Field("queued_samples", s.queued_samples)
      .Field("inflight_requests", s.inflight_requests)
      .Field("rejected_requests", s.rejected_requests)
      .Field("batches", s.batches)
      .Field("failed_batches", s.failed_batches)
      .Field("busy_seconds", s.busy_seconds)
      .Field("instances", static_cast<int64_t>(s.instances))
      .Field("instance_wakeups", s.instance_wakeups)
      .Field("spin_catches", s.spin_catches);
  json.Key("requests").BeginObject();
  for (int code = 0; code < kStatusCodeCount; ++code) {
    json.Field(StatusCodeName(static_cast<StatusCode>(code)), s.requests_by_outcome[code]);
  }
  json.EndObject();
  json.Key("batching")
      .BeginObject()
      .Field("policy", s.adaptive_batching ? "adaptive" : "fixed")
      .Field("slo_p99_ms",
             static_cast<double>((*model)->config().dynamic_batching.slo_p99.count()) / 1e3)
      .Field("target_batch_size", static_cast<int64_t>(s.target_batch_size))
      .Field("company_samples_per_second", s.company_rate)
      .Field("drain_samples_per_second", s.drain_rate)
      .Field("wait_calibration", s.wait_calibration)
      .Field("intake_seconds", s.intake_seconds);
  json.Key("costs").BeginArray();
  for (const auto& cost : s.batch_costs) {
    json.BeginObject()
        .Field("batch_size", static_cast<int64_t>(cost.batch_size))
        .Field("seconds", cost.seconds)
        .Field("batches", cost.batches)
        .EndObject();
  }
  json.EndArray().EndObject();
  WriteHistogram(json, "batch_size", s.batch_size);
  WriteHistogram(json, "queue_seconds", s.queue_seconds);
  WriteHistogram(json, "compute_seconds", s.compute_seconds);
  WriteHistogram(json, "request_seconds", s.request_seconds);
  if ((*model)->config().instances.on_gpu()) {
    json.Key("gpus").BeginArray();
    for (const auto& [gpu, reading] : s.gpus) {
      json.BeginObject()
          .Field("gpu", static_cast<int64_t>(gpu))
          .Field("utilization_percent", reading.utilization_percent)
          .Field("memory_used_bytes", reading.memory_used_bytes)
          .Field("memory_total_bytes", reading.memory_total_bytes)
          .EndObject();
    }
    json.EndArray();
  }
  json.EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void V2Handlers::Metrics(const HttpRequest&, const PathParams&, Responder respond) {
  std::vector<std::pair<std::string, ModelStatsSnapshot>> models;
  Engine& engine = service_.engine();
  for (const std::string& name : engine.ModelNames()) {
    if (auto scheduler = engine.Find(name)) models.emplace_back(name, scheduler->stats());
  }
  HttpResponse response;
  response.content_type = "text/plain; version=0.0.4";
  response.body = RenderMetrics(models, http_stats_ ? http_stats_() : HttpStats{});
  for (const auto& render : extra_metrics_) response.body += render();
  respond(std::move(response));
}

}  // namespace sluice
