#include "llm/models/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "llm/files/gguf.h"
#include "llm/models/config_json.h"

namespace sluice::llm {

const std::vector<const Family*>& Families() {
  static const std::vector<const Family*> families = {
      &LlamaFamily(), &Qwen2Family(),  &Qwen3Family(), &Qwen3MoeFamily(),
      &Phi3Family(),  &Gemma3Family(), &GptOssFamily()};
  return families;
}

const Family* FamilyByName(std::string_view gguf_architecture) {
  for (const Family* family : Families()) {
    if (family->name == gguf_architecture) return family;
  }
  return nullptr;
}

const Family* FamilyByModelType(std::string_view model_type) {
  for (const Family* family : Families()) {
    for (std::string_view type : family->model_types) {
      if (type == model_type) return family;
    }
  }
  return nullptr;
}

std::string FamilyNames() {
  std::vector<std::string_view> names;
  for (const Family* family : Families()) names.push_back(family->name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string ModelTypeNames() {
  std::vector<std::string_view> names;
  for (const Family* family : Families()) {
    names.insert(names.end(), family->model_types.begin(), family->model_types.end());
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

Status RequireSilu(const JsonConfig& config, const char* key) {
  auto activation = config.String(key, "silu");
  if (!activation.ok()) return activation.status();
  if (*activation != "silu") return config.Bad(key, "is not silu: not supported");
  return Status::Ok();
}

Status RequireNoQwenWindows(const JsonConfig& config, std::string_view family) {
  auto sliding = config.Bool("use_sliding_window", false);
  if (!sliding.ok()) return sliding.status();
  if (*sliding) {
    return config.Bad("use_sliding_window",
                      fmt::format("is true: {}'s windowed layers are not supported", family));
  }
  return Status::Ok();
}

void SetSlidingWindowEverywhere(int window, ModelArchitecture* arch) {
  if (window <= 0 || window >= arch->max_position_embeddings) return;
  arch->sliding_window = window;
  arch->local_layers.assign(static_cast<size_t>(arch->layers), true);
  arch->rope_theta_local = 0;  // The global rotation.
}

Status ReadLayerTypes(const JsonConfig& config, ModelArchitecture* arch, bool* found) {
  simdjson::dom::array types;
  *found = config.object()["layer_types"].get(types) == simdjson::SUCCESS;
  if (!*found) return Status::Ok();
  if (types.size() != static_cast<size_t>(arch->layers)) {
    return config.Bad("layer_types", fmt::format("must name {} layers", arch->layers));
  }
  arch->local_layers.assign(static_cast<size_t>(arch->layers), false);
  size_t l = 0;
  for (auto type : types) {
    std::string_view name;
    if (type.get(name) != simdjson::SUCCESS ||
        (name != "sliding_attention" && name != "full_attention")) {
      return config.Bad("layer_types", "holds sliding_attention or full_attention");
    }
    arch->local_layers[l++] = name == "sliding_attention";
  }
  return Status::Ok();
}

Status ReadGgufExperts(const GgufFile& file, const std::string& prefix, int default_width,
                       bool required, ModelArchitecture* arch) {
  auto bad = [&](const std::string& key, std::string_view why) {
    return Status::InvalidArgument(fmt::format("{}: {}{} {}", file.path(), prefix, key, why));
  };
  if (!required && !file.Integer(prefix + "expert_count").ok()) return Status::Ok();  // Dense.
  auto experts = file.Integer(prefix + "expert_count");
  if (!experts.ok()) return experts.status();
  auto used = file.Integer(prefix + "expert_used_count");
  if (!used.ok()) return used.status();
  auto width = file.Integer(prefix + "expert_feed_forward_length", default_width);
  if (!width.ok()) return width.status();
  auto shared = file.Integer(prefix + "expert_shared_count", 0);
  if (!shared.ok()) return shared.status();
  if (*experts < 1 || *experts > 1024) return bad("expert_count", "must be 1 to 1024");
  if (*used < 1 || *used > *experts) return bad("expert_used_count", "must be 1 to expert_count");
  if (*width < 1 || *width > (1 << 20)) {
    return bad("expert_feed_forward_length", "must be positive");
  }
  if (*shared != 0) return bad("expert_shared_count", "is not 0: shared experts are not supported");
  arch->experts = static_cast<int>(*experts);
  arch->experts_used = static_cast<int>(*used);
  arch->expert_intermediate_size = static_cast<int>(*width);
  arch->expert_weights_norm = true;
  return Status::Ok();
}

Status ReadConfigExperts(const JsonConfig& config, const char* count_key, const char* width_key,
                         const char* norm_key, ModelArchitecture* arch) {
  auto experts = config.Int(count_key, std::nullopt);
  if (!experts.ok()) return experts.status();
  auto used = config.Int("num_experts_per_tok", std::nullopt);
  if (!used.ok()) return used.status();
  auto width = config.Int(width_key, std::nullopt);
  if (!width.ok()) return width.status();
  if (*experts < 1 || *experts > 1024) return config.Bad(count_key, "must be 1 to 1024");
  if (*used < 1 || *used > *experts) {
    return config.Bad("num_experts_per_tok", fmt::format("must be 1 to {}", count_key));
  }
  if (*width < 1) return config.Bad(width_key, "must be positive");
  auto norm = norm_key == nullptr ? Result<bool>(true) : config.Bool(norm_key, false);
  if (!norm.ok()) return norm.status();
  arch->experts = *experts;
  arch->experts_used = *used;
  arch->expert_intermediate_size = *width;
  arch->expert_weights_norm = *norm;
  return Status::Ok();
}

}  // namespace sluice::llm
