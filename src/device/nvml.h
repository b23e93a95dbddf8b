// NVML, the NVIDIA driver's management library, loaded with dlopen: Sluice neither links nor needs
// it, and where it is absent (no driver) every reading is "n/a".
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace sluice {

// Over all visible GPUs.
struct GpuReading {
  double utilization_percent = 0;  // Averaged over the visible GPUs.
  double memory_used_mib = 0;      // Summed over the visible GPUs.
};

// One GPU.
struct GpuDeviceReading {
  double utilization_percent = 0;  // Of the last sample period NVML keeps (1/6 s to 1 s).
  double memory_used_bytes = 0;
  double memory_total_bytes = 0;
};

// Thread-compatible.
class NvmlProbe {
 public:
  NvmlProbe();
  ~NvmlProbe();
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  bool available() const { return device_count_ > 0; }
  unsigned device_count() const { return device_count_; }
  std::optional<GpuReading> Read();
  // GPU `index` in NVML's order (the CUDA runtime's with CUDA_DEVICE_ORDER=PCI_BUS_ID; the same
  // on one-GPU machines).
  std::optional<GpuDeviceReading> ReadDevice(unsigned index);
  // The GPU at `pci_bus_id` ("domain:bus:device.function", as CUDA writes it).
  std::optional<GpuDeviceReading> ReadDeviceByPciBusId(const std::string& pci_bus_id);

 private:
  struct Api;
  std::optional<GpuDeviceReading> ReadHandle(void* device);

  std::unique_ptr<Api> api_;
  void* library_ = nullptr;
  unsigned device_count_ = 0;
};

}  // namespace sluice
