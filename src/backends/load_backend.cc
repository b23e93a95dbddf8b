#include "backends/load_backend.h"

#include <fmt/format.h>
#include <torch/version.h>

#include "backends/aotinductor/aotinductor_backend.h"
#include "backends/cuda_loader.h"
#include "backends/torchscript/torchscript_backend.h"
#include "backends/vector_math.h"

namespace sluice {

Result<std::unique_ptr<Backend>> LoadBackend(const ModelConfig& config) {
  ResolveVectorMath();
  if (config.instances.on_gpu()) return LoadCudaBackend(config);
  if (config.backend == BackendKind::kAotInductor) return LoadAotInductorBackend(config);
  return LoadTorchScriptBackend(config);
}

std::string TorchRuntimeVersion() { return fmt::format("libtorch {}", TORCH_VERSION); }

}  // namespace sluice
