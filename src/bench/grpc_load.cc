// gRPC load generator on the callback client API.
#include "bench/grpc_load.h"

#include <fmt/format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <deque>
#include <optional>
#include <random>

#include "bench/payload.h"
#include "grpc_predict_v2.grpc.pb.h"

namespace sluice {
namespace {

StatusCode OutcomeOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kPayloadTooLarge;
    case grpc::StatusCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kCancelled;
    default:
      return StatusCode::kInternal;
  }
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Its own connection: channels with different arguments share no subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("sluice.bench_channel", index);
  // A load generator's channel: no retries (no copy of each request kept for them), no optional
  // filters, no bandwidth probes, no channelz bookkeeping.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The request every call sends: the model's inputs, random, shaped from its metadata.
Result<inference::ModelInferRequest> BuildRequest(inference::GRPCInferenceService::Stub& stub,
                                                  const GrpcLoadOptions& o) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!o.api_key.empty()) context.AddMetadata("authorization", "Bearer " + o.api_key);
  inference::ModelMetadataRequest request;
  request.set_name(o.model);
  inference::ModelMetadataResponse metadata;
  grpc::Status status = stub.ModelMetadata(&context, request, &metadata);
  if (!status.ok()) {
    return Status::Unavailable(fmt::format("ModelMetadata for '{}' at {} failed: {} ({})", o.model,
                                           o.target, status.error_message(),
                                           static_cast<int>(status.error_code())));
  }
  ModelConfig config;
  config.name = o.model;
  for (const auto& input : metadata.inputs()) {
    auto dtype = ParseDataType(input.datatype());
    if (!dtype) {
      return Status::InvalidArgument(
          fmt::format("input '{}' has datatype {}, which random payloads do not cover",
                      input.name(), input.datatype()));
    }
    // The first (batch) dimension is ours to choose.
    config.inputs.push_back(
        TensorSpec{input.name(), *dtype, Shape(input.shape().begin() + 1, input.shape().end())});
  }
  auto inputs = MakeRandomInputs(config, o.samples_per_request, o.seed);
  if (!inputs.ok()) return inputs.status();
  inference::ModelInferRequest infer;
  infer.set_model_name(o.model);
  for (size_t i = 0; i < inputs->size(); ++i) {
    const Tensor& t = (*inputs)[i];
    auto* input = infer.add_inputs();
    input->set_name(config.inputs[i].name);
    input->set_datatype(std::string(DataTypeName(t.dtype())));
    for (int64_t d : t.shape()) input->add_shape(d);
    if (o.raw) {
      infer.add_raw_input_contents()->assign(static_cast<const char*>(t.data()), t.byte_size());
      continue;
    }
    auto* c = input->mutable_contents();
    auto copy = [&t](auto* field, auto sample) {
      using T = decltype(sample);
      for (T v : t.values<T>()) field->Add(v);
    };
    switch (t.dtype()) {
      case DataType::kBool:
        copy(c->mutable_bool_contents(), bool{});
        break;
      case DataType::kUInt8:
        copy(c->mutable_uint_contents(), uint8_t{});
        break;
      case DataType::kInt8:
        copy(c->mutable_int_contents(), int8_t{});
        break;
      case DataType::kInt16:
        copy(c->mutable_int_contents(), int16_t{});
        break;
      case DataType::kInt32:
        copy(c->mutable_int_contents(), int32_t{});
        break;
      case DataType::kInt64:
        copy(c->mutable_int64_contents(), int64_t{});
        break;
      case DataType::kFp32:
        copy(c->mutable_fp32_contents(), float{});
        break;
      case DataType::kFp64:
        copy(c->mutable_fp64_contents(), double{});
        break;
      case DataType::kFp16:
      case DataType::kBf16:
        return Status::InvalidArgument(fmt::format(
            "input '{}' is {}, which has no typed contents: use raw contents (--binary)",
            config.inputs[i].name, DataTypeName(t.dtype())));
    }
  }
  return infer;
}

// Drives every call of one level from the calling thread, on one completion queue: that thread
// polls the connections, records each answer and starts the next call, with no hand-off between
// threads (as the HTTP generator does with its one event loop).
class GrpcLoadRunner {
 public:
  // Every call sends `request`, serialized once (calls share its bytes, as the HTTP generator's
  // connections share one request); answers are checked by status, not parsed, as the HTTP
  // generator does not parse bodies.
  GrpcLoadRunner(const GrpcLoadOptions& options, const inference::ModelInferRequest& request,
                 const std::vector<std::shared_ptr<grpc::Channel>>& channels)
      : options_(options) {
    grpc::Slice bytes(request.SerializeAsString());
    request_ = grpc::ByteBuffer(&bytes, 1);
    for (const auto& channel : channels)
      stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
  }

  HttpLoadRun Run() {
    start_ = Clock::Real().Now();
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(options_.warmup);
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(options_.duration);
    UtilizationSampler sampler;
    sampler.Start();
    std::mt19937_64 rng(options_.seed);
    std::exponential_distribution<double> gap(options_.rate > 0 ? options_.rate : 1.0);
    std::optional<Clock::time_point> next_arrival;
    if (open_loop()) {
      next_arrival = start_ + std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng)));
    } else {
      for (int i = 0; i < options_.concurrency; ++i) Issue(Clock::Real().Now());
    }
    for (;;) {
      // Open loop: arrivals now due go out, or wait their turn for a free call.
      while (next_arrival && *next_arrival <= Clock::Real().Now()) {
        if (*next_arrival >= end_) {
          next_arrival.reset();
          break;
        }
        if (in_flight_ < options_.concurrency) {
          Issue(*next_arrival);
        } else {
          pending_.push_back(*next_arrival);
        }
        *next_arrival += std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng)));
      }
      if (in_flight_ == 0 && !next_arrival) break;
      void* tag = nullptr;
      bool ok = false;
      const auto wake = next_arrival ? ToSystem(*next_arrival)
                                     : std::chrono::system_clock::now() + std::chrono::seconds(1);
      const auto event = queue_.AsyncNext(&tag, &ok, wake);
      if (event == grpc::CompletionQueue::SHUTDOWN) break;
      if (event == grpc::CompletionQueue::GOT_EVENT) Done(static_cast<Call*>(tag));
    }
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
    sampler.Stop();
    run_.summary = Summarize(run_.records, /*first_is_warmup=*/false);
    run_.utilization = sampler.Average(measure_from_, end_);
    run_.utilization_samples = sampler.samples();
    run_.unsent = static_cast<int64_t>(pending_.size());
    return std::move(run_);
  }

 private:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    Clock::time_point scheduled;
    Clock::time_point sent;
  };

  bool open_loop() const { return options_.rate > 0; }

  static std::chrono::system_clock::time_point ToSystem(Clock::time_point t) {
    return std::chrono::system_clock::now() +
           std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::Real().Now());
  }

  // Starts a call that was due at `scheduled`.
  void Issue(Clock::time_point scheduled) {
    auto* call = new Call;
    call->scheduled = scheduled;
    if (!options_.api_key.empty()) {
      call->context.AddMetadata("authorization", "Bearer " + options_.api_key);
    }
    auto& stub = *stubs_[next_stub_++ % stubs_.size()];
    call->sent = Clock::Real().Now();
    call->reader = stub.PrepareUnaryCall(&call->context, kModelInfer, request_, &queue_);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
    ++in_flight_;
    ++run_.sent;
  }

  void Done(Call* call) {
    const Clock::time_point now = Clock::Real().Now();
    --in_flight_;
    const grpc::Status& status = call->status;
    const bool refused = status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (refused && call->context.GetServerTrailingMetadata().count("retry-after") == 0) {
      // No answer from the service itself: the transport failed.
      AddTransportError(run_, status.error_message());
      ++run_.unavailable_without_retry_after;
    } else {
      ++run_.answered;
    }
    const Clock::time_point origin = open_loop() ? call->scheduled : call->sent;
    if (origin >= measure_from_) {
      RequestRecord record;
      record.request_time = origin;
      record.start_time = call->sent;
      record.response_time = now;
      record.samples = options_.samples_per_request;
      record.outcome = OutcomeOf(status.error_code());
      run_.records.push_back(record);
    }
    delete call;
    if (open_loop()) {
      if (!pending_.empty()) {
        const Clock::time_point next = pending_.front();
        pending_.pop_front();
        Issue(next);
      }
    } else if (now < end_) {
      Issue(now);
    }
  }

  static constexpr const char* kModelInfer = "/inference.GRPCInferenceService/ModelInfer";

  const GrpcLoadOptions& options_;
  grpc::ByteBuffer request_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  grpc::CompletionQueue queue_;
  size_t next_stub_ = 0;
  int in_flight_ = 0;
  Clock::time_point start_, measure_from_, end_;
  std::deque<Clock::time_point> pending_;
  HttpLoadRun run_;  // Counts and records as they come; summarised at the end.
};

}  // namespace

Result<std::string> ParseGrpcTarget(std::string_view url) {
  for (std::string_view scheme : {"grpc://", "http://"}) {
    if (url.substr(0, scheme.size()) == scheme) url.remove_prefix(scheme.size());
  }
  if (const size_t slash = url.find('/'); slash != std::string_view::npos) {
    url = url.substr(0, slash);
  }
  const size_t colon = url.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == url.size()) {
    return Status::InvalidArgument(
        fmt::format("a gRPC address is host:port, e.g. 127.0.0.1:8001 (got '{}')", url));
  }
  return std::string(url);
}

Result<HttpLoadRun> RunGrpcLoad(const GrpcLoadOptions& options) {
  if (options.concurrency < 1) return Status::InvalidArgument("--concurrency must be >= 1");
  const int channels =
      options.channels > 0 ? options.channels : std::max(1, (options.concurrency + 15) / 16);
  std::vector<std::shared_ptr<grpc::Channel>> pool;
  for (int i = 0; i < channels; ++i) pool.push_back(MakeChannel(options.target, i));
  auto metadata_stub = inference::GRPCInferenceService::NewStub(pool[0]);
  auto request = BuildRequest(*metadata_stub, options);
  if (!request.ok()) return request.status();
  GrpcLoadRunner runner(options, *request, pool);
  return runner.Run();
}

}  // namespace sluice
