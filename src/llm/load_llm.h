// Loads a language-model directory (config.json, model.safetensors, tokenizer files, optional
// config.yaml with `llm:` settings) into a running LlmEngine. Declared without torch; defined in
// the torch-linked part of llm/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "llm/llama/step_graphs.h"
#include "llm/llm_engine.h"

namespace sluice::llm {

struct LlmLoadOverrides {
  std::string precision;            // "fp32" | "bf16" | "int8" | "int4"; empty: config.yaml's.
  int slots = 0;                    // 0: config.yaml's.
  int64_t kv_cache_bytes = -1;      // -1: config.yaml's; 0: slots x context.
  int threads = -1;                 // -1: config.yaml's.
  int max_step_tokens = 0;          // 0: config.yaml's.
  int speculative_tokens = -1;      // -1: config.yaml's; 0: off.
  std::string prefix_caching;       // "on" | "off"; empty: config.yaml's.
  std::string kv_cache_dtype;       // "auto" | "fp32" | "bf16" | "q8_0"; empty: config.yaml's.
  int context_length = 0;           // 0: config.yaml's.
  std::string weights_cache;        // A folder; empty: config.yaml's.
  std::string kv_cache_disk;        // A folder; empty: config.yaml's.
  int64_t kv_cache_disk_bytes = 0;  // 0: config.yaml's.
  std::string device;               // "cpu" | "cuda" | "cuda:N"; empty: config.yaml's.
};

Result<std::shared_ptr<LlmEngine>> LoadLlmEngine(const std::string& dir,
                                                 const LlmLoadOverrides& overrides = {});
// The decoder alone, configured as LoadLlmEngine configures it (no tokenizer, no loop).
Result<std::unique_ptr<StepModel>> LoadStepModel(const std::string& dir,
                                                 const LlmLoadOverrides& overrides = {});

// What loading a language-model directory would take, estimated before loading it: its weight
// files (a GGUF file, kept quantised; a checkpoint's safetensors, whatever precision they load
// at) and its KV cache in full use (its pages are committed as blocks are first used, so a
// model's use grows to this under traffic).
struct LlmMemoryEstimate {
  int64_t weights = 0;
  int64_t kv_cache = 0;
  int64_t total() const { return weights + kv_cache; }
};
Result<LlmMemoryEstimate> EstimateLlmMemory(const std::string& dir,
                                            const LlmLoadOverrides& overrides = {});

// Makes a device's kernels known to ATen before a language model loads on it ("cuda:N": the
// server loads its CUDA library, which links libtorch_cuda). Set once, by the binary; unset, a
// model configured for a GPU is refused with the key that asked for it.
using DeviceRuntimeLoader = std::function<Status(const std::string& device)>;
void SetDeviceRuntimeLoader(DeviceRuntimeLoader loader);

// Makes the graphs a language model's decode steps replay on a GPU ("cuda:N": CUDA graphs from
// the server's CUDA library; llama/step_graphs.h). Set once, by the binary; unset, or where it
// fails (the error is kept in the model's kernel paths), a model on a GPU launches each step's
// operations one by one.
using DeviceGraphsMaker =
    std::function<Result<std::shared_ptr<llama::StepGraphs>>(const std::string& device)>;
void SetDeviceGraphsMaker(DeviceGraphsMaker maker);

// How `sluice serve` loads language models, and sizes them before loading (injected, so the
// server builds without torch).
using LlmLoader = std::function<Result<std::shared_ptr<LlmEngine>>(const std::string& dir)>;
using LlmSizer = std::function<Result<LlmMemoryEstimate>(const std::string& dir)>;

}  // namespace sluice::llm
