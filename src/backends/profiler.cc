// libtorch's profiler around model runs.
#include "backends/profiler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "common/json_writer.h"

namespace sluice {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

struct OperatorTotals {
  int64_t calls = 0;
  double self_us = 0;
  double total_us = 0;
};

// Operators by self time: each event's duration less its direct children's (events nest per
// thread by time).
std::vector<std::pair<std::string, OperatorTotals>> RankOperators(
    const std::vector<profiler::KinetoEvent>& events, double* window_us) {
  std::map<uint64_t, std::vector<const profiler::KinetoEvent*>> by_thread;
  uint64_t first = UINT64_MAX, last = 0;
  for (const auto& e : events) {
    if (e.deviceType() != c10::DeviceType::CPU || e.durationNs() == 0) continue;
    by_thread[e.startThreadId()].push_back(&e);
    first = std::min<uint64_t>(first, e.startNs());
    last = std::max<uint64_t>(last, e.endNs());
  }
  *window_us = last > first ? static_cast<double>(last - first) / 1e3 : 0;
  std::unordered_map<std::string, OperatorTotals> totals;
  for (auto& [thread, list] : by_thread) {
    std::sort(list.begin(), list.end(), [](const auto* a, const auto* b) {
      return a->startNs() != b->startNs() ? a->startNs() < b->startNs() : a->endNs() > b->endNs();
    });
    std::vector<std::pair<const profiler::KinetoEvent*, double>> stack;  // (event, children ns)
    auto close = [&](uint64_t until) {
      while (!stack.empty() && stack.back().first->endNs() <= until) {
        auto [e, children] = stack.back();
        stack.pop_back();
        OperatorTotals& t = totals[e->name()];
        t.calls += 1;
        t.total_us += static_cast<double>(e->durationNs()) / 1e3;
        t.self_us += std::max(0.0, static_cast<double>(e->durationNs()) - children) / 1e3;
        if (!stack.empty()) stack.back().second += static_cast<double>(e->durationNs());
      }
    };
    for (const auto* e : list) {
      close(e->startNs());
      stack.emplace_back(e, 0.0);
    }
    close(UINT64_MAX);
  }
  std::vector<std::pair<std::string, OperatorTotals>> ranked(totals.begin(), totals.end());
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  return ranked;
}

class ProfiledInstance final : public BackendInstance {
 public:
  ProfiledInstance(std::unique_ptr<BackendInstance> inner, std::string name,
                   const ProfileOptions& options, std::shared_ptr<ProfileLog> log)
      : inner_(std::move(inner)), name_(std::move(name)), options_(options), log_(std::move(log)) {}

  ~ProfiledInstance() override {
    if (state_ == State::kRecording) {
      // The profiler is thread-local: it can only be stopped on the thread that runs us.
      spdlog::warn("profile {}: the window ended early ({} of {} runs); no trace written", name_,
                   recorded_, options_.runs);
    }
  }

  Status AttachToCurrentThread() override { return inner_->AttachToCurrentThread(); }
  int64_t BatchRows(int64_t samples) const override { return inner_->BatchRows(samples); }
  Status DeviceFailure() const override { return inner_->DeviceFailure(); }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    if (state_ == State::kWaiting && seen_ >= options_.skip_runs) Start();
    ++seen_;
    auto result = inner_->Run(inputs);
    if (state_ == State::kRecording && ++recorded_ >= options_.runs) Finish();
    return result;
  }

 private:
  enum class State { kWaiting, kRecording, kDone };

  void Start() {
    try {
      const std::set<ActivityType> activities{ActivityType::CPU};
      ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
      profiler::prepareProfiler(config, activities);
      profiler::enableProfiler(config, activities);
      state_ = State::kRecording;
    } catch (const std::exception& e) {
      spdlog::warn("profile {}: libtorch's profiler did not start: {}", name_, e.what());
      state_ = State::kDone;
    }
  }

  void Finish() {
    state_ = State::kDone;
    std::unique_ptr<profiler::ProfilerResult> result;
    try {
      result = profiler::disableProfiler();
    } catch (const std::exception& e) {
      spdlog::warn("profile {}: libtorch's profiler did not stop: {}", name_, e.what());
      return;
    }
    if (!result) return;
    std::error_code ec;
    std::filesystem::create_directories(options_.dir, ec);
    const auto trace = options_.dir / fmt::format("profile-{}.json", name_);
    const auto ops = options_.dir / fmt::format("profile-{}-ops.json", name_);
    try {
      result->save(trace.string());
    } catch (const std::exception& e) {
      spdlog::warn("profile {}: cannot write {}: {}", name_, trace.string(), e.what());
      return;
    }
    double window_us = 0;
    auto ranked = RankOperators(result->events(), &window_us);
    double self_sum = 0;
    for (const auto& [op, t] : ranked) self_sum += t.self_us;
    JsonWriter json;
    json.BeginObject()
        .Field("instance", name_)
        .Field("runs", recorded_)
        .Field("window_ms", window_us / 1e3)
        .Field("trace", trace.filename().string())
        .Key("operators")
        .BeginArray();
    for (size_t i = 0; i < ranked.size() && static_cast<int>(i) < options_.top_operators; ++i) {
      const auto& [op, t] = ranked[i];
      json.BeginObject()
          .Field("name", op)
          .Field("calls", t.calls)
          .Field("self_ms", t.self_us / 1e3)
          .Field("total_ms", t.total_us / 1e3)
          .Field("self_percent", self_sum > 0 ? 100 * t.self_us / self_sum : 0.0)
          .EndObject();
    }
    json.EndArray().EndObject();
    std::ofstream out(ops, std::ios::binary | std::ios::trunc);
    out << json.str() << "\n";
    out.close();
    if (!out) {
      spdlog::warn("profile {}: cannot write {}", name_, ops.string());
      return;
    }
    log_->Add(trace, ops);
  }

  std::unique_ptr<BackendInstance> inner_;
  const std::string name_;
  const ProfileOptions options_;
  std::shared_ptr<ProfileLog> log_;
  State state_ = State::kWaiting;
  int seen_ = 0;
  int recorded_ = 0;
};

class ProfiledBackend final : public Backend {
 public:
  ProfiledBackend(std::shared_ptr<Backend> inner, std::string model, ProfileOptions options,
                  std::shared_ptr<ProfileLog> log)
      : inner_(std::move(inner)),
        model_(std::move(model)),
        options_(std::move(options)),
        log_(std::move(log)) {}

  Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) override {
    auto instance = inner_->CreateInstance(index);
    if (!instance.ok()) return instance.status();
    return std::unique_ptr<BackendInstance>(std::make_unique<ProfiledInstance>(
        std::move(*instance), fmt::format("{}-{}", model_, index), options_, log_));
  }
  const LoadReport& load_report() const override { return inner_->load_report(); }
  std::vector<int> gpus() const override { return inner_->gpus(); }

 private:
  std::shared_ptr<Backend> inner_;
  const std::string model_;
  const ProfileOptions options_;
  std::shared_ptr<ProfileLog> log_;
};

}  // namespace

void ProfileLog::Add(std::filesystem::path trace, std::filesystem::path ops) {
  MutexLock lock(mu_);
  files_.push_back(std::move(trace));
  files_.push_back(std::move(ops));
}

std::vector<std::filesystem::path> ProfileLog::files() const {
  MutexLock lock(mu_);
  return files_;
}

std::shared_ptr<Backend> WithProfiler(std::shared_ptr<Backend> backend, std::string model,
                                      ProfileOptions options, std::shared_ptr<ProfileLog> log) {
  return std::make_shared<ProfiledBackend>(std::move(backend), std::move(model), std::move(options),
                                           std::move(log));
}

bool ProfilerRequestedByEnvironment() {
  const char* value = std::getenv("SLUICE_TORCH_PROFILER");
  if (value == nullptr) return false;
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

}  // namespace sluice
