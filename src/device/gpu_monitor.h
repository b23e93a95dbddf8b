// GpuMonitor: the GPUs' utilisation and memory, sampled every 100 ms on a thread of its own once a
// model on a GPU asks for it, for the model's stats and /metrics. A CPU server never starts it
// (nor loads NVML).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "device/nvml.h"

namespace sluice {

// Reads one GPU, by its CUDA ordinal and its PCI bus id ("" where not known); nullopt when it
// cannot be read (no NVML, no such GPU).
using GpuReader =
    std::function<std::optional<GpuDeviceReading>(int gpu, const std::string& pci_bus_id)>;

// Thread-safe.
class GpuMonitor {
 public:
  // The process's monitor, reading NVML.
  static GpuMonitor& Global();

  explicit GpuMonitor(GpuReader reader,
                      std::chrono::milliseconds period = std::chrono::milliseconds(100));
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // Adds `gpus` to those sampled; the first call starts the sampling thread.
  void Watch(const std::vector<int>& gpus);
  // CUDA ordinal `gpu` is the GPU at `pci_bus_id` (what CUDA says, e.g. "0000:3B:00.0"). NVML
  // counts GPUs in its own order, whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER make of
  // CUDA's: the process's monitor reads a GPU by its bus id where it knows it.
  void Identify(int gpu, std::string pci_bus_id);
  // The latest reading of `gpu`; nullopt before its first sample or when it cannot be read.
  std::optional<GpuDeviceReading> Latest(int gpu) const;

 private:
  void Loop();

  const GpuReader reader_;
  const std::chrono::milliseconds period_;
  mutable Mutex mu_;
  CondVar wake_;
  std::set<int> watched_ GUARDED_BY(mu_);
  std::map<int, GpuDeviceReading> latest_ GUARDED_BY(mu_);
  std::map<int, std::string> pci_bus_ids_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool started_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sluice
