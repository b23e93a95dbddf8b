// Llama 2/3, SmolLM, TinyLlama, and Mistral 7B (which llama.cpp's converter stores as llama):
// the family the others vary. Mistral's sliding window covers every layer. Mixtral's GGUF files
// are llama files with experts (expert_count; feed_forward_length their width); its Hugging Face
// folders (model_type mixtral) name them block_sparse_moe.
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(RequireSilu(config));
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    auto bias = config.Bool(key, false);
    if (!bias.ok()) return bias.status();
    if (*bias) return config.Bad(key, "is true: biases are not supported for llama");
  }
  auto window = config.Int("sliding_window", 0);  // Mistral's; null or absent: none.
  if (!window.ok()) return window.status();
  SetSlidingWindowEverywhere(*window, arch);
  if (config.Has("num_local_experts")) {  // Mixtral's.
    return ReadConfigExperts(config, "num_local_experts", "intermediate_size", nullptr, arch);
  }
  return Status::Ok();
}

Status FromGguf(const GgufFile& file, const std::string& prefix, ModelArchitecture* arch) {
  return ReadGgufExperts(file, prefix, arch->intermediate_size, /*required=*/false, arch);
}

}  // namespace

const Family& LlamaFamily() {
  static const Family family = {
      .name = "llama",
      .model_types = {"llama", "mistral", "mixtral"},
      .gguf = {.embedding = "token_embd.weight",
               .final_norm = "output_norm.weight",
               .output = "output.weight",
               .attn_norm = "blk.{}.attn_norm.weight",
               .ffn_norm = "blk.{}.ffn_norm.weight",
               .q = "blk.{}.attn_q.weight",
               .k = "blk.{}.attn_k.weight",
               .v = "blk.{}.attn_v.weight",
               .o = "blk.{}.attn_output.weight",
               .gate = "blk.{}.ffn_gate.weight",
               .up = "blk.{}.ffn_up.weight",
               .down = "blk.{}.ffn_down.weight",
               .router = "blk.{}.ffn_gate_inp.weight",
               .expert_gate = "blk.{}.ffn_gate_exps.weight",
               .expert_up = "blk.{}.ffn_up_exps.weight",
               .expert_down = "blk.{}.ffn_down_exps.weight"},
      .hf = {.embedding = "model.embed_tokens.weight",
             .final_norm = "model.norm.weight",
             .output = "lm_head.weight",
             .attn_norm = "model.layers.{}.input_layernorm.weight",
             .ffn_norm = "model.layers.{}.post_attention_layernorm.weight",
             .q = "model.layers.{}.self_attn.q_proj.weight",
             .k = "model.layers.{}.self_attn.k_proj.weight",
             .v = "model.layers.{}.self_attn.v_proj.weight",
             .o = "model.layers.{}.self_attn.o_proj.weight",
             .gate = "model.layers.{}.mlp.gate_proj.weight",
             .up = "model.layers.{}.mlp.up_proj.weight",
             .down = "model.layers.{}.mlp.down_proj.weight",
             .router = "model.layers.{}.block_sparse_moe.gate.weight",
             .expert_gate = "model.layers.{}.block_sparse_moe.experts.{}.w1.weight",
             .expert_up = "model.layers.{}.block_sparse_moe.experts.{}.w3.weight",
             .expert_down = "model.layers.{}.block_sparse_moe.experts.{}.w2.weight"},
      .gguf_rope_interleaved = true,
      .from_config = FromConfig,
      .from_gguf = FromGguf,
  };
  return family;
}

}  // namespace sluice::llm
