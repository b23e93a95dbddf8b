// One file a model family (models/llama.cc, qwen2.cc, qwen3.cc, qwen3moe.cc, phi3.cc,
// gemma3.cc, gpt_oss.cc), as llama.cpp keeps src/models/<arch>.cpp and vLLM
// model_executor/models/<arch>.py: what the family is called in each format, its own
// hyper-parameters from config.json and from GGUF metadata (the common ones are read before, by
// llm_config.cc and files/gguf_architecture.cc), and where its tensors are in each format. The
// block's variations land in ModelArchitecture as data; the step (llama/llama_model.cc) and the
// kernels are shared. A new family is one file and one test. No torch here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "llm/llm_config.h"
#include "sluice/status.h"

namespace sluice::llm {

class GgufFile;
class JsonConfig;

// A family's tensor names in one format. Per-layer names carry "{}" for the layer's index. An
// empty name: the family has no such tensor in that format. Of q/k/v and qkv (one fused
// projection), and of gate/up and gate_up, the family names one.
struct TensorNames {
  std::string embedding, final_norm, output;
  std::string attn_norm;  // Before attention.
  std::string ffn_norm;   // Before the feed-forward.
  std::string q, k, v, qkv, o;
  std::string q_bias, k_bias, v_bias;
  std::string q_norm, k_norm;                 // Per head, before the rotation (qwen3, gemma3).
  std::string post_attn_norm, post_ffn_norm;  // On each block's output (gemma3).
  std::string gate, up, gate_up, down;
  // A mixture of experts: the router ([experts, hidden]) and the experts' projections, in GGUF
  // one 3-D tensor each ([experts, rows, columns]), in Hugging Face folders one tensor an expert
  // (a second "{}" for the expert's index, after the layer's) or, where expert_gate_up is named
  // (gpt-oss's), all experts in two 3-D tensors as x W multiplies them: expert_gate_up
  // [experts, hidden, 2 I] with the gate's and up's columns interleaved (gate even, up odd) and
  // expert_down [experts, I, hidden].
  std::string router, expert_gate, expert_up, expert_down, expert_gate_up;
  // gpt-oss's: the output projection's bias, the attention sinks ([heads]), the router's bias
  // ([experts]) and the experts' biases (GGUF: [experts, rows] each; Hugging Face:
  // expert_gate_up_bias [experts, 2 I] interleaved as its weight, expert_down_bias).
  std::string o_bias, sinks, router_bias;
  std::string expert_gate_bias, expert_up_bias, expert_gate_up_bias, expert_down_bias;
};

struct Family {
  std::string_view name;                      // GGUF's general.architecture; ModelArchitecture's.
  std::vector<std::string_view> model_types;  // config.json's model_type values.
  TensorNames gguf, hf;
  // llama.cpp rotates this family's q/k rows in pairs (2i, 2i + 1): its converter permuted them.
  bool gguf_rope_interleaved = false;
  // Hugging Face stores the norms as w of x * (1 + w) (Gemma's); GGUF stores 1 + w.
  bool hf_norms_offset = false;
  // A multimodal config.json's decoder is under this key ("text_config"); empty: at the root.
  std::string_view hf_text_config;
  // The family's own settings from config.json (the common ones are in `arch` already).
  Status (*from_config)(const JsonConfig& config, ModelArchitecture* arch) = nullptr;
  // ... and from a GGUF file's metadata, under `prefix` ("qwen2.").
  Status (*from_gguf)(const GgufFile& file, const std::string& prefix,
                      ModelArchitecture* arch) = nullptr;
};

// Every family Sluice serves, and lookups (nullptr when none).
const std::vector<const Family*>& Families();
const Family* FamilyByName(std::string_view gguf_architecture);
const Family* FamilyByModelType(std::string_view model_type);
// "llama, qwen2, ..." (GGUF names) and "llama, mistral, ..." (model_types), for errors.
std::string FamilyNames();
std::string ModelTypeNames();

// One family each, defined in models/<family>.cc.
const Family& LlamaFamily();
const Family& Qwen2Family();
const Family& Qwen3Family();
const Family& Qwen3MoeFamily();
const Family& Phi3Family();
const Family& Gemma3Family();
const Family& GptOssFamily();

// Shared by the families' readers: config.json's hidden_act (or `key`) is silu, else an error.
Status RequireSilu(const JsonConfig& config, const char* key = "hidden_act");
// Qwen's use_sliding_window (windows on its upper layers) is off, else an error naming `family`.
Status RequireNoQwenWindows(const JsonConfig& config, std::string_view family);
// A GGUF file's mixture of experts under `prefix`: expert_count, expert_used_count and
// expert_feed_forward_length (absent: `default_width`); renormalised top-k weights, as llama.cpp
// routes llama and qwen3moe files. Without expert_count the model is dense, or, with `required`,
// an error. Shared experts are refused by their key.
Status ReadGgufExperts(const GgufFile& file, const std::string& prefix, int default_width,
                       bool required, ModelArchitecture* arch);
// A config.json's mixture of experts: `count_key` experts of `width_key`'s width,
// num_experts_per_tok used a token, their weights renormalised where `norm_key` (nullptr: always,
// as Mixtral) is true.
Status ReadConfigExperts(const JsonConfig& config, const char* count_key, const char* width_key,
                         const char* norm_key, ModelArchitecture* arch);
// Qwen3's own config.json settings (q/k norms; no biases, no windows), Qwen3-MoE's too.
Status Qwen3FromConfig(const JsonConfig& config, ModelArchitecture* arch);
// A sliding window over every layer (Mistral's, Phi-3's), the same rotation as the other layers;
// none when the window covers `max_positions`.
void SetSlidingWindowEverywhere(int window, ModelArchitecture* arch);
// config.json's layer_types ("sliding_attention" / "full_attention", one a layer) into
// arch->local_layers; `*found` false when the key is absent (local_layers untouched).
Status ReadLayerTypes(const JsonConfig& config, ModelArchitecture* arch, bool* found);

}  // namespace sluice::llm
