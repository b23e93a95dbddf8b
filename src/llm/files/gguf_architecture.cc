// A GGUF file's metadata as Sluice's ModelArchitecture: llama.cpp's keys, prefixed with the
// architecture's name ("qwen2.embedding_length"), and its conventions (the rotary layout of each
// architecture, RoPE scaling, tied output when output.weight is absent); each family's own keys
// are read by its file in models/.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llm/files/gguf.h"
#include "llm/kernels/kernels.h"
#include "llm/llm_config.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

Status Bad(const GgufFile& file, const std::string& key, const std::string& why) {
  return Status::InvalidArgument(fmt::format("{}: '{}' {}", file.path(), key, why));
}

// A per-frequency factor tensor (F32, head_dim / 2 values) into `out`; absent: `out` stays empty.
Status ReadFrequencyFactors(const GgufFile& file, const char* name, const ModelArchitecture& arch,
                            std::vector<float>* out) {
  const GgufTensor* tensor = file.FindTensor(name);
  if (tensor == nullptr) return Status::Ok();
  if (tensor->type != static_cast<uint32_t>(GgmlType::kF32) || tensor->shape.size() != 1 ||
      tensor->shape[0] != arch.head_dim / 2) {
    return Bad(file, name, fmt::format("must be F32 of {} values", arch.head_dim / 2));
  }
  out->resize(static_cast<size_t>(arch.head_dim / 2));
  std::memcpy(out->data(), tensor->data, tensor->bytes);
  for (float f : *out) {
    if (!(f > 0) || !std::isfinite(f)) return Bad(file, name, "must hold positive factors");
  }
  return Status::Ok();
}

// RoPE scaling as llama.cpp reads it: rope.scaling.type none, linear or yarn (with factor,
// original_context_length, yarn_beta_fast/slow, and attn_factor on top of YaRN's own
// 1 + 0.1 ln(factor)); llama3's as the rope_freqs tensor; LongRoPE (Phi-3/3.5, which its converter
// writes with no type) as the rope_factors_short/long tensors with attn_factor and
// original_context_length.
Status ReadRopeScaling(const GgufFile& file, const std::string& p, ModelArchitecture* arch) {
  auto scaling = file.String(p + "rope.scaling.type", "none");
  if (!scaling.ok()) return scaling.status();
  auto original =
      file.Integer(p + "rope.scaling.original_context_length", arch->max_position_embeddings);
  if (!original.ok()) return original.status();
  if (*original <= 0 || *original > (1 << 30)) {
    return Bad(file, p + "rope.scaling.original_context_length", "must be positive");
  }
  auto attn_factor = file.Number(p + "rope.scaling.attn_factor", 1.0);
  if (!attn_factor.ok()) return attn_factor.status();
  if (!(*attn_factor > 0)) return Bad(file, p + "rope.scaling.attn_factor", "must be positive");
  arch->rope_attention_factor = *attn_factor;  // llama.cpp applies it whatever the scaling.
  if (*scaling == "linear" || *scaling == "yarn") {
    auto factor = file.Number(p + "rope.scaling.factor");
    if (!factor.ok()) return factor.status();
    if (*factor <= 0) return Bad(file, p + "rope.scaling.factor", "must be positive");
    arch->rope_factor = *factor;
    arch->rope_scaling = *scaling == "linear" ? RopeScaling::kLinear : RopeScaling::kYarn;
  } else if (*scaling != "none") {
    return Bad(file, p + "rope.scaling.type",
               fmt::format("is '{}': Sluice supports none, linear and yarn", *scaling));
  }
  if (arch->rope_scaling == RopeScaling::kYarn) {
    for (const char* key : {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_ext_factor"}) {
      const GgufValue* value = file.Find(p + key);
      const double expected = std::string_view(key).ends_with("ext_factor") ? 1.0 : 0.0;
      if (value != nullptr && !(value->kind == GgufValue::kFloat && value->number == expected)) {
        return Bad(file, p + key, fmt::format("is not {}: not supported", expected));
      }
    }
    auto fast = file.Number(p + "rope.scaling.yarn_beta_fast", 32.0);
    auto slow = file.Number(p + "rope.scaling.yarn_beta_slow", 1.0);
    if (!fast.ok()) return fast.status();
    if (!slow.ok()) return slow.status();
    if (!(*fast > *slow && *slow > 0)) {
      return Bad(file, p + "rope.scaling.yarn_beta_fast", "must exceed yarn_beta_slow (> 0)");
    }
    arch->rope_yarn_beta_fast = *fast;
    arch->rope_yarn_beta_slow = *slow;
    arch->rope_original_max_positions = static_cast<int>(*original);
    if (arch->rope_factor > 1) arch->rope_attention_factor *= 1 + 0.1 * std::log(arch->rope_factor);
  }
  SLUICE_RETURN_IF_ERROR(
      ReadFrequencyFactors(file, "rope_freqs.weight", *arch, &arch->rope_freq_factors));
  SLUICE_RETURN_IF_ERROR(
      ReadFrequencyFactors(file, "rope_factors_short.weight", *arch, &arch->rope_short_factors));
  SLUICE_RETURN_IF_ERROR(
      ReadFrequencyFactors(file, "rope_factors_long.weight", *arch, &arch->rope_long_factors));
  if (arch->rope_short_factors.empty() != arch->rope_long_factors.empty()) {
    return Status::InvalidArgument(fmt::format(
        "{}: LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight",
        file.path()));
  }
  if (!arch->rope_long_factors.empty() && arch->rope_freq_factors.empty()) {
    if (arch->rope_scaling != RopeScaling::kNone) {
      return Bad(file, p + "rope.scaling.type",
                 fmt::format("is '{}' beside LongRoPE's factors: not supported", *scaling));
    }
    arch->rope_scaling = RopeScaling::kLongRope;
    arch->rope_original_max_positions = static_cast<int>(*original);
  }
  return Status::Ok();
}

}  // namespace

Result<ModelArchitecture> ArchitectureFromGguf(const GgufFile& file) {
  auto name = file.String("general.architecture");
  if (!name.ok()) return name.status();
  const Family* family = FamilyByName(*name);
  if (family == nullptr && (*name == "nomic-bert-moe" || *name == "jina-bert-v2" ||
                            *name == "modern-bert" || *name == "t5encoder")) {
    return Status::InvalidArgument(fmt::format(
        "{}: architecture '{}' is an encoder-only model of a type Sluice does not serve (of "
        "encoders it serves 'bert' and 'nomic-bert': embedding models and rerankers)",
        file.path(), *name));
  }
  if (family == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "{}: architecture '{}' is not one Sluice serves ({})", file.path(), *name, FamilyNames()));
  }
  ModelArchitecture arch;
  arch.name = *name;
  arch.rope_interleaved = family->gguf_rope_interleaved;
  const std::string p = *name + ".";
  struct IntKey {
    std::string key;
    int* field;
    int64_t fallback;  // -1: required.
  };
  for (const IntKey& item : {IntKey{p + "embedding_length", &arch.hidden_size, -1},
                             IntKey{p + "feed_forward_length", &arch.intermediate_size, -1},
                             IntKey{p + "block_count", &arch.layers, -1},
                             IntKey{p + "attention.head_count", &arch.heads, -1},
                             IntKey{p + "context_length", &arch.max_position_embeddings, 2048}}) {
    auto value = item.fallback < 0 ? file.Integer(item.key) : file.Integer(item.key, item.fallback);
    if (!value.ok()) return value.status();
    if (*value <= 0 || *value > (1 << 30)) return Bad(file, item.key, "must be positive");
    *item.field = static_cast<int>(*value);
  }
  auto kv = file.Integer(p + "attention.head_count_kv", arch.heads);
  if (!kv.ok()) return kv.status();
  if (*kv <= 0 || arch.heads % *kv != 0) {
    return Bad(file, p + "attention.head_count_kv", "must divide attention.head_count");
  }
  arch.kv_heads = static_cast<int>(*kv);
  auto key_length = file.Integer(p + "attention.key_length", arch.hidden_size / arch.heads);
  auto value_length = file.Integer(p + "attention.value_length", key_length.ok() ? *key_length : 0);
  if (!key_length.ok()) return key_length.status();
  if (!value_length.ok()) return value_length.status();
  if (*key_length <= 0 || *key_length % 2 != 0 || *key_length > 1024) {
    return Bad(file, p + "attention.key_length", "must be even, at most 1024");
  }
  if (*value_length != *key_length) {
    return Bad(file, p + "attention.value_length", "differs from key_length: not supported");
  }
  arch.head_dim = static_cast<int>(*key_length);
  auto rope_dims = file.Integer(p + "rope.dimension_count", arch.head_dim);
  if (!rope_dims.ok()) return rope_dims.status();
  if (*rope_dims != arch.head_dim) {
    return Bad(file, p + "rope.dimension_count",
               fmt::format("is {}, the head size {}: partial rotary embeddings are not supported",
                           *rope_dims, arch.head_dim));
  }
  auto eps = file.Number(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  arch.rms_norm_eps = *eps;
  auto theta = file.Number(p + "rope.freq_base", 10000.0);
  if (!theta.ok()) return theta.status();
  arch.rope_theta = *theta;
  if (Status rope = ReadRopeScaling(file, p, &arch); !rope.ok()) return rope;
  if (family->from_gguf != nullptr) {
    if (Status own = family->from_gguf(file, p, &arch); !own.ok()) return own;
  }
  // The vocabulary: the embedding's rows (the tokenizer's list may be shorter, never longer).
  const GgufTensor* embedding = file.FindTensor("token_embd.weight");
  if (embedding == nullptr) {
    return Status::InvalidArgument(
        fmt::format("{}: tensor 'token_embd.weight' is missing", file.path()));
  }
  if (embedding->shape.size() != 2 || embedding->shape[1] != arch.hidden_size) {
    return Bad(file, "token_embd.weight", fmt::format("must be [vocab, {}]", arch.hidden_size));
  }
  arch.vocab_size = static_cast<int>(embedding->shape[0]);
  arch.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  auto bos = file.Integer("tokenizer.ggml.bos_token_id", -1);
  if (!bos.ok()) return bos.status();
  arch.bos_token_id = static_cast<int>(*bos);
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    auto id = file.Integer(key, -1);
    if (!id.ok()) return id.status();
    if (*id < 0) continue;
    if (*id >= arch.vocab_size) return Bad(file, key, "is outside the vocabulary");
    if (std::find(arch.eos_token_ids.begin(), arch.eos_token_ids.end(), *id) ==
        arch.eos_token_ids.end()) {
      arch.eos_token_ids.push_back(static_cast<int>(*id));
    }
  }
  return arch;
}

}  // namespace sluice::llm
