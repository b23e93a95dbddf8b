#include "device/gpu_monitor.h"

#include <memory>

namespace sluice {

GpuMonitor& GpuMonitor::Global() {
  // Leaked on purpose: readers may ask at exit, after static destructors would have run.
  static GpuMonitor* monitor = [] {
    auto nvml = std::make_shared<NvmlProbe>();
    return new GpuMonitor(
        [nvml](int gpu, const std::string& pci_bus_id) -> std::optional<GpuDeviceReading> {
          if (!pci_bus_id.empty()) return nvml->ReadDeviceByPciBusId(pci_bus_id);
          if (gpu < 0) return std::nullopt;
          return nvml->ReadDevice(static_cast<unsigned>(gpu));
        });
  }();
  return *monitor;
}

GpuMonitor::GpuMonitor(GpuReader reader, std::chrono::milliseconds period)
    : reader_(std::move(reader)), period_(period) {}

GpuMonitor::~GpuMonitor() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void GpuMonitor::Watch(const std::vector<int>& gpus) {
  MutexLock lock(mu_);
  watched_.insert(gpus.begin(), gpus.end());
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { Loop(); });
  }
}

void GpuMonitor::Identify(int gpu, std::string pci_bus_id) {
  MutexLock lock(mu_);
  pci_bus_ids_[gpu] = std::move(pci_bus_id);
}

std::optional<GpuDeviceReading> GpuMonitor::Latest(int gpu) const {
  MutexLock lock(mu_);
  auto it = latest_.find(gpu);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

void GpuMonitor::Loop() {
  MutexLock lock(mu_);
  while (!stop_) {
    std::set<int> gpus = watched_;
    std::map<int, std::string> bus_ids = pci_bus_ids_;
    lock.Unlock();
    std::map<int, GpuDeviceReading> readings;
    for (int gpu : gpus) {
      if (auto r = reader_(gpu, bus_ids[gpu])) readings[gpu] = *r;
    }
    lock.Lock();
    for (int gpu : gpus) {
      auto r = readings.find(gpu);
      if (r == readings.end()) {
        latest_.erase(gpu);
      } else {
        latest_[gpu] = r->second;
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + period_;
    while (!stop_ && std::chrono::steady_clock::now() < deadline) wake_.WaitUntil(lock, deadline);
  }
}

}  // namespace sluice
