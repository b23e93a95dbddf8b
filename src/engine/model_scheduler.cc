// Model scheduler: workers that take batches, collate, run, split and complete.
#include "engine/model_scheduler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <span>
#include <utility>

#include "common/handoff_batch.h"
#include "device/gpu_monitor.h"

namespace sluice {
namespace {

// One input tensor for the whole batch: the requests' rows back to back, then zero rows up to
// `rows` (the instance's batch size for `samples`), each row copied once. A single request whose
// rows are the whole batch passes through without a copy.
std::vector<Tensor> Collate(std::span<const std::unique_ptr<InferRequest>> requests,
                            int64_t samples, int64_t rows) {
  if (requests.size() == 1 && rows == samples) return requests[0]->inputs;
  const size_t input_count = requests[0]->inputs.size();
  std::vector<Tensor> batch;
  batch.reserve(input_count);
  for (size_t i = 0; i < input_count; ++i) {
    const Tensor& first = requests[0]->inputs[i];
    Shape shape = first.shape();
    shape[0] = rows;
    Tensor joined = Tensor::Uninitialized(first.dtype(), std::move(shape));
    char* out = static_cast<char*>(joined.mutable_data());
    for (const auto& request : requests) {
      const Tensor& part = request->inputs[i];
      std::memcpy(out, part.data(), part.byte_size());
      out += part.byte_size();
    }
    const char* end = static_cast<const char*>(joined.data()) + joined.byte_size();
    std::memset(out, 0, static_cast<size_t>(end - out));
    batch.push_back(std::move(joined));
  }
  return batch;
}

// Runs `requests` as one batch and returns each request's outputs (rows of the batch outputs,
// shared without a copy; padding rows are dropped).
Result<std::vector<std::vector<Tensor>>> RunAndSplit(
    BackendInstance& instance, std::span<const std::unique_ptr<InferRequest>> requests,
    int64_t samples) {
  const int64_t rows = std::max(instance.BatchRows(samples), samples);
  auto outputs = instance.Run(Collate(requests, samples, rows));
  if (!outputs.ok()) return outputs.status();
  for (const Tensor& output : *outputs) {
    if (output.shape().empty() || output.shape()[0] != rows) {
      return Status::Internal(
          fmt::format("model returned an output of shape {} for a batch of {} rows",
                      ShapeToString(output.shape()), rows));
    }
  }
  std::vector<std::vector<Tensor>> per_request(requests.size());
  int64_t row = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const int64_t request_rows = requests[r]->samples();
    per_request[r].reserve(outputs->size());
    for (const Tensor& output : *outputs) {
      per_request[r].push_back(output.SliceRows(row, request_rows));
    }
    row += request_rows;
  }
  return per_request;
}

}  // namespace

SchedulerOptions SchedulerOptionsFromConfig(const ModelConfig& config) {
  SchedulerOptions options;
  options.batcher.policy =
      config.dynamic_batching.adaptive ? BatchingPolicy::kAdaptive : BatchingPolicy::kFixed;
  options.batcher.max_batch_size = config.max_batch_size;
  options.batcher.max_queue_delay = config.dynamic_batching.max_queue_delay;
  options.batcher.preferred_batch_sizes = config.dynamic_batching.preferred_batch_sizes;
  options.batcher.max_queue_size = config.dynamic_batching.max_queue_size;
  options.batcher.max_queue_time = config.dynamic_batching.max_queue_time;
  options.batcher.latency_target = config.dynamic_batching.slo_p99;
  options.batcher.instances = config.instances.workers();
  options.batcher.idle_spin = config.instances.idle_spin;
  options.default_timeout = config.dynamic_batching.default_timeout;
  return options;
}

Status ValidateRequestInputs(const ModelConfig& config, const InferRequest& request) {
  if (request.inputs.size() != config.inputs.size()) {
    return Status::InvalidArgument(fmt::format("model '{}' takes {} input(s), got {}", config.name,
                                               config.inputs.size(), request.inputs.size()));
  }
  const int64_t samples = request.samples();
  for (size_t i = 0; i < config.inputs.size(); ++i) {
    const TensorSpec& spec = config.inputs[i];
    const Tensor& tensor = request.inputs[i];
    if (tensor.dtype() != spec.datatype) {
      return Status::InvalidArgument(fmt::format("input '{}': datatype {} expected, got {}",
                                                 spec.name, DataTypeName(spec.datatype),
                                                 DataTypeName(tensor.dtype())));
    }
    const Shape& shape = tensor.shape();
    bool shape_ok = shape.size() == spec.shape.size() + 1 && shape[0] == samples;
    for (size_t d = 0; shape_ok && d < spec.shape.size(); ++d) {
      shape_ok = shape[d + 1] >= 0 && (spec.shape[d] < 0 || shape[d + 1] == spec.shape[d]);
    }
    if (!shape_ok) {
      Shape expected = spec.shape;
      expected.insert(expected.begin(), -1);
      return Status::InvalidArgument(fmt::format(
          "input '{}': shape {} does not match {} (batch first, {} samples in the first input)",
          spec.name, ShapeToString(shape), ShapeToString(expected), samples));
    }
  }
  if (samples < 1 || samples > config.max_batch_size) {
    return Status::InvalidArgument(
        fmt::format("request has {} samples; model '{}' takes 1 to {} (max_batch_size)", samples,
                    config.name, config.max_batch_size));
  }
  return Status::Ok();
}

ModelScheduler::ModelScheduler(ModelConfig config,
                               std::vector<std::shared_ptr<BackendInstance>> instances,
                               Clock& clock)
    : config_(std::move(config)),
      options_(SchedulerOptionsFromConfig(config_)),
      clock_(clock),
      instances_(std::move(instances)),
      batcher_(options_.batcher, clock),
      stats_(config_.max_batch_size, static_cast<int>(instances_.size())) {}

Result<std::unique_ptr<ModelScheduler>> ModelScheduler::Start(
    ModelConfig config, std::vector<std::shared_ptr<BackendInstance>> instances, Clock& clock,
    std::function<void(const Status&)> on_device_failure) {
  if (instances.empty()) return Status::InvalidArgument("a model needs at least one instance");
  if (config.instances.on_gpu()) GpuMonitor::Global().Watch(config.instances.gpus);
  std::unique_ptr<ModelScheduler> scheduler(
      new ModelScheduler(std::move(config), std::move(instances), clock));
  scheduler->on_device_failure_ = std::move(on_device_failure);
  std::vector<std::promise<Status>> attached(scheduler->instances_.size());
  for (size_t i = 0; i < scheduler->instances_.size(); ++i) {
    scheduler->workers_.emplace_back([s = scheduler.get(), i, &attached] {
      Status status = s->instances_[i]->AttachToCurrentThread();
      const bool ok = status.ok();
      attached[i].set_value(std::move(status));  // `attached` is not touched after this.
      if (ok) s->WorkerLoop(i);
    });
  }
  scheduler->timer_ = std::thread([s = scheduler.get()] { s->TimerLoop(); });
  Status first_error;
  for (auto& promise : attached) {
    Status status = promise.get_future().get();
    if (!status.ok() && first_error.ok()) first_error = std::move(status);
  }
  if (!first_error.ok()) {
    scheduler->Stop(StopMode::kReject);
    return Status(first_error.code(), fmt::format("model '{}': instance failed to start: {}",
                                                  scheduler->config_.name, first_error.message()));
  }
  return scheduler;
}

ModelScheduler::~ModelScheduler() { Stop(StopMode::kDrain); }

Result<RequestId> ModelScheduler::Submit(std::unique_ptr<InferRequest> request) {
  stats_.RecordSubmitted();
  Status status = failed_.load(std::memory_order_acquire) ? failure() : Status::Ok();
  if (status.ok()) status = ValidateRequestInputs(config_, *request);
  if (status.ok() && !request->done) status = Status::InvalidArgument("request has no callback");
  if (status.ok()) {
    if (!request->deadline && options_.default_timeout.count() > 0) {
      const Clock::time_point from =
          request->arrived != Clock::time_point{} ? request->arrived : clock_.Now();
      request->deadline = from + options_.default_timeout;
    }
    const RequestId id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
    request->id = id;
    status = batcher_.Enqueue(request);
    if (status.ok()) return id;
  }
  stats_.RecordRefused(status.code());
  return status;
}

Result<std::shared_ptr<const void>> ModelScheduler::Admit() {
  if (failed_.load(std::memory_order_acquire)) {
    stats_.RecordSubmitted();
    stats_.RecordRefused(StatusCode::kUnavailable);
    return failure();
  }
  std::optional<Clock::time_point> deadline;
  if (options_.default_timeout.count() > 0) deadline = clock_.Now() + options_.default_timeout;
  auto ticket = batcher_.Admit(1, deadline);
  if (!ticket.ok()) {
    stats_.RecordSubmitted();
    stats_.RecordRefused(ticket.status().code());
  }
  return ticket;
}

bool ModelScheduler::Cancel(RequestId id) {
  std::unique_ptr<InferRequest> request = batcher_.Cancel(id);
  if (!request) return false;
  InferResponse response;
  response.status = Status::Cancelled("request cancelled while queued");
  Complete(std::move(request), std::move(response));
  return true;
}

void ModelScheduler::Stop(StopMode mode) {
  std::call_once(stop_once_, [&] {
    batcher_.Close();
    if (mode == StopMode::kReject) {
      for (auto& request : batcher_.TakeAll()) {
        InferResponse response;
        response.status = Status::Unavailable("model stopped before the request ran");
        Complete(std::move(request), std::move(response));
      }
    }
    // Workers run whatever is still queued (nothing, after kReject) and exit when it is empty.
    for (std::thread& worker : workers_) worker.join();
    if (timer_.joinable()) timer_.join();
  });
}

ModelStatsSnapshot ModelScheduler::stats() const {
  ModelStatsSnapshot s = stats_.Snapshot(batcher_.queued_requests(), batcher_.queued_samples());
  const BatcherOptions& o = batcher_.options();
  s.adaptive_batching = o.policy == BatchingPolicy::kAdaptive;
  s.target_batch_size = static_cast<int>(batcher_.target_batch_size());
  s.company_rate = batcher_.company_rate();
  s.instance_wakeups = batcher_.instance_wakeups();
  s.spin_catches = batcher_.spin_catches();
  s.drain_rate = batcher_.drain_rate();
  s.wait_calibration = batcher_.wait_calibration();
  s.intake_seconds = batcher_.intake_seconds();
  for (const BatchCostModel::Entry& e : batcher_.cost_model().Snapshot()) {
    s.batch_costs.push_back({e.samples, e.seconds, e.batches});
  }
  if (config_.instances.on_gpu()) {
    for (int gpu : config_.instances.gpus) {
      if (auto reading = GpuMonitor::Global().Latest(gpu)) s.gpus.emplace_back(gpu, *reading);
    }
  }
  return s;
}

void ModelScheduler::SeedCosts(const std::vector<std::pair<int, double>>& costs) {
  for (const auto& [samples, seconds] : costs) batcher_.cost_model().Seed(samples, seconds);
}

void ModelScheduler::WorkerLoop(size_t index) {
  BackendInstance& instance = *instances_[index];
  while (true) {
    BatcherPoll poll = batcher_.WaitForBatch();
    if (poll.batch.requests.empty() && poll.expired.empty()) return;  // Closed and empty.
    const Clock::time_point now = clock_.Now();
    for (auto& request : poll.expired) {
      InferResponse response;
      response.status = Status::DeadlineExceeded(
          request->deadline && *request->deadline > now
              ? "request would not finish by its deadline: its wait in the queue left less than "
                "its batch takes"
              : "request deadline passed while queued");
      Complete(std::move(request), std::move(response));
    }
    if (!poll.batch.requests.empty()) RunBatch(instance, static_cast<int>(index), poll.batch);
  }
}

void ModelScheduler::TimerLoop() {
  while (true) {
    std::vector<std::unique_ptr<InferRequest>> expired = batcher_.WaitForExpiry();
    if (expired.empty()) return;  // Closed.
    for (auto& request : expired) {
      InferResponse response;
      response.status = Status::DeadlineExceeded("request deadline passed while queued");
      Complete(std::move(request), std::move(response));
    }
  }
}

void ModelScheduler::RunBatch(BackendInstance& instance, int instance_index, Batch& batch) {
  const uint64_t batch_id = next_batch_id_.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point start = clock_.Now();
  for (auto& request : batch.requests) request->times.compute_start = start;

  auto results = RunAndSplit(instance, batch.requests, batch.samples);
  const bool failed = !results.ok();
  std::vector<Status> statuses(batch.requests.size());
  std::vector<std::vector<Tensor>> outputs;
  if (results.ok()) {
    outputs = std::move(*results);
  } else if (batch.requests.size() == 1 || CheckDevice(instance)) {
    // One request, or a device that can run nothing more: every request gets the batch's error.
    for (Status& status : statuses) status = results.status();
    outputs.resize(batch.requests.size());
  } else {
    // One bad input must not fail its neighbours: run each request alone.
    spdlog::warn("model '{}': batch of {} requests failed ({}); retrying one by one", config_.name,
                 batch.requests.size(), results.status().message());
    outputs.resize(batch.requests.size());
    for (size_t r = 0; r < batch.requests.size(); ++r) {
      auto single = RunAndSplit(instance, std::span(batch.requests).subspan(r, 1),
                                batch.requests[r]->samples());
      if (single.ok()) {
        outputs[r] = std::move((*single)[0]);
      } else {
        statuses[r] = single.status();
      }
    }
  }
  if (failed) CheckDevice(instance);
  const Clock::time_point end = clock_.Now();
  const double seconds = SecondsBetween(start, end);
  stats_.RecordBatch(batch.samples, seconds, failed);
  if (!failed) batcher_.cost_model().Observe(static_cast<int>(batch.samples), seconds);

  // The batch's answers reach their I/O threads in one hand-off per thread. A batch of one has
  // nothing else to answer: its answer may be finished and sent from here, without a hand-off.
  HandOffBatch handoffs(/*in_place=*/batch.requests.size() == 1);
  for (size_t r = 0; r < batch.requests.size(); ++r) {
    batch.requests[r]->times.compute_end = end;
    InferResponse response;
    response.status = std::move(statuses[r]);
    response.outputs = std::move(outputs[r]);
    response.batch_id = batch_id;
    response.batch_size = static_cast<int>(batch.samples);
    response.instance = instance_index;
    Complete(std::move(batch.requests[r]), std::move(response));
  }
}

Status ModelScheduler::failure() const {
  MutexLock lock(failure_mu_);
  return failure_;
}

bool ModelScheduler::CheckDevice(const BackendInstance& instance) {
  Status why = instance.DeviceFailure();
  if (why.ok()) return false;
  {
    MutexLock lock(failure_mu_);
    if (!failure_.ok()) return true;  // Reported already.
    failure_ = Status::Unavailable(
        fmt::format("model '{}' is not ready: {}", config_.name, why.message()));
    failed_.store(true, std::memory_order_release);
  }
  spdlog::error("model '{}': its device failed ({}); it takes no requests until it is reloaded",
                config_.name, why.message());
  if (on_device_failure_) on_device_failure_(why);
  return true;
}

void ModelScheduler::Complete(std::unique_ptr<InferRequest> request, InferResponse response) {
  response.times = request->times;
  stats_.RecordCompletion(response.status.code(), request->times, clock_.Now());
  InferCallback done = std::move(request->done);
  request.reset();  // Inputs are released before the caller's callback runs.
  try {
    done(std::move(response));
  } catch (const std::exception& e) {
    spdlog::error("model '{}': a completion callback threw: {}", config_.name, e.what());
  } catch (...) {
    spdlog::error("model '{}': a completion callback threw", config_.name);
  }
}

}  // namespace sluice
