// Loads a model with the backend its config names (`backend`, resolved by NormalizeModelConfig).
// Torch-free header: the binary and the benchmarks call it without seeing libtorch.
#pragma once

#include <memory>
#include <string>

#include "config/model_config.h"
#include "sluice/backend.h"

namespace sluice {

Result<std::unique_ptr<Backend>> LoadBackend(const ModelConfig& config);

// "libtorch 2.11.0".
std::string TorchRuntimeVersion();

}  // namespace sluice
