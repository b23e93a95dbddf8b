// Utilisation sampling from /proc and NVML.
#include "bench/utilization.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "common/system_info.h"

namespace sluice {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Splits on spaces.
std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::optional<uint64_t> ToU64(std::string_view s) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<CpuTimes> ParseProcStat(std::string_view proc_stat) {
  std::string_view line = proc_stat.substr(0, proc_stat.find('\n'));
  std::vector<std::string_view> f = Fields(line);
  // cpu user nice system idle iowait irq softirq steal [guest guest_nice]
  if (f.size() < 9 || f[0] != "cpu") return std::nullopt;
  uint64_t v[8];
  for (int i = 0; i < 8; ++i) {
    auto parsed = ToU64(f[i + 1]);
    if (!parsed) return std::nullopt;
    v[i] = *parsed;
  }
  CpuTimes t;
  t.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  t.total = t.busy + v[3] + v[4];
  return t;
}

std::optional<uint64_t> ParseProcessCpuTicks(std::string_view pid_stat) {
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  size_t close = pid_stat.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::vector<std::string_view> f = Fields(pid_stat.substr(close + 1));
  // f[0] is field 3 (state); utime is field 14 -> f[11], stime field 15 -> f[12].
  if (f.size() < 13) return std::nullopt;
  auto utime = ToU64(f[11]);
  auto stime = ToU64(f[12]);
  if (!utime || !stime) return std::nullopt;
  return *utime + *stime;
}

UtilizationSampler::UtilizationSampler(Millis period) : period_(period) {}

UtilizationSampler::~UtilizationSampler() { Stop(); }

void UtilizationSampler::Start() {
  {
    MutexLock lock(mu_);
    stop_ = false;
    samples_.clear();
  }
  thread_ = std::thread([this] { Loop(); });
}

void UtilizationSampler::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

std::vector<UtilizationSample> UtilizationSampler::samples() const {
  MutexLock lock(mu_);
  return samples_;
}

UtilizationAverages UtilizationSampler::Average(Clock::time_point from,
                                                Clock::time_point to) const {
  return AverageSamples(samples(), from, to);
}

void UtilizationSampler::Loop() {
  NvmlProbe nvml;
  const double cores = CoreCount();
  const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  auto previous_machine = ParseProcStat(ReadFile("/proc/stat"));
  auto previous_process = ParseProcessCpuTicks(ReadFile("/proc/self/stat"));
  auto previous_time = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  while (true) {
    const auto wake_at = std::chrono::steady_clock::now() + period_;
    while (!stop_ && std::chrono::steady_clock::now() < wake_at) wake_.WaitUntil(lock, wake_at);
    if (stop_) break;
    lock.Unlock();
    auto now = std::chrono::steady_clock::now();
    auto machine = ParseProcStat(ReadFile("/proc/stat"));
    auto process = ParseProcessCpuTicks(ReadFile("/proc/self/stat"));
    UtilizationSample sample;
    sample.time = now;
    if (machine && previous_machine && machine->total > previous_machine->total) {
      sample.machine_cpu_percent = 100.0 *
                                   static_cast<double>(machine->busy - previous_machine->busy) /
                                   static_cast<double>(machine->total - previous_machine->total);
    }
    double elapsed = SecondsBetween(previous_time, now);
    if (process && previous_process && elapsed > 0) {
      double busy_seconds = static_cast<double>(*process - *previous_process) / ticks_per_second;
      sample.process_cpu_percent = 100.0 * busy_seconds / (elapsed * cores);
    }
    sample.gpu = nvml.Read();
    previous_machine = machine;
    previous_process = process;
    previous_time = now;
    lock.Lock();
    samples_.push_back(sample);
  }
}

UtilizationAverages AverageSamples(const std::vector<UtilizationSample>& samples,
                                   Clock::time_point from, Clock::time_point to) {
  UtilizationAverages avg;
  double gpu = 0, gpu_memory = 0;
  int gpu_samples = 0;
  for (const UtilizationSample& s : samples) {
    if (s.time < from || s.time > to) continue;
    ++avg.samples;
    avg.machine_cpu_percent += s.machine_cpu_percent;
    avg.process_cpu_percent += s.process_cpu_percent;
    if (s.gpu) {
      ++gpu_samples;
      gpu += s.gpu->utilization_percent;
      gpu_memory += s.gpu->memory_used_mib;
    }
  }
  if (avg.samples > 0) {
    avg.machine_cpu_percent /= avg.samples;
    avg.process_cpu_percent /= avg.samples;
  }
  if (gpu_samples > 0) {
    avg.gpu_percent = gpu / gpu_samples;
    avg.gpu_memory_mib = gpu_memory / gpu_samples;
  }
  return avg;
}

}  // namespace sluice
