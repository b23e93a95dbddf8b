// What the batcher and instance pool add per request, with an echo backend (no model time):
// Submit -> queue -> batch formation -> collate -> echo -> split -> completion callback.
//
// Each iteration sends a round of single-sample requests from P producer threads and waits until
// every one has completed; `per_request` is the wall time of a round divided by its requests.
//   batch 1:  max_batch_size 1, so every request is its own batch (the batcher's worst case).
//   batch 64: max_batch_size 64 and a long delay, so every batch is exactly 64 requests.
// Requests are built before the timed region: building them is the caller's cost.
#include <benchmark/benchmark.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/fake_backends.h"
#include "engine/model_scheduler.h"

namespace sluice {
namespace {

constexpr int kRoundRequests = 64 * 256;  // A multiple of 64, so batch-64 rounds fill exactly.

// Counts down completions; Wait() blocks until the round's last one. Thread-safe.
class Completions {
 public:
  void Done() {
    if (remaining_atomic_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mu_);
      finished_ = true;
      cv_.notify_all();
    }
  }
  void Arm(int64_t n) {
    std::lock_guard lock(mu_);
    finished_ = false;
    remaining_atomic_.store(n);
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int64_t> remaining_atomic_{0};
  bool finished_ = false;
};

void BM_SchedulerOverhead(benchmark::State& state) {
  const int max_batch_size = static_cast<int>(state.range(0));
  const int producers = static_cast<int>(state.range(1));

  ModelConfig config;
  config.name = "echo";
  config.max_batch_size = max_batch_size;
  // Batch 1 never waits; batch 64 waits until the batch is full (a round always fills it).
  config.dynamic_batching.max_queue_delay = Micros(max_batch_size == 1 ? 0 : 1'000'000);
  config.dynamic_batching.max_queue_size = kRoundRequests;
  config.instances.count = 1;
  config.instances.threads = 1;
  config.inputs = {{"x", DataType::kFp32, {16}}};
  config.outputs = {{"y", DataType::kFp32, {16}}};
  std::vector<std::shared_ptr<BackendInstance>> instances{
      std::make_shared<testing::EchoInstance>()};
  auto scheduler = ModelScheduler::Start(config, std::move(instances));
  if (!scheduler.ok()) {
    state.SkipWithError(scheduler.status().message().c_str());
    return;
  }

  Completions completions;
  const Tensor input = Tensor::Zeros(DataType::kFp32, {1, 16});
  std::vector<std::vector<std::unique_ptr<InferRequest>>> work(static_cast<size_t>(producers));
  std::atomic<int64_t> refused{0};

  for (auto _ : state) {
    state.PauseTiming();
    for (int p = 0; p < producers; ++p) {
      auto& list = work[static_cast<size_t>(p)];
      list.clear();
      for (int i = p; i < kRoundRequests; i += producers) {
        auto request = std::make_unique<InferRequest>();
        request->inputs.push_back(input);
        request->done = [&completions](InferResponse&&) { completions.Done(); };
        list.push_back(std::move(request));
      }
    }
    completions.Arm(kRoundRequests);
    state.ResumeTiming();

    auto produce = [&](size_t p) {
      for (auto& request : work[p]) {
        if (!(*scheduler)->Submit(std::move(request)).ok()) {
          refused.fetch_add(1);
          completions.Done();
        }
      }
    };
    if (producers == 1) {
      produce(0);
    } else {
      std::vector<std::thread> threads;
      for (size_t p = 0; p < static_cast<size_t>(producers); ++p) threads.emplace_back(produce, p);
      for (std::thread& t : threads) t.join();
    }
    completions.Wait();
  }
  if (refused.load() > 0) state.SkipWithError("requests were refused; the round overflowed");

  ModelStatsSnapshot stats = (*scheduler)->stats();
  state.counters["per_request"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kRoundRequests,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["mean_batch"] = stats.batch_size.Mean();
  state.SetItemsProcessed(state.iterations() * kRoundRequests);
}

BENCHMARK(BM_SchedulerOverhead)
    ->ArgNames({"batch", "producers"})
    ->ArgsProduct({{1, 64}, {1, 2, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
