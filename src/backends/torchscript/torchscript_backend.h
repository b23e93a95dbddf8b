// The TorchScript backend: loads models/<name>/model.pt with libtorch and runs batches on CPU.
//
// The header is torch-free on purpose; only torchscript_backend.cc includes torch headers.
#pragma once

#include <memory>
#include <string>

#include "config/model_config.h"
#include "sluice/backend.h"

namespace sluice {

// Loads the model, applies the configured optimisation (freeze + optimize_for_inference,
// channels_last, bf16) and warms it up at the configured batch sizes on the calling thread.
// The returned backend's instances share the loaded weights; each applies its own thread budget.
Result<std::unique_ptr<Backend>> LoadTorchScriptBackend(const ModelConfig& config);

}  // namespace sluice
