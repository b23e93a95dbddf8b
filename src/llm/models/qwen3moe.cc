// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, and on every layer a mixture of
// SwiGLU experts instead of the dense feed-forward: a router picks experts_used of them per token
// by softmax, their probabilities renormalised (as llama.cpp's qwen3moe graph does).
#include "llm/files/gguf.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

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
    f.model_types = {};
    f.gguf.gate = f.gguf.up = f.gguf.down = "";  // The experts' (llama's names) instead.
    f.hf = TensorNames{};
    f.from_config = nullptr;
    f.from_gguf = FromGguf;
    return f;
  }();
  return family;
}

}  // namespace sluice::llm
