// gRPC load generator on the callback client API.
#include "bench/grpc_load.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

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

class GrpcLoadRunner {
 public:
  GrpcLoadRunner(const GrpcLoadOptions& options, inference::ModelInferRequest request,
                 std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs)
      : options_(options), request_(std::move(request)), stubs_(std::move(stubs)) {}

  HttpLoadRun Run() {
    start_ = Clock::Real().Now();
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(options_.warmup);
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(options_.duration);
    UtilizationSampler sampler;
    sampler.Start();
    if (options_.rate > 0) {
      std::mt19937_64 rng(options_.seed);
      std::exponential_distribution<double> gap(options_.rate);
      Clock::time_point next = start_;
      for (;;) {
        next += std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng)));
        if (next >= end_) break;
        std::this_thread::sleep_until(next);
        std::unique_lock lock(mu_);
        if (in_flight_ < options_.concurrency) {
          ++in_flight_;
          lock.unlock();
          Issue(next);
        } else {
          pending_.push_back(next);
        }
      }
    } else {
      {
        std::lock_guard lock(mu_);
        in_flight_ = options_.concurrency;
      }
      for (int i = 0; i < options_.concurrency; ++i) Issue(Clock::Real().Now());
    }
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [this] { return in_flight_ == 0; });
    }
    sampler.Stop();
    HttpLoadRun run;
    std::lock_guard lock(mu_);
    run.summary = Summarize(records_, /*first_is_warmup=*/false);
    run.utilization = sampler.Average(measure_from_, end_);
    run.records = std::move(records_);
    run.transport_errors = transport_errors_;
    run.first_transport_errors = std::move(first_transport_errors_);
    run.unsent = static_cast<int64_t>(pending_.size());
    run.sent = sent_;
    run.answered = answered_;
    run.unavailable_without_retry_after = unavailable_without_retry_after_;
    return run;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    Clock::time_point scheduled;
    Clock::time_point sent;
  };

  // Starts a call due at `scheduled`; its slot in in_flight_ is already counted.
  void Issue(Clock::time_point scheduled) {
    auto* call = new Call;
    call->scheduled = scheduled;
    if (!options_.api_key.empty()) {
      call->context.AddMetadata("authorization", "Bearer " + options_.api_key);
    }
    auto& stub = *stubs_[next_stub_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()];
    call->sent = Clock::Real().Now();
    stub.async()->ModelInfer(&call->context, &request_, &call->response,
                             [this, call](grpc::Status status) { Done(call, status); });
  }

  void Done(Call* call, const grpc::Status& status) {
    const Clock::time_point now = Clock::Real().Now();
    std::optional<Clock::time_point> next;
    {
      std::lock_guard lock(mu_);
      ++sent_;
      const bool refused = status.error_code() == grpc::StatusCode::UNAVAILABLE;
      const bool retry_after =
          refused && call->context.GetServerTrailingMetadata().count("retry-after") > 0;
      if (refused && !retry_after) {
        // No answer from the service itself: the transport failed.
        ++transport_errors_;
        ++unavailable_without_retry_after_;
        if (first_transport_errors_.size() < 5) {
          first_transport_errors_.push_back(status.error_message());
        }
      } else {
        ++answered_;
      }
      const Clock::time_point origin = options_.rate > 0 ? call->scheduled : call->sent;
      if (origin >= measure_from_) {
        RequestRecord record;
        record.request_time = origin;
        record.start_time = call->sent;
        record.response_time = now;
        record.samples = options_.samples_per_request;
        record.outcome = OutcomeOf(status.error_code());
        records_.push_back(record);
      }
      if (options_.rate > 0) {
        if (!pending_.empty()) {
          next = pending_.front();
          pending_.pop_front();
        }
      } else if (now < end_) {
        next = now;
      }
      if (!next) {
        --in_flight_;
        if (in_flight_ == 0) idle_.notify_all();
      }
    }
    delete call;
    if (next) Issue(*next);
  }

  const GrpcLoadOptions& options_;
  const inference::ModelInferRequest request_;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs_;
  std::atomic<size_t> next_stub_{0};
  Clock::time_point start_, measure_from_, end_;
  std::mutex mu_;
  std::condition_variable idle_;
  int in_flight_ = 0;
  std::deque<Clock::time_point> pending_;
  std::vector<RequestRecord> records_;
  int64_t transport_errors_ = 0;
  std::vector<std::string> first_transport_errors_;
  int64_t sent_ = 0;
  int64_t answered_ = 0;
  int64_t unavailable_without_retry_after_ = 0;
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
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs;
  for (int i = 0; i < channels; ++i) {
    stubs.push_back(inference::GRPCInferenceService::NewStub(MakeChannel(options.target, i)));
  }
  auto request = BuildRequest(*stubs[0], options);
  if (!request.ok()) return request.status();
  GrpcLoadRunner runner(options, std::move(*request), std::move(stubs));
  return runner.Run();
}

}  // namespace sluice
