// LoRA adapters, in PEFT's layout (adapter_config.json + adapter_model.safetensors) or as
// llama.cpp's LoRA GGUF file: low-rank updates W + scale x B A of a base model's projections,
// applied beside the base products for the rows of the requests that name the adapter
// (llama/llama_model.cc groups a step's rows by adapter and runs each group's two small products,
// as Punica and S-LoRA batch them). Either layout serves either kind of base model (Hugging
// Face's or GGUF): q's and k's rows are reordered to the base's rotary layout. No torch here: the
// weights are float arrays the model wraps without copying.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/llm_config.h"
#include "sluice/status.h"

namespace sluice::llm {

// The projections an adapter may target, in PEFT's names: q_proj ... down_proj.
enum class LoraModule { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraModules = 7;
std::string_view LoraModuleName(LoraModule module);

// The products an adapter adds to a layer, fused as the base fuses its projections: q, k and v
// as one (the targeted modules' A stacked, B block-diagonal over the base's q | k | v columns),
// o, gate and up as one (gate | up columns), down. Two products per fused group and adapter,
// whichever modules it targets.
enum class LoraProduct { kQkv, kO, kGateUp, kDown };
inline constexpr int kLoraProducts = 4;

// A fused product: A is rank x in, B out x rank (row-major), the adapter's scale folded into B.
struct LoraWeights {
  int rank = 0;  // 0: no targeted module in this group.
  std::vector<float> a, b;
  bool empty() const { return rank == 0; }
};

// Immutable once loaded; shared by the requests that use it (thread-safe to read).
struct LoraAdapter {
  std::string name;
  std::string dir;  // Where it was loaded from: a folder or a GGUF file.
  uint64_t id = 0;  // Unique in the process: the prefix cache keeps its blocks apart.
  int rank = 0;
  float scale = 1;  // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
  std::vector<std::array<LoraWeights, kLoraProducts>> layers;  // One entry per decoder layer.
};

// Loads the adapter at `path` (a folder with PEFT's files or one GGUF file, or the GGUF file) for
// a base model of `architecture`. kInvalidArgument naming the file and the setting for what is
// not served: another PEFT method or adapter type, DoRA, biases, per-module ranks, embedding or
// lm_head targets, a rank above `max_rank`, shapes that do not fit the base, a GGUF adapter of
// another architecture.
Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& name,
                                                           const std::string& path,
                                                           const ModelArchitecture& architecture,
                                                           int max_rank);

}  // namespace sluice::llm
