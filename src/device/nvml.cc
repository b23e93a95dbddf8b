#include "device/nvml.h"

#include <dlfcn.h>

#include <type_traits>

namespace sluice {

// The few NVML entry points used, declared here so no NVML header is needed.
struct NvmlProbe::Api {
  struct Utilization {
    unsigned gpu;
    unsigned memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  using Device = void*;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, Device*) = nullptr;
  int (*handle_by_bus)(const char*, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
};

NvmlProbe::NvmlProbe() : api_(std::make_unique<Api>()) {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return;
  auto load = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library_, name));
    return fn != nullptr;
  };
  bool ok = load(api_->init, "nvmlInit_v2") && load(api_->shutdown, "nvmlShutdown") &&
            load(api_->count, "nvmlDeviceGetCount_v2") &&
            load(api_->handle, "nvmlDeviceGetHandleByIndex_v2") &&
            load(api_->handle_by_bus, "nvmlDeviceGetHandleByPciBusId_v2") &&
            load(api_->utilization, "nvmlDeviceGetUtilizationRates") &&
            load(api_->memory, "nvmlDeviceGetMemoryInfo");
  if (!ok || api_->init() != 0) {
    dlclose(library_);
    library_ = nullptr;
    return;
  }
  if (api_->count(&device_count_) != 0) device_count_ = 0;
}

NvmlProbe::~NvmlProbe() {
  if (library_ != nullptr) {
    api_->shutdown();
    dlclose(library_);
  }
}

std::optional<GpuDeviceReading> NvmlProbe::ReadDevice(unsigned index) {
  if (index >= device_count_) return std::nullopt;
  Api::Device device = nullptr;
  if (api_->handle(index, &device) != 0) return std::nullopt;
  return ReadHandle(device);
}

std::optional<GpuDeviceReading> NvmlProbe::ReadDeviceByPciBusId(const std::string& pci_bus_id) {
  if (!available()) return std::nullopt;
  Api::Device device = nullptr;
  if (api_->handle_by_bus(pci_bus_id.c_str(), &device) != 0) return std::nullopt;
  return ReadHandle(device);
}

std::optional<GpuDeviceReading> NvmlProbe::ReadHandle(void* device) {
  Api::Utilization util{};
  Api::Memory memory{};
  if (api_->utilization(device, &util) != 0 || api_->memory(device, &memory) != 0) {
    return std::nullopt;
  }
  return GpuDeviceReading{static_cast<double>(util.gpu), static_cast<double>(memory.used),
                          static_cast<double>(memory.total)};
}

std::optional<GpuReading> NvmlProbe::Read() {
  if (!available()) return std::nullopt;
  GpuReading reading;
  for (unsigned i = 0; i < device_count_; ++i) {
    Api::Device device = nullptr;
    Api::Utilization util{};
    Api::Memory memory{};
    if (api_->handle(i, &device) != 0 || api_->utilization(device, &util) != 0 ||
        api_->memory(device, &memory) != 0) {
      return std::nullopt;
    }
    reading.utilization_percent += util.gpu;
    reading.memory_used_mib += static_cast<double>(memory.used) / (1024.0 * 1024.0);
  }
  reading.utilization_percent /= device_count_;
  return reading;
}

}  // namespace sluice
