// In-process pipeline and engine ceiling.
#include "bench/in_process.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "bench/payload.h"
#include "common/blocking_queue.h"
#include "engine/model_scheduler.h"

namespace sluice {
namespace {

struct Request {
  const std::vector<Tensor>* inputs = nullptr;
  RequestRecord record;
};

Status CheckOptions(const ModelConfig& config, std::span<BackendInstance* const> instances,
                    const InProcessOptions& o) {
  if (instances.empty()) return Status::InvalidArgument("no instances to run");
  if (o.batch_size < 1 || o.batch_size > config.max_batch_size) {
    return Status::InvalidArgument(
        fmt::format("batch size {} must be between 1 and the model's "
                    "max_batch_size {}",
                    o.batch_size, config.max_batch_size));
  }
  if (o.iterations < 1) return Status::InvalidArgument("iterations must be >= 1");
  if (o.distinct_payloads < 1) return Status::InvalidArgument("distinct payloads must be >= 1");
  if (o.max_in_flight < 0) return Status::InvalidArgument("max in flight must be >= 0");
  return Status::Ok();
}

Result<std::vector<std::vector<Tensor>>> BuildPayloads(const ModelConfig& config,
                                                       const InProcessOptions& o) {
  std::vector<std::vector<Tensor>> payloads;
  int count = std::min(o.distinct_payloads, o.iterations + 1);
  for (int i = 0; i < count; ++i) {
    auto inputs = MakeRandomInputs(config, o.batch_size, o.seed + static_cast<uint64_t>(i));
    if (!inputs.ok()) return inputs.status();
    payloads.push_back(std::move(*inputs));
  }
  return payloads;
}

// Summary, utilisation over the timed region, and the raw samples.
BenchRun Finish(std::vector<RequestRecord> records, UtilizationSampler& sampler) {
  sampler.Stop();
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.request_time < b.request_time; });
  BenchRun run;
  run.summary = Summarize(records, /*first_is_warmup=*/true);
  if (records.size() > 1) {
    Clock::time_point from = records[1].request_time;
    Clock::time_point to = records[1].response_time;
    for (const RequestRecord& r : records) to = std::max(to, r.response_time);
    run.utilization = sampler.Average(from, to);
  }
  run.utilization_samples = sampler.samples();
  run.records = std::move(records);
  return run;
}

}  // namespace

Result<BenchRun> RunInProcessPipeline(const ModelConfig& config,
                                      std::span<BackendInstance* const> instances,
                                      const InProcessOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(config, instances, options));
  auto payloads = BuildPayloads(config, options);
  if (!payloads.ok()) return payloads.status();

  const int total = options.iterations + 1;  // The warm-up request first.
  const int max_in_flight =
      options.max_in_flight > 0 ? options.max_in_flight : 2 * static_cast<int>(instances.size());
  // In-flight slots as tokens in a queue: the generator blocks on a condition variable while none
  // is free. (libstdc++ 12's counting_semaphore spins in acquire(), taking a core from the model.)
  // One token at first: the warm-up request runs alone, so its latency is the cold start and the
  // timed region does not begin behind it.
  BlockingQueue<int> slots;
  slots.Push(0);
  BlockingQueue<Request> requests;
  BlockingQueue<Request> responses;
  Clock& clock = Clock::Real();

  UtilizationSampler sampler;
  sampler.Start();

  std::vector<std::thread> workers;
  std::vector<Status> attach_errors(instances.size());
  for (size_t w = 0; w < instances.size(); ++w) {
    workers.emplace_back([&, w] {
      attach_errors[w] = instances[w]->AttachToCurrentThread();
      while (std::optional<Request> request = requests.Pop()) {
        Status status = attach_errors[w];
        request->record.start_time = clock.Now();
        if (status.ok()) {
          auto outputs = instances[w]->Run(*request->inputs);
          status = outputs.status();
        }
        request->record.response_time = clock.Now();
        request->record.outcome = status.code();
        request->record.worker = static_cast<int>(w);
        responses.Push(*request);
      }
    });
  }

  std::vector<RequestRecord> records;
  records.reserve(total);
  std::thread collector([&] {
    for (int i = 0; i < total; ++i) {
      std::optional<Request> response = responses.Pop();
      if (!response) break;
      records.push_back(response->record);
      for (int t = 0; t < (i == 0 ? max_in_flight : 1); ++t) slots.Push(0);
    }
  });

  // The generator: payloads exist already, so request_time is stamped right before hand-over.
  for (int i = 0; i < total; ++i) {
    if (!slots.Pop()) break;
    Request request;
    request.inputs = &(*payloads)[static_cast<size_t>(i) % payloads->size()];
    request.record.samples = options.batch_size;
    request.record.request_time = clock.Now();
    requests.Push(request);
  }
  collector.join();
  requests.Close();
  for (std::thread& t : workers) t.join();
  responses.Close();
  for (const Status& s : attach_errors) {
    if (!s.ok()) return s;
  }
  return Finish(std::move(records), sampler);
}

Result<BenchRun> RunBatchedPipeline(const ModelConfig& config,
                                    std::span<BackendInstance* const> instances,
                                    const InProcessOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(config, instances, options));
  if (options.max_in_flight < 1) {
    return Status::InvalidArgument("the batched pipeline needs a concurrency >= 1");
  }
  auto payloads = BuildPayloads(config, options);
  if (!payloads.ok()) return payloads.status();

  // The caller keeps ownership of the instances; the scheduler only borrows them for this run.
  std::vector<std::shared_ptr<BackendInstance>> borrowed;
  for (BackendInstance* instance : instances) {
    borrowed.emplace_back(instance, [](BackendInstance*) {});
  }
  ModelConfig run_config = config;
  if (!run_config.instances.on_gpu())
    run_config.instances.count = static_cast<int>(instances.size());
  auto scheduler = ModelScheduler::Start(run_config, std::move(borrowed));
  if (!scheduler.ok()) return scheduler.status();

  const int total = options.iterations + 1;  // The warm-up request first, alone.
  const int concurrency = options.max_in_flight;
  std::vector<RequestRecord> records(static_cast<size_t>(total));
  BlockingQueue<int> slots;
  slots.Push(0);
  std::mutex done_mu;
  std::condition_variable done_cv;
  int completed = 0;
  Clock& clock = Clock::Real();
  auto finish_one = [&](int index) {
    for (int t = 0; t < (index == 0 ? concurrency : 1); ++t) slots.Push(0);
    std::lock_guard lock(done_mu);
    if (++completed == total) done_cv.notify_all();
  };

  UtilizationSampler sampler;
  sampler.Start();
  for (int i = 0; i < total; ++i) {
    if (!slots.Pop()) break;
    RequestRecord& record = records[static_cast<size_t>(i)];
    auto request = std::make_unique<InferRequest>();
    request->inputs = (*payloads)[static_cast<size_t>(i) % payloads->size()];
    request->done = [&, i](InferResponse&& response) {
      RequestRecord& r = records[static_cast<size_t>(i)];
      r.response_time = clock.Now();
      r.start_time = response.times.compute_start;
      r.outcome = response.status.code();
      r.batch_id = response.batch_id;
      r.batch_size = response.batch_size;
      r.worker = response.instance;
      r.engine = response.times;
      finish_one(i);
    };
    record.samples = options.batch_size;
    record.request_time = clock.Now();
    auto id = (*scheduler)->Submit(std::move(request));
    if (!id.ok()) {
      record.response_time = clock.Now();
      record.outcome = id.status().code();
      finish_one(i);
    }
  }
  {
    std::unique_lock lock(done_mu);
    done_cv.wait(lock, [&] { return completed == total; });
  }
  (*scheduler)->Stop();
  return Finish(std::move(records), sampler);
}

Result<BenchRun> RunEngineCeiling(const ModelConfig& config,
                                  std::span<BackendInstance* const> instances,
                                  const InProcessOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(config, instances, options));
  auto payloads = BuildPayloads(config, options);
  if (!payloads.ok()) return payloads.status();

  const int total = options.iterations + 1;
  std::atomic<int> next{1};  // Request 0, the warm-up, runs alone on worker 0 first.
  std::promise<void> warmed_up;
  std::shared_future<void> warmup_done = warmed_up.get_future().share();
  Clock& clock = Clock::Real();
  std::vector<std::vector<RequestRecord>> per_worker(instances.size());
  std::vector<Status> errors(instances.size());

  UtilizationSampler sampler;
  sampler.Start();
  std::vector<std::thread> workers;
  for (size_t w = 0; w < instances.size(); ++w) {
    workers.emplace_back([&, w] {
      errors[w] = instances[w]->AttachToCurrentThread();
      auto run_one = [&](int i) {
        RequestRecord record;
        record.samples = options.batch_size;
        record.worker = static_cast<int>(w);
        record.request_time = clock.Now();
        record.start_time = record.request_time;
        auto outputs = instances[w]->Run((*payloads)[static_cast<size_t>(i) % payloads->size()]);
        record.response_time = clock.Now();
        record.outcome = outputs.status().code();
        per_worker[w].push_back(record);
      };
      if (w == 0) {
        if (errors[w].ok()) run_one(0);
        warmed_up.set_value();
      } else {
        warmup_done.wait();
      }
      if (!errors[w].ok()) return;
      for (int i = next++; i < total; i = next++) run_one(i);
    });
  }
  for (std::thread& t : workers) t.join();
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  std::vector<RequestRecord> records;
  for (auto& list : per_worker) records.insert(records.end(), list.begin(), list.end());
  return Finish(std::move(records), sampler);
}

std::string FormatReport(const LoadReport& load, const BenchRun& run) {
  const Summary& s = run.summary;
  std::string out;
  auto line = [&](std::string text) { out += text + '\n'; };
  line(fmt::format("Model load time: {:.5f} s", load.load_seconds));
  line(fmt::format("Compile/optimise time: {:.5f} s", load.optimize_seconds));
  line(fmt::format("Engine warm-up time (configured batch sizes): {:.5f} s", load.warmup_seconds));
  if (s.warmup_latency) line(fmt::format("Warmup latency: {:.5f} s", *s.warmup_latency));
  line(fmt::format("Requests (exclude warmup): {} ok, {} failed", s.ok_requests,
                   s.requests - s.ok_requests));
  for (const auto& [kind, count] : s.errors) line(fmt::format("  errors {}: {}", kind, count));
  const LatencyStats& l = s.latency;
  line(fmt::format("Average latency (exclude warmup): {:.5f} +/- {:.5f} s", l.mean, l.std));
  line(fmt::format("Average queue wait / compute: {:.5f} / {:.5f} s", s.mean_queue_seconds,
                   s.mean_compute_seconds));
  if (!s.batches_by_size.empty()) {
    int64_t batches = 0;
    for (const auto& [size, count] : s.batches_by_size) batches += count;
    std::string sizes;
    int shown = 0;
    for (auto it = s.batches_by_size.rbegin(); it != s.batches_by_size.rend(); ++it) {
      if (shown++ == 8) {
        sizes += ", ...";
        break;
      }
      sizes += fmt::format("{}{}: {} ({:.1f}%)", sizes.empty() ? "" : ", ", it->first, it->second,
                           100.0 * static_cast<double>(it->second) / batches);
    }
    line(fmt::format("Batches: {}, mean size {:.2f} samples; by size: {}", batches,
                     s.mean_batch_size, sizes));
  }
  line(fmt::format("Max latency: {:.5f} s", l.max));
  line(fmt::format("Min latency: {:.5f} s", l.min));
  line(fmt::format(
      "Latency p50 / p90 / p95 / p99 / p99.9: {:.5f} / {:.5f} / {:.5f} / {:.5f} / {:.5f} s", l.p50,
      l.p90, l.p95, l.p99, l.p999));
  line(fmt::format(
      "Throughput (exclude warmup): {:.5f} samples per second ({:.3f} requests per second)",
      s.samples_per_second, s.requests_per_second));
  const UtilizationAverages& u = run.utilization;
  line(fmt::format("Average CPU utilization: machine {:.1f}%, process {:.1f}% (of all cores)",
                   u.machine_cpu_percent, u.process_cpu_percent));
  if (u.gpu_percent) {
    line(fmt::format("Average GPU utilization: {:.1f}% ({:.0f} MiB used)", *u.gpu_percent,
                     *u.gpu_memory_mib));
  } else {
    line(fmt::format("Average GPU utilization: n/a"));
  }
  return out;
}

}  // namespace sluice
