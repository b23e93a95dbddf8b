// Qwen2 and Qwen2.5: Llama with biases on the q, k and v projections.
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(RequireSilu(config));
  SLUICE_RETURN_IF_ERROR(RequireNoQwenWindows(config, "Qwen2"));
  arch->attention_bias = true;
  return Status::Ok();
}

Status FromGguf(const GgufFile&, const std::string&, ModelArchitecture* arch) {
  arch->attention_bias = true;
  return Status::Ok();
}

}  // namespace

const Family& Qwen2Family() {
  static const Family family = [] {
    Family f = LlamaFamily();
    f.name = "qwen2";
    f.model_types = {"qwen2"};
    f.gguf_rope_interleaved = false;
    f.gguf.q_bias = "blk.{}.attn_q.bias";
    f.gguf.k_bias = "blk.{}.attn_k.bias";
    f.gguf.v_bias = "blk.{}.attn_v.bias";
    f.hf.q_bias = "model.layers.{}.self_attn.q_proj.bias";
    f.hf.k_bias = "model.layers.{}.self_attn.k_proj.bias";
    f.hf.v_bias = "model.layers.{}.self_attn.v_proj.bias";
    f.from_config = FromConfig;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
