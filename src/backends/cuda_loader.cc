#include "backends/cuda_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>

#include "device/gpu_monitor.h"

namespace sluice {
namespace {

using LoadFn = Backend* (*)(const ModelConfig*, Status*);
using PciBusIdFn = int (*)(int ordinal, char* out, int size);
using StepGraphsFn = llm::llama::StepGraphs* (*)(int device);

struct CudaLibrary {
  LoadFn load = nullptr;
  PciBusIdFn pci_bus_id = nullptr;
  StepGraphsFn step_graphs = nullptr;
  std::string error;  // Why it could not be loaded; empty when `load` is set.
};

const CudaLibrary& Library() {
  static const CudaLibrary library = [] {
    CudaLibrary lib;
    const std::string path = CudaLibraryPath().string();
    // RTLD_LOCAL: libtorch_cuda's symbols stay out of the global namespace; the library finds
    // Sluice's own (Status, ModelConfig) in the binary, which exports them.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      lib.error = fmt::format("cannot load Sluice's CUDA library {}: {}", path,
                              why ? why : "unknown error");
      return lib;
    }
    lib.load = reinterpret_cast<LoadFn>(dlsym(handle, "SluiceCudaLoadBackend"));
    if (!lib.load) lib.error = fmt::format("{} has no SluiceCudaLoadBackend", path);
    lib.pci_bus_id = reinterpret_cast<PciBusIdFn>(dlsym(handle, "SluiceCudaPciBusId"));
    lib.step_graphs = reinterpret_cast<StepGraphsFn>(dlsym(handle, "SluiceCudaStepGraphs"));
    return lib;  // The handle stays open for the process's life.
  }();
  return library;
}

}  // namespace

std::filesystem::path CudaLibraryPath() {
  if (const char* env = std::getenv("SLUICE_CUDA_LIBRARY"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libsluice_cuda.so";
  return self.parent_path() / "libsluice_cuda.so";
}

Status LoadCudaRuntime() {
  const CudaLibrary& lib = Library();
  return lib.load ? Status::Ok() : Status::InvalidArgument(lib.error);
}

Result<std::shared_ptr<llm::llama::StepGraphs>> LoadCudaStepGraphs(int device) {
  const CudaLibrary& lib = Library();
  if (!lib.load) return Status::InvalidArgument(lib.error);
  if (!lib.step_graphs) {
    return Status::InvalidArgument(
        fmt::format("{} has no SluiceCudaStepGraphs", CudaLibraryPath().string()));
  }
  return std::shared_ptr<llm::llama::StepGraphs>(lib.step_graphs(device));
}

Result<std::unique_ptr<Backend>> LoadCudaBackend(const ModelConfig& config) {
  const CudaLibrary& lib = Library();
  if (!lib.load) {
    return Status::InvalidArgument(fmt::format("model '{}': {}: asks for a GPU, and {}",
                                               config.name, config.instances.gpu_source_key,
                                               lib.error));
  }
  Status status;
  Backend* backend = lib.load(&config, &status);
  if (!backend) return status;
  // The GPU monitor reads each GPU the model runs on by its bus id (NVML's order is not CUDA's).
  for (int gpu : backend->gpus()) {
    char bus[64] = {};
    if (lib.pci_bus_id && lib.pci_bus_id(gpu, bus, sizeof(bus)) == 0) {
      GpuMonitor::Global().Identify(gpu, bus);
    }
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace sluice
