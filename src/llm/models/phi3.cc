// Phi-3, Phi-3.5-mini and Phi-4-mini's shape: Llama with the q, k, v projections fused into one
// (qkv_proj) and gate and up fused (gate_up_proj; llama.cpp's ffn_up holds both), LongRoPE for its
// long-context versions (read with the other RoPE scalings), and from config.json a sliding window
// on every layer where it is shorter than the context (as transformers applies it).
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(RequireSilu(config));
  double partial = 1.0;
  for (const JsonConfig& where : {config, config.Object("rope_parameters").value_or(config)}) {
    auto value = where.Number("partial_rotary_factor", partial);
    if (!value.ok()) return value.status();
    partial = *value;
  }
  if (partial != 1.0) {
    return config.Bad("partial_rotary_factor",
                      "is not 1: partial rotary embeddings (Phi-4-mini) are not supported");
  }
  auto window = config.Int("sliding_window", 0);
  if (!window.ok()) return window.status();
  SetSlidingWindowEverywhere(*window, arch);
  return Status::Ok();
}

}  // namespace

const Family& Phi3Family() {
  static const Family family = [] {
    Family f = LlamaFamily();
    f.name = "phi3";
    f.model_types = {"phi3"};
    f.gguf_rope_interleaved = false;
    f.gguf.q = f.gguf.k = f.gguf.v = "";
    f.gguf.qkv = "blk.{}.attn_qkv.weight";
    f.gguf.gate = "";
    f.gguf.up = "";
    f.gguf.gate_up = "blk.{}.ffn_up.weight";
    f.hf.q = f.hf.k = f.hf.v = "";
    f.hf.qkv = "model.layers.{}.self_attn.qkv_proj.weight";
    f.hf.gate = f.hf.up = "";
    f.hf.gate_up = "model.layers.{}.mlp.gate_up_proj.weight";
    // From GGUF, no window: llama.cpp leaves Phi-3's disabled (its sliding_window keys are not
    // trusted), and GGUF files are served as llama.cpp serves them.
    f.from_config = FromConfig;
    f.from_gguf = nullptr;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
