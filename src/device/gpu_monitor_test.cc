#include "device/gpu_monitor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>

namespace sluice {
namespace {

using namespace std::chrono_literals;

// Polls `monitor` for a reading of `gpu` for up to 5 s.
std::optional<GpuDeviceReading> WaitForReading(const GpuMonitor& monitor, int gpu) {
  for (int i = 0; i < 500; ++i) {
    if (auto r = monitor.Latest(gpu)) return r;
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

TEST(GpuMonitorTest, SamplesOnlyTheWatchedGpusAndStartsOnFirstWatch) {
  std::atomic<int> reads{0};
  std::atomic<double> util{40};
  GpuMonitor monitor(
      [&](int gpu, const std::string&) -> std::optional<GpuDeviceReading> {
        ++reads;
        if (gpu == 7) return std::nullopt;  // A GPU NVML cannot read.
        return GpuDeviceReading{util.load() + gpu, 1e9 * (gpu + 1), 80e9};
      },
      5ms);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(reads.load(), 0) << "sampled before any model asked";
  EXPECT_FALSE(monitor.Latest(0).has_value());
  monitor.Watch({0, 7});
  auto r = WaitForReading(monitor, 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->utilization_percent, 40);
  EXPECT_EQ(r->memory_used_bytes, 1e9);
  EXPECT_EQ(r->memory_total_bytes, 80e9);
  EXPECT_FALSE(monitor.Latest(7).has_value());
  EXPECT_FALSE(monitor.Latest(1).has_value()) << "GPU 1 was never watched";
  // Later readings replace earlier ones.
  util = 90;
  bool updated = false;
  for (int i = 0; i < 500 && !updated; ++i) {
    updated = monitor.Latest(0)->utilization_percent == 90;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(updated);
  monitor.Watch({1});
  auto r1 = WaitForReading(monitor, 1);
  ASSERT_TRUE(r1.has_value());
  EXPECT_EQ(r1->memory_used_bytes, 2e9);
}

// CUDA_VISIBLE_DEVICES=2,0 on a machine whose NVML counts 0, 1, 2: CUDA's ordinal 0 is NVML's
// GPU 2. The reader is given the bus id CUDA named, never the ordinal alone, once it is known.
TEST(GpuMonitorTest, ReadsAGpuByThePciBusIdCudaGaveIt) {
  const std::map<std::string, double> used_by_bus{
      {"0000:17:00.0", 1e9}, {"0000:65:00.0", 2e9}, {"0000:CA:00.0", 3e9}};
  GpuMonitor monitor(
      [&](int gpu, const std::string& bus) -> std::optional<GpuDeviceReading> {
        if (bus.empty()) return GpuDeviceReading{0, 1e9 * (gpu + 1), 0};  // NVML's index.
        auto it = used_by_bus.find(bus);
        if (it == used_by_bus.end()) return std::nullopt;
        return GpuDeviceReading{0, it->second, 0};
      },
      5ms);
  monitor.Identify(0, "0000:CA:00.0");
  monitor.Identify(1, "0000:17:00.0");
  monitor.Watch({0, 1});
  auto r0 = WaitForReading(monitor, 0);
  auto r1 = WaitForReading(monitor, 1);
  ASSERT_TRUE(r0.has_value() && r1.has_value());
  EXPECT_EQ(r0->memory_used_bytes, 3e9) << "ordinal 0 read as NVML's GPU 0, not its bus id's";
  EXPECT_EQ(r1->memory_used_bytes, 1e9);
}

TEST(GpuMonitorTest, NvmlWithoutAGpuReadsNothingAndDoesNotFail) {
  NvmlProbe probe;  // No GPU on CI machines.
  if (probe.available()) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_FALSE(probe.ReadDevice(0).has_value());
  EXPECT_FALSE(probe.ReadDeviceByPciBusId("0000:17:00.0").has_value());
  EXPECT_FALSE(probe.Read().has_value());
}

}  // namespace
}  // namespace sluice
