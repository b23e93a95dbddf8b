// The KServe v2 gRPC service: ModelInfer on gRPC's asynchronous API (completion queues polled by
// the service's own threads), the other RPCs on its callback API.
#include "grpc/grpc_server.h"

#include <fmt/format.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/constant_time.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "grpc/grpc_codec.h"
#include "grpc_predict_v2.grpc.pb.h"
#include "metrics/prometheus.h"

namespace sluice {
namespace {

enum Method {
  kServerLive,
  kServerReady,
  kModelReady,
  kServerMetadata,
  kModelMetadata,
  kModelInfer,
  kRepositoryModelLoad,
  kRepositoryModelUnload,
  kRepositoryIndex
};
constexpr std::array<std::string_view, 9> kMethodNames = {
    "ServerLive",          "ServerReady",           "ModelReady",
    "ServerMetadata",      "ModelMetadata",         "ModelInfer",
    "RepositoryModelLoad", "RepositoryModelUnload", "RepositoryIndex"};
constexpr int kGrpcCodes = 17;  // OK .. UNAUTHENTICATED.
constexpr std::array<std::string_view, kGrpcCodes> kCodeNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

grpc::StatusCode GrpcCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kPayloadTooLarge:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::INTERNAL;
}

grpc::Status ToGrpc(const Status& status) {
  return grpc::Status(GrpcCodeFor(status.code()), status.message());
}

// A model control request as Triton's clients and KServe's send it: the same method names with
// different fields. KServe's RepositoryModelLoadRequest and RepositoryModelUnloadRequest (this
// proto's) hold model_name as field 1; Triton's hold repository_name (1), model_name (2) and
// parameters (3: a map of names to ModelRepositoryParameter, a oneof of bool_param (1),
// int64_param, string_param, bytes_param), which arrive here as unknown fields. A message with
// field 2 or 3 is Triton's.
struct ControlRequest {
  std::string repository;
  std::string model;
  std::vector<std::pair<std::string, int>> parameters;  // Name, and the value's field number.
};
constexpr int kBoolParam = 1;

ControlRequest ReadControlRequest(const google::protobuf::Message& message,
                                  const std::string& first_field) {
  using google::protobuf::UnknownField;
  using google::protobuf::UnknownFieldSet;
  ControlRequest request;
  bool triton = false;
  const UnknownFieldSet& unknown = message.GetReflection()->GetUnknownFields(message);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const UnknownField& field = unknown.field(i);
    if (field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (field.number() == 2) {
      triton = true;
      request.model = field.length_delimited();
    } else if (field.number() == 3) {  // A map entry: key (1), value (2).
      triton = true;
      UnknownFieldSet entry, value;
      std::string key;
      int choice = 0;
      if (entry.ParseFromString(field.length_delimited())) {
        for (int e = 0; e < entry.field_count(); ++e) {
          const UnknownField& part = entry.field(e);
          if (part.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
          if (part.number() == 1) key = part.length_delimited();
          if (part.number() == 2 && value.ParseFromString(part.length_delimited()) &&
              value.field_count() > 0) {
            choice = value.field(0).number();
          }
        }
      }
      request.parameters.emplace_back(key.empty() ? std::string("(unnamed)") : key, choice);
    }
  }
  (triton ? request.repository : request.model) = first_field;
  return request;
}

}  // namespace

// ModelInfer is served through completion queues that the service's own threads poll: the thread
// that reads a call from its connection is the one that submits it. On gRPC's callback API (gRPC
// 1.51 on Linux) every call and every finish went from gRPC's poller to a separate thread that
// runs the callbacks: two thread wake-ups a call more than the REST path, which at 64 calls in
// flight left the CPU idle between batches. The other RPCs are rare and stay on the callback API.
using Service = inference::GRPCInferenceService;
using ServiceBase = Service::WithCallbackMethod_ServerLive<Service::WithCallbackMethod_ServerReady<
    Service::WithCallbackMethod_ModelReady<Service::WithCallbackMethod_ServerMetadata<
        Service::WithCallbackMethod_ModelMetadata<Service::WithCallbackMethod_RepositoryModelLoad<
            Service::WithCallbackMethod_RepositoryModelUnload<
                Service::WithCallbackMethod_RepositoryIndex<
                    Service::WithAsyncMethod_ModelInfer<Service::Service>>>>>>>>>;

namespace {
class InferCall;
}  // namespace

class GrpcServer::Impl final : public ServiceBase {
 public:
  Impl(GrpcServerOptions options, V2Service& service)
      : options_(std::move(options)), service_(service) {
    for (auto& h : latency_) h = std::make_unique<Histogram>(Histogram::LatencySecondsBuckets());
    for (auto& row : counts_) {
      for (auto& c : row) c.store(0);
    }
  }

  Status Start() {
    grpc::ServerBuilder builder;
    int selected_port = 0;
    builder.AddListeningPort(fmt::format("{}:{}", options_.host, options_.port),
                             grpc::InsecureServerCredentials(), &selected_port);
    builder.RegisterService(this);
    for (int i = 0; i < options_.threads; ++i) cqs_.push_back(builder.AddCompletionQueue());
    const int max_message = static_cast<int>(
        std::min<size_t>(options_.max_message_bytes, std::numeric_limits<int>::max()));
    builder.SetMaxReceiveMessageSize(max_message);
    builder.SetMaxSendMessageSize(max_message);
    if (options_.memory_budget_bytes > 0) {
      grpc::ResourceQuota quota("sluice-grpc");
      quota.Resize(options_.memory_budget_bytes);
      builder.SetResourceQuota(quota);
    }
    finisher_ = std::make_unique<ThreadPool>(1, size_t{1} << 20);
    server_ = builder.BuildAndStart();
    if (!server_ || selected_port == 0) {
      server_.reset();
      return Status::Unavailable(
          fmt::format("cannot serve gRPC on {}:{}", options_.host, options_.port));
    }
    port_ = static_cast<uint16_t>(selected_port);
    for (auto& cq : cqs_) {
      for (int i = 0; i < kCallsRequested; ++i) RequestCall(cq.get());
      pollers_.emplace_back([cq = cq.get()] { Poll(cq); });
    }
    return Status::Ok();
  }

  uint16_t port() const { return port_; }

  void Shutdown(Clock::duration grace) {
    if (!server_ || shut_down_.exchange(true)) return;
    // Calls still waiting to be matched fail and are freed; calls in flight get until the grace
    // ends, then are cancelled (which cancels their queued requests) and finish.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(grace));
    {
      MutexLock lock(calls_mu_);
      while (live_calls_ > 0) calls_done_.Wait(lock);
    }
    // No call is left to post to the queues: they can shut down, and their threads end.
    for (auto& cq : cqs_) cq->Shutdown();
    for (auto& poller : pollers_) poller.join();
    server_->Wait();
    finisher_.reset();  // Every call has finished: nothing more will be queued.
  }

  // A new ModelInfer call asked of gRPC on `cq` (unless the server is shutting down).
  void RequestCall(grpc::ServerCompletionQueue* cq);
  // Counts a call's end; the last one wakes Shutdown().
  void CallEnded() {
    MutexLock lock(calls_mu_);
    if (--live_calls_ == 0) calls_done_.SignalAll();
  }
  bool shutting_down() const { return shut_down_.load(); }

  // A completion queue's thread: it polls the connections and runs each call's next step.
  static void Poll(grpc::ServerCompletionQueue* cq);

  // Runs `finish` (encode a result, finish its call) on the finisher thread, so a model's worker
  // never waits on gRPC's transport: finishing a call can write to its socket at once. Inline when
  // the queue refuses it.
  void Finish(std::function<void()> finish) {
    if (!finisher_ || !finisher_->TrySubmit(finish)) finish();
  }

  std::string RenderMetrics() const {
    PrometheusWriter w;
    w.Family("sluice_grpc_requests_total", "counter",
             "gRPC calls answered, by method and status code.");
    for (size_t m = 0; m < kMethodNames.size(); ++m) {
      for (int c = 0; c < kGrpcCodes; ++c) {
        const uint64_t n = counts_[m][static_cast<size_t>(c)].load(std::memory_order_relaxed);
        if (n == 0) continue;
        w.Sample("sluice_grpc_requests_total",
                 fmt::format("method=\"{}\",code=\"{}\"", kMethodNames[m], kCodeNames[c]),
                 static_cast<double>(n));
      }
    }
    w.Family("sluice_grpc_request_seconds", "histogram",
             "gRPC calls from their start to their answer, by method.");
    for (size_t m = 0; m < kMethodNames.size(); ++m) {
      w.Histogram("sluice_grpc_request_seconds", fmt::format("method=\"{}\"", kMethodNames[m]),
                  latency_[m]->Snapshot());
    }
    return w.text();
  }

  // --- the RPCs -------------------------------------------------------------------------------

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    response->set_live(true);
    return Answer(context, kServerLive, Clock::Real().Now(), grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    response->set_ready(service_.IsReady());
    return Answer(context, kServerReady, Clock::Real().Now(), grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    const Clock::time_point start = Clock::Real().Now();
    if (!Authorized(*context)) return Answer(context, kModelReady, start, Unauthenticated());
    auto model = FindModel(request->name(), request->version());
    if (!model.ok()) return Answer(context, kModelReady, start, ToGrpc(model.status()));
    response->set_ready(true);
    return Answer(context, kModelReady, start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    const Clock::time_point start = Clock::Real().Now();
    if (!Authorized(*context)) return Answer(context, kServerMetadata, start, Unauthenticated());
    response->set_name(std::string(kServerName));
    response->set_version(std::string(kServerVersion));
    for (std::string_view extension : kServerExtensions) {
      response->add_extensions(std::string(extension));
    }
    return Answer(context, kServerMetadata, start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    const Clock::time_point start = Clock::Real().Now();
    if (!Authorized(*context)) return Answer(context, kModelMetadata, start, Unauthenticated());
    auto model = FindModel(request->name(), request->version());
    if (!model.ok()) return Answer(context, kModelMetadata, start, ToGrpc(model.status()));
    const ModelConfig& config = (*model)->config();
    response->set_name(config.name);
    response->add_versions(std::string(kModelVersion));
    response->set_platform(std::string(kModelPlatform));
    auto add = [](const TensorSpec& spec, auto* tensor) {
      tensor->set_name(spec.name);
      tensor->set_datatype(std::string(DataTypeName(spec.datatype)));
      tensor->add_shape(-1);
      for (int64_t d : spec.shape) tensor->add_shape(d);
    };
    for (const TensorSpec& spec : config.inputs) add(spec, response->add_inputs());
    for (const TensorSpec& spec : config.outputs) add(spec, response->add_outputs());
    return Answer(context, kModelMetadata, start, grpc::Status::OK);
  }

  // Triton's model control, as its HTTP routes do it (ModelRepository::Change): the call
  // finishes when the load or unload has run. Triton's load `parameters` (a config to load with,
  // files) and a repository name are not taken: refused by name. An unload's boolean
  // `unload_dependents` (tritonclient always sends it) has no dependents to act on: Sluice serves
  // no ensembles.
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* context,
                                                const inference::RepositoryModelLoadRequest* request,
                                                inference::RepositoryModelLoadResponse*) override {
    const ControlRequest read = ReadControlRequest(*request, request->model_name());
    std::string refused;
    for (const auto& [key, choice] : read.parameters) refused = key;
    return Control(context, kRepositoryModelLoad, read, refused);
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse*) override {
    const ControlRequest read = ReadControlRequest(*request, request->model_name());
    std::string refused;
    for (const auto& [key, choice] : read.parameters) {
      if (key != "unload_dependents" || choice != kBoolParam) refused = key;
    }
    return Control(context, kRepositoryModelUnload, read, refused);
  }

  // Triton's RepositoryIndex, as GET /v2/repository/index answers it. One repository: a
  // repository_name is refused.
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override {
    const Clock::time_point start = Clock::Real().Now();
    if (!Authorized(*context)) return Answer(context, kRepositoryIndex, start, Unauthenticated());
    if (!options_.repository_index) {
      return Answer(context, kRepositoryIndex, start,
                    grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "this server has no model repository"));
    }
    if (!request->repository_name().empty()) {
      return Answer(context, kRepositoryIndex, start,
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("'repository_name' is not supported: Sluice serves "
                                             "one repository (got '{}')",
                                             request->repository_name())));
    }
    for (const GrpcServerOptions::IndexEntry& entry : options_.repository_index(request->ready())) {
      auto* model = response->add_models();
      model->set_name(entry.name);
      model->set_version(entry.version);
      model->set_state(entry.state);
      model->set_reason(entry.reason);
    }
    return Answer(context, kRepositoryIndex, start, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* context, Method method,
                                    const ControlRequest& request, const std::string& parameter) {
    const std::string& repository = request.repository;
    const std::string& name = request.model;
    const Clock::time_point start = Clock::Real().Now();
    if (!Authorized(*context)) return Answer(context, method, start, Unauthenticated());
    if (!options_.model_control) {
      return Answer(context, method, start,
                    grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "model control is disabled: start sluice serve with "
                                 "--model-control"));
    }
    if (!repository.empty()) {
      return Answer(context, method, start,
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("'repository_name' is not supported: Sluice serves "
                                             "one repository (got '{}')",
                                             repository)));
    }
    if (!parameter.empty()) {
      return Answer(context, method, start,
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("parameter '{}' is not supported: a model loads from "
                                             "its folder in the repository",
                                             parameter)));
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    options_.model_control(name, method == kRepositoryModelLoad,
                           [this, reactor, method, start](Status status) {
                             grpc::Status answer = ToGrpc(status);
                             Record(method, answer.error_code(), start);
                             reactor->Finish(std::move(answer));
                           });
    return reactor;
  }

  // --- shared by the RPCs ---------------------------------------------------------------------

  bool Authorized(const grpc::ServerContextBase& context) const {
    if (options_.api_key.empty()) return true;
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("x-api-key");
    if (it != metadata.end()) {
      return ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()),
                                options_.api_key);
    }
    it = metadata.find("authorization");
    if (it == metadata.end()) return false;
    std::string_view value(it->second.data(), it->second.size());
    if (value.substr(0, 7) != "Bearer ") return false;
    return ConstantTimeEquals(value.substr(7), options_.api_key);
  }

  static grpc::Status Unauthenticated() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
  }

  // The scheduler of `name` (version "" or "1"), or the error the REST routes give too.
  Result<std::shared_ptr<ModelScheduler>> FindModel(const std::string& name,
                                                    const std::string& version) const {
    return service_.FindModel(name, version);
  }

  void Record(Method method, grpc::StatusCode code, Clock::time_point start) {
    const int c = static_cast<int>(code);
    if (c >= 0 && c < kGrpcCodes) {
      counts_[method][static_cast<size_t>(c)].fetch_add(1, std::memory_order_relaxed);
    }
    latency_[method]->Observe(SecondsBetween(start, Clock::Real().Now()));
  }

  const V2Limits& limits() const { return service_.limits(); }

 private:
  // Finishes a call answered on the spot.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Method method,
                                   Clock::time_point start, grpc::Status status) {
    Record(method, status.error_code(), start);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }

  // ModelInfer calls each queue keeps asked for ahead of their arrival.
  static constexpr int kCallsRequested = 64;

  const GrpcServerOptions options_;
  V2Service& service_;
  std::unique_ptr<ThreadPool> finisher_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> pollers_;
  Mutex calls_mu_;
  CondVar calls_done_;
  int64_t live_calls_ GUARDED_BY(calls_mu_) = 0;  // InferCalls not yet deleted.
  std::unique_ptr<grpc::Server> server_;
  uint16_t port_ = 0;
  std::atomic<bool> shut_down_{false};
  std::array<std::array<std::atomic<uint64_t>, kGrpcCodes>, kMethodNames.size()> counts_;
  std::array<std::unique_ptr<Histogram>, kMethodNames.size()> latency_;
};

namespace {

// One ModelInfer call on the asynchronous API, from its request to gRPC to its end. Three events
// come back on its completion queue: the call arrived, its answer was sent (or could not be), and
// gRPC is done with it (finished or cancelled). It is deleted after the last two; the answer is
// always given, also to a cancelled call (gRPC then drops it), so both always come.
class InferCall {
 public:
  InferCall(GrpcServer::Impl& server, grpc::ServerCompletionQueue* cq)
      : server_(server), cq_(cq), responder_(&context_) {}

  // Asks gRPC for the next call on this queue.
  void Request() {
    context_.AsyncNotifyWhenDone(&done_);
    server_.RequestModelInfer(&context_, &request_, &responder_, cq_, cq_, &arrived_);
  }

  // One event from the queue, `ok` as gRPC gives it.
  void Proceed(int event, bool ok) {
    switch (event) {
      case kArrived:
        if (!ok) {  // The server is shutting down: the call never started.
          delete this;
          return;
        }
        server_.RequestCall(cq_);  // The next call, asked for before this one runs.
        start_ = Clock::Real().Now();
        Submit();
        return;
      case kAnswered:
        return Release();
      case kDone:
        OnDone();
        return Release();
    }
  }

  struct Tag {
    InferCall* call;
    int event;
  };
  static constexpr int kArrived = 0, kAnswered = 1, kDone = 2;

 private:
  ~InferCall() { server_.CallEnded(); }

  void Release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      server_.Record(kModelInfer,
                     context_.IsCancelled() && code_ == grpc::StatusCode::OK
                         ? grpc::StatusCode::CANCELLED
                         : code_,
                     start_);
      delete this;
    }
  }

  void OnDone() {
    if (!context_.IsCancelled()) return;
    // gRPC cancels a call whose deadline passes; the request's own deadline (the same instant)
    // expires it in the queue, counted as deadline_exceeded rather than cancelled. A client whose
    // deadline passes cancels the call itself, and its cancellation can arrive a moment before
    // the server's copy of the deadline (grpc-timeout is relative, so the server's instant is
    // later by the request's transit; seen under load): one within kDeadlineSlack of the deadline
    // is that deadline, and the request expires in the queue by itself.
    constexpr std::chrono::milliseconds kDeadlineSlack{250};
    if (context_.deadline() <= std::chrono::system_clock::now() + kDeadlineSlack) return;
    std::shared_ptr<ModelScheduler> scheduler;
    RequestId id = 0;
    {
      MutexLock lock(mu_);
      cancelled_ = true;
      scheduler = scheduler_;
      id = id_;
    }
    // A queued request completes at once with kCancelled (and answers this call); one already
    // running finishes normally.
    if (scheduler) scheduler->Cancel(id);
  }

  // The call's answer; the kAnswered event follows.
  void FinishWith(grpc::Status status, double retry_after_seconds = 0) {
    code_ = status.error_code();
    if (code_ == grpc::StatusCode::UNAVAILABLE) {
      context_.AddTrailingMetadata("retry-after",
                                   std::to_string(std::max<int64_t>(
                                       1, static_cast<int64_t>(std::ceil(retry_after_seconds)))));
    }
    if (status.ok()) {
      responder_.Finish(response_, status, &answered_);
    } else {
      responder_.FinishWithError(status, &answered_);
    }
  }
  void FinishWith(const Status& status) {
    FinishWith(ToGrpc(status), status.retry_after_seconds());
  }

  void Submit() {
    if (!server_.Authorized(context_)) return FinishWith(GrpcServer::Impl::Unauthenticated());
    auto model = server_.FindModel(request_.model_name(), request_.model_version());
    if (!model.ok()) return FinishWith(model.status());
    std::shared_ptr<ModelScheduler> scheduler = *model;
    auto parsed = ParseGrpcInferRequest(request_, scheduler->config(), server_.limits());
    if (!parsed.ok()) return FinishWith(parsed.status());

    // The call's deadline is the request's: one that passes in the queue is never run.
    std::optional<Clock::time_point> deadline;
    const auto remaining = context_.deadline() - std::chrono::system_clock::now();
    if (remaining < std::chrono::hours(24 * 365)) {
      deadline = Clock::Real().Now() + std::chrono::duration_cast<Clock::duration>(remaining);
    }
    // The answer is encoded and sent on the finisher thread, never on the model's worker.
    V2Done done = [this, scheduler](std::shared_ptr<const V2InferRequest> meta,
                                    InferResponse&& result) {
      server_.Finish([this, scheduler, meta = std::move(meta), result = std::move(result)] {
        if (!result.status.ok()) return FinishWith(result.status);
        Status encoded =
            EncodeGrpcInferResponse(scheduler->config(), *meta, result.outputs, &response_);
        FinishWith(encoded.ok() ? grpc::Status::OK : ToGrpc(encoded));
      });
    };
    auto id = V2Service::Submit(scheduler, std::move(*parsed), {start_, deadline}, std::move(done));
    if (!id.ok()) return FinishWith(id.status());
    bool cancelled;
    {
      MutexLock lock(mu_);
      scheduler_ = scheduler;
      id_ = *id;
      cancelled = cancelled_;
    }
    if (cancelled) scheduler->Cancel(*id);
  }

  GrpcServer::Impl& server_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext context_;
  inference::ModelInferRequest request_;
  inference::ModelInferResponse response_;
  grpc::ServerAsyncResponseWriter<inference::ModelInferResponse> responder_;
  Tag arrived_{this, kArrived}, answered_{this, kAnswered}, done_{this, kDone};
  Clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  std::atomic<int> refs_{2};  // kAnswered and kDone.
  Mutex mu_;
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::shared_ptr<ModelScheduler> scheduler_ GUARDED_BY(mu_);
  RequestId id_ GUARDED_BY(mu_) = 0;
};

}  // namespace

void GrpcServer::Impl::RequestCall(grpc::ServerCompletionQueue* cq) {
  if (shutting_down()) return;
  {
    MutexLock lock(calls_mu_);
    ++live_calls_;
  }
  (new InferCall(*this, cq))->Request();
}

void GrpcServer::Impl::Poll(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    auto* event = static_cast<InferCall::Tag*>(tag);
    event->call->Proceed(event->event, ok);
  }
}

GrpcServer::GrpcServer(GrpcServerOptions options, V2Service& service)
    : impl_(std::make_unique<Impl>(std::move(options), service)) {}

GrpcServer::~GrpcServer() { impl_->Shutdown(Clock::duration::zero()); }

Status GrpcServer::Start() { return impl_->Start(); }

uint16_t GrpcServer::port() const { return impl_->port(); }

void GrpcServer::Shutdown(Clock::duration grace) { impl_->Shutdown(grace); }

std::string GrpcServer::RenderMetrics() const { return impl_->RenderMetrics(); }

}  // namespace sluice
