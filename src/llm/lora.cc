#include "llm/lora.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "common/half.h"
#include "llm/files/safetensors.h"

namespace sluice::llm {
namespace {

std::atomic<uint64_t> g_next_id{1};

Status Bad(const std::string& file, std::string_view key, std::string_view why) {
  return Status::InvalidArgument(fmt::format("{}: '{}' {}", file, key, why));
}

std::optional<LoraModule> ModuleNamed(std::string_view name) {
  for (int m = 0; m < kLoraModules; ++m) {
    if (LoraModuleName(static_cast<LoraModule>(m)) == name) return static_cast<LoraModule>(m);
  }
  return std::nullopt;
}

// The base projection's (out, in) for `module`.
std::pair<int64_t, int64_t> ShapeOf(LoraModule module, const ModelArchitecture& a) {
  const int64_t q = int64_t{a.heads} * a.head_dim, kv = int64_t{a.kv_heads} * a.head_dim;
  switch (module) {
    case LoraModule::kQ:
      return {q, a.hidden_size};
    case LoraModule::kK:
    case LoraModule::kV:
      return {kv, a.hidden_size};
    case LoraModule::kO:
      return {a.hidden_size, q};
    case LoraModule::kGate:
    case LoraModule::kUp:
      return {a.intermediate_size, a.hidden_size};
    case LoraModule::kDown:
      return {a.hidden_size, a.intermediate_size};
  }
  return {0, 0};
}

// `entry` as floats (F32, F16 or BF16), checked against `shape`.
Result<std::vector<float>> Floats(const std::string& file, const std::string& name,
                                  const SafetensorsEntry& entry, std::vector<int64_t> shape) {
  if (entry.shape != shape) {
    return Bad(file, name,
               fmt::format("has shape [{}]; the base model needs [{}]",
                           fmt::join(entry.shape, ", "), fmt::join(shape, ", ")));
  }
  const size_t n = static_cast<size_t>(shape[0] * shape[1]);
  std::vector<float> out(n);
  if (entry.dtype == "F32") {
    std::memcpy(out.data(), entry.data, n * sizeof(float));
  } else if (entry.dtype == "F16" || entry.dtype == "BF16") {
    const auto* halves = static_cast<const uint16_t*>(entry.data);
    for (size_t i = 0; i < n; ++i) {
      out[i] = entry.dtype == "F16" ? HalfToFloat(halves[i]) : Bf16ToFloat(halves[i]);
    }
  } else {
    return Bad(file, name, fmt::format("has dtype {}; F32, F16 or BF16 expected", entry.dtype));
  }
  return out;
}

}  // namespace

std::string_view LoraModuleName(LoraModule module) {
  switch (module) {
    case LoraModule::kQ:
      return "q_proj";
    case LoraModule::kK:
      return "k_proj";
    case LoraModule::kV:
      return "v_proj";
    case LoraModule::kO:
      return "o_proj";
    case LoraModule::kGate:
      return "gate_proj";
    case LoraModule::kUp:
      return "up_proj";
    case LoraModule::kDown:
      return "down_proj";
  }
  return "";
}

Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& name,
                                                           const std::string& dir,
                                                           const ModelArchitecture& arch,
                                                           int max_rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument(fmt::format("LoRA adapter '{}': {} is not a folder", name, dir));
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".gguf") {
      return Status::InvalidArgument(fmt::format(
          "LoRA adapter '{}': {} is a llama.cpp LoRA GGUF file, which is not served; give the "
          "adapter in PEFT's layout (adapter_config.json + adapter_model.safetensors)",
          name, entry.path().string()));
    }
  }
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  simdjson::dom::parser parser;
  simdjson::dom::element config;
  if (parser.load(config_path).get(config) != simdjson::SUCCESS || !config.is_object()) {
    return Status::InvalidArgument(
        fmt::format("LoRA adapter '{}': {} is missing or not a JSON object", name, config_path));
  }
  std::string_view text;
  if (config["peft_type"].get(text) == simdjson::SUCCESS && text != "LORA") {
    return Bad(config_path, "peft_type", fmt::format("is '{}'; only LORA is served", text));
  }
  bool flag = false;
  if (config["use_dora"].get(flag) == simdjson::SUCCESS && flag) {
    return Bad(config_path, "use_dora", "is true; DoRA adapters are not served");
  }
  if (config["fan_in_fan_out"].get(flag) == simdjson::SUCCESS && flag) {
    return Bad(config_path, "fan_in_fan_out", "is true; not served");
  }
  if (config["bias"].get(text) == simdjson::SUCCESS && text != "none") {
    return Bad(config_path, "bias",
               fmt::format("is '{}'; adapters with biases are not served", text));
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    simdjson::dom::object pattern;
    if (config[key].get(pattern) == simdjson::SUCCESS && pattern.size() > 0) {
      return Bad(config_path, key, "is set; per-module ranks and alphas are not served");
    }
  }
  simdjson::dom::element value;
  if (config["modules_to_save"].get(value) == simdjson::SUCCESS && !value.is_null()) {
    return Bad(config_path, "modules_to_save",
               "is set; adapters with whole modules are not served");
  }
  if (config["layers_to_transform"].get(value) == simdjson::SUCCESS && !value.is_null()) {
    return Bad(config_path, "layers_to_transform", "is set; not served");
  }
  int64_t rank = 0;
  if (config["r"].get(rank) != simdjson::SUCCESS || rank < 1) {
    return Bad(config_path, "r", "must be a positive integer");
  }
  if (rank > max_rank) {
    return Bad(config_path, "r",
               fmt::format("is {}; this model's max_lora_rank is {}", rank, max_rank));
  }
  double alpha = 0;
  int64_t alpha_int = 0;
  if (config["lora_alpha"].get(alpha) != simdjson::SUCCESS) {
    if (config["lora_alpha"].get(alpha_int) != simdjson::SUCCESS) {
      return Bad(config_path, "lora_alpha", "must be a number");
    }
    alpha = static_cast<double>(alpha_int);
  }
  bool rslora = false;
  if (config["use_rslora"].get(flag) == simdjson::SUCCESS) rslora = flag;

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->dir = dir;
  adapter->id = g_next_id.fetch_add(1);
  adapter->rank = static_cast<int>(rank);
  adapter->scale = static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                             : alpha / static_cast<double>(rank));
  adapter->layers.resize(static_cast<size_t>(arch.layers));
  // Each module's A and B as the file gives them, before fusing.
  struct Module {
    std::vector<float> a, b;
  };
  std::vector<std::array<Module, kLoraModules>> modules(static_cast<size_t>(arch.layers));

  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  auto file = SafetensorsFile::Open(weights_path);
  if (!file.ok()) return file.status();
  int targeted = 0;
  // base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
  for (const auto& [key, entry] : (*file)->entries()) {
    const std::string prefix = "base_model.model.model.layers.";
    if (key.rfind(prefix, 0) != 0) {
      return Bad(weights_path, key,
                 "is not a decoder layer's projection (embedding and lm_head adapters are not "
                 "served)");
    }
    size_t at = prefix.size();
    const size_t dot = key.find('.', at);
    int layer = -1;
    try {
      layer = std::stoi(key.substr(at, dot - at));
    } catch (const std::exception&) {
    }
    const size_t module_start = key.find('.', dot + 1) + 1;
    const size_t module_end = key.find('.', module_start);
    const std::string module_name = key.substr(module_start, module_end - module_start);
    const std::string part = key.substr(module_end + 1);
    const std::optional<LoraModule> module = ModuleNamed(module_name);
    if (layer < 0 || layer >= arch.layers || !module ||
        (part != "lora_A.weight" && part != "lora_B.weight")) {
      return Bad(weights_path, key,
                 "is not a lora_A or lora_B weight of a decoder layer's q, k, v, o, gate, up or "
                 "down projection");
    }
    const auto [out, in] = ShapeOf(*module, arch);
    Module& weights = modules[static_cast<size_t>(layer)][static_cast<size_t>(*module)];
    const bool is_a = part == "lora_A.weight";
    auto floats = is_a ? Floats(weights_path, key, entry, {rank, in})
                       : Floats(weights_path, key, entry, {out, rank});
    if (!floats.ok()) return floats.status();
    (is_a ? weights.a : weights.b) = std::move(*floats);
    if (is_a) ++targeted;
  }
  for (size_t l = 0; l < modules.size(); ++l) {
    for (int m = 0; m < kLoraModules; ++m) {
      const Module& w = modules[l][static_cast<size_t>(m)];
      if (w.a.empty() != w.b.empty()) {
        return Status::InvalidArgument(
            fmt::format("{}: layer {} {} has lora_{} without lora_{}", weights_path, l,
                        LoraModuleName(static_cast<LoraModule>(m)), w.a.empty() ? "B" : "A",
                        w.a.empty() ? "A" : "B"));
      }
    }
  }
  if (targeted == 0) {
    return Status::InvalidArgument(fmt::format("{}: no LoRA weights", weights_path));
  }
  // Fused as the base's products: each group's modules, their columns in the base's order.
  static const std::array<std::vector<LoraModule>, kLoraProducts> kGroups = {
      std::vector<LoraModule>{LoraModule::kQ, LoraModule::kK, LoraModule::kV},
      {LoraModule::kO},
      {LoraModule::kGate, LoraModule::kUp},
      {LoraModule::kDown}};
  for (size_t l = 0; l < modules.size(); ++l) {
    for (int g = 0; g < kLoraProducts; ++g) {
      const std::vector<LoraModule>& members = kGroups[static_cast<size_t>(g)];
      int64_t out_total = 0, fused_rank = 0;
      const int64_t in = ShapeOf(members[0], arch).second;
      for (const LoraModule m : members) {
        out_total += ShapeOf(m, arch).first;
        if (!modules[l][static_cast<size_t>(m)].a.empty()) fused_rank += rank;
      }
      if (fused_rank == 0) continue;
      LoraWeights& fused = adapter->layers[l][static_cast<size_t>(g)];
      fused.rank = static_cast<int>(fused_rank);
      fused.a.reserve(static_cast<size_t>(fused_rank * in));
      fused.b.assign(static_cast<size_t>(out_total * fused_rank), 0.0f);
      int64_t row = 0, column = 0;  // Of B: the module's output rows, its rank's columns.
      for (const LoraModule m : members) {
        const Module& w = modules[l][static_cast<size_t>(m)];
        const int64_t out = ShapeOf(m, arch).first;
        if (!w.a.empty()) {
          fused.a.insert(fused.a.end(), w.a.begin(), w.a.end());
          for (int64_t r = 0; r < out; ++r) {
            for (int64_t c = 0; c < rank; ++c) {
              fused.b[static_cast<size_t>((row + r) * fused_rank + column + c)] =
                  adapter->scale * w.b[static_cast<size_t>(r * rank + c)];
            }
          }
          column += rank;
        }
        row += out;
      }
    }
  }
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

}  // namespace sluice::llm
