// Loads the GPU backend from Sluice's CUDA library (libsluice_cuda.so) with dlopen, the first
// time a model asks for a GPU. Torch-free and CUDA-free: the binary links neither libtorch_cuda
// nor the CUDA runtime, so a CPU server never loads them.
#pragma once

#include <filesystem>
#include <memory>

#include "config/model_config.h"
#include "llm/llama/step_graphs.h"
#include "sluice/backend.h"

namespace sluice {

// Where the library is looked for: $SLUICE_CUDA_LIBRARY when set, else libsluice_cuda.so beside
// the running binary.
std::filesystem::path CudaLibraryPath();

// Thread-safe. Loads the library once (a failure is kept and reported for every GPU model, naming
// the config key that asked for a GPU), then the model on its GPUs.
Result<std::unique_ptr<Backend>> LoadCudaBackend(const ModelConfig& config);

// Loads the library (once) for its runtime alone: libtorch_cuda's kernels registered with ATen,
// for code that runs ATen on CUDA tensors (the language models' device executor). The error says
// why it could not be loaded.
Status LoadCudaRuntime();

// CUDA graphs for a language model's decode steps on GPU `device` (llm/llama/step_graphs.h),
// from the library (loaded once, as above); the error says why there are none.
Result<std::shared_ptr<llm::llama::StepGraphs>> LoadCudaStepGraphs(int device);

}  // namespace sluice
