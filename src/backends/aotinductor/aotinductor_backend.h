// The AOTInductor backend: loads an AOTInductor package (models/<name>/model.pt2, or
// model_bf16.pt2 / model_int8.pt2 for those precisions) written by torch.export +
// torch._inductor.aoti_compile_and_package, and runs batches on CPU.
//
// The header is torch-free on purpose; only aotinductor_backend.cc includes torch headers.
#pragma once

#include <memory>

#include "config/model_config.h"
#include "sluice/backend.h"

namespace sluice {

// Loads the package with one runner per configured instance and warms it up at the configured
// batch sizes on the calling thread. The package is compiled for one precision and layout, so
// `precision` picks the file and optimize.freeze / channels_last do not apply (the export froze
// it).
Result<std::unique_ptr<Backend>> LoadAotInductorBackend(const ModelConfig& config);

}  // namespace sluice
