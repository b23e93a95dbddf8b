// Gemma 3 (gemma3_text, and the text half of the multimodal gemma3): the embedding scaled by
// sqrt(hidden), RMSNorm of each query and key head, a norm after attention and after the
// feed-forward (before each residual add), GeGLU (GELU's tanh form), queries scaled by
// 1 / sqrt(query_pre_attn_scalar), sliding-window attention on five layers of six with their
// own rotary base, an optional final logit soft cap. Its RMSNorms scale by (1 + w): config.json's
// checkpoints store w, llama.cpp's converter stores 1 + w.
#include <fmt/format.h>

#include <cmath>

#include "llm/files/gguf.h"
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

void GemmaBlock(ModelArchitecture* arch) {
  arch->scale_embedding = true;
  arch->post_norms = true;
  arch->qk_norm = true;
  arch->activation = GateActivation::kGeluTanh;
}

Status FromConfig(const JsonConfig& config, ModelArchitecture* arch) {
  GemmaBlock(arch);
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    auto activation = config.String(key, "gelu_pytorch_tanh");
    if (!activation.ok()) return activation.status();
    if (*activation != "gelu_pytorch_tanh") {
      return config.Bad(key, "is not gelu_pytorch_tanh: not supported");
    }
  }
  if (config.Has("attn_logit_softcapping")) {
    return config.Bad("attn_logit_softcapping", "is set (Gemma 2's): not supported");
  }
  auto scalar = config.Number("query_pre_attn_scalar", arch->head_dim);
  if (!scalar.ok()) return scalar.status();
  if (!(*scalar > 0)) return config.Bad("query_pre_attn_scalar", "must be positive");
  arch->attention_scale = 1.0 / std::sqrt(*scalar);
  auto cap = config.Number("final_logit_softcapping", 0.0);
  if (!cap.ok()) return cap.status();
  if (*cap < 0) return config.Bad("final_logit_softcapping", "must not be negative");
  arch->final_logit_softcap = *cap;
  auto tied = config.Bool("tie_word_embeddings", true);  // Gemma ties them unless it says.
  if (!tied.ok()) return tied.status();
  arch->tie_word_embeddings = *tied;
  // The local layers' rotary base: rope_parameters.sliding_attention (transformers 5) or
  // rope_local_base_freq.
  auto local_theta = config.Number("rope_local_base_freq", 10000.0);
  if (!local_theta.ok()) return local_theta.status();
  arch->rope_theta_local = *local_theta;
  if (auto rope = config.Object("rope_parameters")) {
    if (auto local = rope->Object("sliding_attention")) {
      auto theta = local->Number("rope_theta", arch->rope_theta_local);
      if (!theta.ok()) return theta.status();
      arch->rope_theta_local = *theta;
    }
  }
  if (!(arch->rope_theta_local > 0)) return config.Bad("rope_local_base_freq", "must be positive");
  auto window = config.Int("sliding_window", 0);
  if (!window.ok()) return window.status();
  if (*window == 0) return Status::Ok();
  arch->sliding_window = *window;
  arch->local_layers.assign(static_cast<size_t>(arch->layers), false);
  bool listed = false;
  SLUICE_RETURN_IF_ERROR(ReadLayerTypes(config, arch, &listed));
  if (listed) return Status::Ok();
  auto period = config.Int("sliding_window_pattern", 6);  // Layers 5, 11, ... global.
  if (!period.ok()) return period.status();
  for (int l = 0; l < arch->layers; ++l) {
    arch->local_layers[static_cast<size_t>(l)] = *period == 0 || l % *period < *period - 1;
  }
  return Status::Ok();
}

Status Bad(const GgufFile& file, const std::string& key, const std::string& why) {
  return Status::InvalidArgument(fmt::format("{}: '{}' {}", file.path(), key, why));
}

// As llama.cpp reads them: attention.sliding_window (absent or 0: every layer global) and
// attention.sliding_window_pattern, either one flag per layer or a period n whose last layer is
// global (default 6); the local layers' rotary base rope.freq_base_swa (default 10,000), the
// queries' scale 1 / sqrt(head size) (1 / sqrt(hidden / heads) for the 62-layer 27B, as
// llama.cpp sets it), an optional final logit soft cap.
Status FromGguf(const GgufFile& file, const std::string& p, ModelArchitecture* arch) {
  GemmaBlock(arch);
  arch->attention_scale =
      arch->layers == 62 ? 1.0 / std::sqrt(static_cast<double>(arch->hidden_size) / arch->heads)
                         : 1.0 / std::sqrt(static_cast<double>(arch->head_dim));
  auto cap = file.Number(p + "final_logit_softcapping", 0.0);
  if (!cap.ok()) return cap.status();
  if (*cap < 0) return Bad(file, p + "final_logit_softcapping", "must not be negative");
  arch->final_logit_softcap = *cap;
  auto local_theta = file.Number(p + "rope.freq_base_swa", 10000.0);
  if (!local_theta.ok()) return local_theta.status();
  if (*local_theta <= 0) return Bad(file, p + "rope.freq_base_swa", "must be positive");
  arch->rope_theta_local = *local_theta;
  auto window = file.Integer(p + "attention.sliding_window", 0);
  if (!window.ok()) return window.status();
  if (*window < 0 || *window > (1 << 30)) {
    return Bad(file, p + "attention.sliding_window", "must be a positive count");
  }
  if (*window == 0) return Status::Ok();
  arch->sliding_window = static_cast<int>(*window);
  arch->local_layers.assign(static_cast<size_t>(arch->layers), false);
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  const GgufValue* pattern = file.Find(pattern_key);
  if (pattern != nullptr && pattern->kind == GgufValue::kArray) {
    if (pattern->element_kind != GgufValue::kBool && pattern->element_kind != GgufValue::kInteger) {
      return Bad(file, pattern_key, "must be an integer or one bool per layer");
    }
    if (pattern->integers.size() != static_cast<size_t>(arch->layers)) {
      return Bad(file, pattern_key, fmt::format("must hold {} flags, one a layer", arch->layers));
    }
    for (int l = 0; l < arch->layers; ++l) {
      arch->local_layers[static_cast<size_t>(l)] = pattern->integers[static_cast<size_t>(l)] != 0;
    }
  } else {
    auto period = file.Integer(pattern_key, 6);
    if (!period.ok()) return period.status();
    if (*period < 0 || *period > (1 << 30)) return Bad(file, pattern_key, "must not be negative");
    for (int l = 0; l < arch->layers; ++l) {
      arch->local_layers[static_cast<size_t>(l)] = *period == 0 || l % *period < *period - 1;
    }
  }
  return Status::Ok();
}

}  // namespace

const Family& Gemma3Family() {
  static const Family family = [] {
    Family f = Qwen3Family();  // q/k norms.
    f.name = "gemma3";
    f.model_types = {"gemma3_text", "gemma3"};
    f.gguf.post_attn_norm = "blk.{}.post_attention_norm.weight";
    f.gguf.post_ffn_norm = "blk.{}.post_ffw_norm.weight";
    // Gemma's post_attention_layernorm is the norm on attention's output; the feed-forward's
    // input norm is pre_feedforward_layernorm.
    f.hf.ffn_norm = "model.layers.{}.pre_feedforward_layernorm.weight";
    f.hf.post_attn_norm = "model.layers.{}.post_attention_layernorm.weight";
    f.hf.post_ffn_norm = "model.layers.{}.post_feedforward_layernorm.weight";
    f.hf_norms_offset = true;
    f.hf_text_config = "text_config";
    f.from_config = FromConfig;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
