// CPU and GPU utilisation sampled every 100 ms while a benchmark runs.
//
// CPU: machine-wide from /proc/stat, this process from /proc/self/stat, both as a percentage of
// all cores. GPU: NVML, loaded with dlopen so Sluice neither links nor needs it; absent -> "n/a".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "device/nvml.h"

namespace sluice {

// Aggregate jiffies of the "cpu" line of /proc/stat.
struct CpuTimes {
  uint64_t busy = 0;   // user + nice + system + irq + softirq + steal.
  uint64_t total = 0;  // busy + idle + iowait.
};
std::optional<CpuTimes> ParseProcStat(std::string_view proc_stat);
// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line, in clock ticks.
std::optional<uint64_t> ParseProcessCpuTicks(std::string_view pid_stat);

struct UtilizationSample {
  Clock::time_point time;
  double machine_cpu_percent = 0;  // 0..100, all cores.
  double process_cpu_percent = 0;  // 0..100, all cores.
  std::optional<GpuReading> gpu;
};

struct UtilizationAverages {
  int samples = 0;
  double machine_cpu_percent = 0;
  double process_cpu_percent = 0;
  std::optional<double> gpu_percent;
  std::optional<double> gpu_memory_mib;
};

// Thread-safe. Samples on its own thread between Start() and Stop().
class UtilizationSampler {
 public:
  explicit UtilizationSampler(Millis period = Millis(100));
  ~UtilizationSampler();

  void Start();
  void Stop();
  std::vector<UtilizationSample> samples() const;
  // Averages of the samples taken in [from, to].
  UtilizationAverages Average(Clock::time_point from, Clock::time_point to) const;

 private:
  void Loop();

  const Millis period_;
  mutable Mutex mu_;
  std::vector<UtilizationSample> samples_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  CondVar wake_;
  std::thread thread_;
};

// Averages of samples in [from, to] (exposed for tests).
UtilizationAverages AverageSamples(const std::vector<UtilizationSample>& samples,
                                   Clock::time_point from, Clock::time_point to);

}  // namespace sluice
