// Qwen3: Llama with an RMSNorm of each query and key head before the rotation.
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {

Status Qwen3FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(RequireSilu(config));
  auto bias = config.Bool("attention_bias", false);
  if (!bias.ok()) return bias.status();
  if (*bias) return config.Bad("attention_bias", "is true: not supported for qwen3");
  SLUICE_RETURN_IF_ERROR(RequireNoQwenWindows(config, "Qwen3"));
  arch->qk_norm = true;
  return Status::Ok();
}

namespace {

Status FromGguf(const GgufFile&, const std::string&, ModelArchitecture* arch) {
  arch->qk_norm = true;
  return Status::Ok();
}

}  // namespace

const Family& Qwen3Family() {
  static const Family family = [] {
    Family f = LlamaFamily();
    f.name = "qwen3";
    f.model_types = {"qwen3"};
    f.gguf_rope_interleaved = false;
    f.gguf.q_norm = "blk.{}.attn_q_norm.weight";
    f.gguf.k_norm = "blk.{}.attn_k_norm.weight";
    f.hf.q_norm = "model.layers.{}.self_attn.q_norm.weight";
    f.hf.k_norm = "model.layers.{}.self_attn.k_norm.weight";
    f.from_config = Qwen3FromConfig;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
