// gpt-oss (gpt-oss-20b, gpt-oss-120b): a mixture of experts on every layer, with biases on the
// q/k/v and output projections, on the router and on every expert's projections; attention sinks
// (a learned logit a query head in each softmax's denominator); sliding windows of 128 tokens on
// the even layers, the odd ones global, both with the same YaRN rotation; a router that takes the
// top experts_used logits and their softmax (the renormalised top-k of the full softmax: the same
// weights); and a clamped SwiGLU (alpha 1.702, limit 7). llama.cpp's converter writes none of
// the last two nor the layer pattern into the file: its graph has them as constants, as here.
#include <fmt/format.h>

#include "llm/files/gguf.h"
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

void SetGptOssBlock(ModelArchitecture* arch) {
  arch->attention_sinks = true;
  arch->expert_biases = true;
  arch->activation = GateActivation::kSwigluClamped;
  arch->expert_weights_norm = true;
}

// Every layer of an even index windowed (gpt-oss's layer_types, and llama.cpp's pattern of 2).
void AlternateWindows(int window, ModelArchitecture* arch) {
  arch->sliding_window = window;
  arch->local_layers.assign(static_cast<size_t>(arch->layers), false);
  for (int l = 0; l < arch->layers; l += 2) arch->local_layers[static_cast<size_t>(l)] = true;
  arch->rope_theta_local = 0;  // The global rotation, YaRN's included.
}

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  SLUICE_RETURN_IF_ERROR(RequireSilu(config));
  // The released checkpoints keep their experts as MXFP4 blocks (weights.cc reads them as MXFP4
  // parts, the GGUF files' type); the rest is BF16.
  if (auto quantization = config.Object("quantization_config")) {
    auto method = quantization->String("quant_method", "");
    if (!method.ok()) return method.status();
    if (*method != "mxfp4") {
      return config.Bad("quantization_config",
                        fmt::format("is '{}': Sluice reads gpt-oss folders of MXFP4 experts (the "
                                    "released checkpoints') or BF16/F16/F32 weights",
                                    *method));
    }
  }
  SetGptOssBlock(arch);
  auto bias = config.Bool("attention_bias", true);
  if (!bias.ok()) return bias.status();
  arch->attention_bias = arch->attention_out_bias = *bias;
  auto alpha = config.Number("swiglu_alpha", 1.702);
  auto limit = config.Number("swiglu_limit", 7.0);
  if (!alpha.ok()) return alpha.status();
  if (!limit.ok()) return limit.status();
  if (!(*limit > 0)) return config.Bad("swiglu_limit", "must be positive");
  arch->swiglu_alpha = *alpha;
  arch->swiglu_limit = *limit;
  auto tied = config.Bool("tie_word_embeddings", false);
  if (!tied.ok()) return tied.status();
  arch->tie_word_embeddings = *tied;
  auto window = config.Int("sliding_window", 0);
  if (!window.ok()) return window.status();
  if (*window > 0) {
    AlternateWindows(*window, arch);
    bool listed = false;
    SLUICE_RETURN_IF_ERROR(ReadLayerTypes(config, arch, &listed));
  }
  return ReadConfigExperts(config, "num_local_experts", "intermediate_size", nullptr, arch);
}

Status FromGguf(const GgufFile& file, const std::string& prefix, ModelArchitecture* arch) {
  SetGptOssBlock(arch);
  arch->attention_bias = arch->attention_out_bias = true;
  auto window = file.Integer(prefix + "attention.sliding_window", 0);
  if (!window.ok()) return window.status();
  if (*window < 0 || *window > (1 << 30)) {
    return Status::InvalidArgument(fmt::format(
        "{}: '{}attention.sliding_window' must be a positive count", file.path(), prefix));
  }
  if (*window > 0) AlternateWindows(static_cast<int>(*window), arch);
  return ReadGgufExperts(file, prefix, arch->intermediate_size, /*required=*/true, arch);
}

}  // namespace

const Family& GptOssFamily() {
  // Qwen2's names (Llama's, q, k and v with biases, halves rotated as llama.cpp rotates gpt-oss's),
  // less the dense feed-forward's, and gpt-oss's own.
  static const Family family = [] {
    Family f = Qwen2Family();
    f.name = "gpt-oss";
    f.model_types = {"gpt_oss"};
    f.gguf.gate = f.gguf.up = f.gguf.down = "";
    f.hf.gate = f.hf.up = f.hf.down = "";
    f.gguf.ffn_norm = "blk.{}.post_attention_norm.weight";
    f.gguf.o_bias = "blk.{}.attn_output.bias";
    f.gguf.sinks = "blk.{}.attn_sinks.weight";
    f.gguf.router_bias = "blk.{}.ffn_gate_inp.bias";
    f.gguf.expert_gate_bias = "blk.{}.ffn_gate_exps.bias";
    f.gguf.expert_up_bias = "blk.{}.ffn_up_exps.bias";
    f.gguf.expert_down_bias = "blk.{}.ffn_down_exps.bias";
    f.hf.o_bias = "model.layers.{}.self_attn.o_proj.bias";
    f.hf.sinks = "model.layers.{}.self_attn.sinks";
    f.hf.router = "model.layers.{}.mlp.router.weight";
    f.hf.router_bias = "model.layers.{}.mlp.router.bias";
    f.hf.expert_gate = f.hf.expert_up = "";
    f.hf.expert_gate_up = "model.layers.{}.mlp.experts.gate_up_proj";
    f.hf.expert_down = "model.layers.{}.mlp.experts.down_proj";
    f.hf.expert_gate_up_bias = "model.layers.{}.mlp.experts.gate_up_proj_bias";
    f.hf.expert_down_bias = "model.layers.{}.mlp.experts.down_proj_bias";
    f.from_config = FromConfig;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
