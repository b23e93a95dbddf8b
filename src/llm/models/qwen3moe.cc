// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, and on every layer a mixture of
// SwiGLU experts instead of the dense feed-forward: a router picks experts_used of them per token
// by softmax, their probabilities renormalised (as llama.cpp's qwen3moe graph does; config.json's
// norm_topk_prob says so for a Hugging Face folder).
#include "llm/files/gguf.h"
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(Qwen3FromConfig(config, arch));
  // Every layer sparse, as Qwen3-30B-A3B and Qwen3-235B-A22B (and llama.cpp's qwen3moe) are.
  auto step = config.Int("decoder_sparse_step", 1);
  if (!step.ok()) return step.status();
  if (*step != 1) return config.Bad("decoder_sparse_step", "is not 1: dense layers between");
  if (config.Has("mlp_only_layers")) {
    auto dense = config.Numbers("mlp_only_layers");
    if (!dense.ok()) return dense.status();
    if (!dense->empty()) return config.Bad("mlp_only_layers", "is not empty: dense layers");
  }
  // The hub's configs say num_experts; transformers 5 writes num_local_experts.
  const char* count = config.Has("num_experts") ? "num_experts" : "num_local_experts";
  return ReadConfigExperts(config, count, "moe_intermediate_size", "norm_topk_prob", arch);
}

Status FromGguf(const GgufFile& file, const std::string& prefix, ModelArchitecture* arch) {
  arch->qk_norm = true;
  // Older files lack the experts' own width: llama.cpp then takes feed_forward_length / used.
  auto used = file.Integer(prefix + "expert_used_count", 1);
  if (!used.ok()) return used.status();
  const int fallback = *used > 0 ? arch->intermediate_size / static_cast<int>(*used) : 0;
  return ReadGgufExperts(file, prefix, fallback, /*required=*/true, arch);
}

}  // namespace

const Family& Qwen3MoeFamily() {
  static const Family family = [] {
    Family f = Qwen3Family();
    f.name = "qwen3moe";
    f.model_types = {"qwen3_moe"};
    f.gguf.gate = f.gguf.up = f.gguf.down = "";  // The experts' (llama's names) instead.
    f.hf.gate = f.hf.up = f.hf.down = "";
    f.hf.router = "model.layers.{}.mlp.gate.weight";
    f.hf.expert_gate = "model.layers.{}.mlp.experts.{}.gate_proj.weight";
    f.hf.expert_up = "model.layers.{}.mlp.experts.{}.up_proj.weight";
    f.hf.expert_down = "model.layers.{}.mlp.experts.{}.down_proj.weight";
    f.from_config = FromConfig;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
