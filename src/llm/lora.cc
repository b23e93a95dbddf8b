#include "llm/lora.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>

#include "common/half.h"
#include "llm/files/gguf.h"
#include "llm/files/safetensors.h"
#include "llm/kernels/kernels.h"

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

// Each module's A (rank x in) and B (out x rank) as the file gives them, before fusing.
struct ModuleWeights {
  std::vector<float> a, b;
};

struct ParsedAdapter {
  std::string file;  // For errors: the weights' path.
  int64_t rank = 0;
  float scale = 1;
  // q's and k's B rows in llama.cpp's rotary order (each head's pairs interleaved, as its
  // converter permutes 'llama' files), not transformers' (each head's halves).
  bool qk_interleaved = false;
  std::vector<std::array<ModuleWeights, kLoraModules>> modules;  // One entry per decoder layer.
};

// Every targeted module has both A and B; at least one is targeted.
Status CheckPairs(const ParsedAdapter& parsed) {
  int targeted = 0;
  for (size_t l = 0; l < parsed.modules.size(); ++l) {
    for (int m = 0; m < kLoraModules; ++m) {
      const ModuleWeights& w = parsed.modules[l][static_cast<size_t>(m)];
      if (w.a.empty() != w.b.empty()) {
        return Status::InvalidArgument(
            fmt::format("{}: layer {} {} has lora_{} without lora_{}", parsed.file, l,
                        LoraModuleName(static_cast<LoraModule>(m)), w.a.empty() ? "B" : "A",
                        w.a.empty() ? "A" : "B"));
      }
      if (!w.a.empty()) ++targeted;
    }
  }
  if (targeted == 0)
    return Status::InvalidArgument(fmt::format("{}: no LoRA weights", parsed.file));
  return Status::Ok();
}

// PEFT's layout: adapter_config.json (r, lora_alpha, use_rslora; what is not served refused by
// name) and adapter_model.safetensors.
Status ReadPeft(const std::string& dir, const ModelArchitecture& arch, int max_rank,
                ParsedAdapter* parsed) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  simdjson::dom::parser parser;
  simdjson::dom::element config;
  if (parser.load(config_path).get(config) != simdjson::SUCCESS || !config.is_object()) {
    return Status::InvalidArgument(fmt::format("{} is not a JSON object", config_path));
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
  parsed->rank = rank;
  parsed->scale = static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                            : alpha / static_cast<double>(rank));
  parsed->modules.resize(static_cast<size_t>(arch.layers));

  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  parsed->file = weights_path;
  auto file = SafetensorsFile::Open(weights_path);
  if (!file.ok()) return file.status();
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
    ModuleWeights& weights =
        parsed->modules[static_cast<size_t>(layer)][static_cast<size_t>(*module)];
    const bool is_a = part == "lora_A.weight";
    auto floats = is_a ? Floats(weights_path, key, entry, {rank, in})
                       : Floats(weights_path, key, entry, {out, rank});
    if (!floats.ok()) return floats.status();
    (is_a ? weights.a : weights.b) = std::move(*floats);
  }
  return Status::Ok();
}

// llama.cpp's tensor names for the modules.
std::optional<LoraModule> GgufModuleNamed(std::string_view name) {
  static constexpr std::pair<std::string_view, LoraModule> kNames[] = {
      {"attn_q", LoraModule::kQ},      {"attn_k", LoraModule::kK},      {"attn_v", LoraModule::kV},
      {"attn_output", LoraModule::kO}, {"ffn_gate", LoraModule::kGate}, {"ffn_up", LoraModule::kUp},
      {"ffn_down", LoraModule::kDown}};
  for (const auto& [gguf_name, module] : kNames) {
    if (gguf_name == name) return module;
  }
  return std::nullopt;
}

// llama.cpp's LoRA GGUF (convert_lora_to_gguf.py): general.type 'adapter', adapter.type 'lora',
// adapter.lora.alpha, and blk.<i>.<tensor>.weight.lora_a (rank x in) / .lora_b (out x rank) per
// targeted projection, in the base's layout (q and k permuted for 'llama' files). The scale is
// llama.cpp's: alpha / rank, or 1 when alpha is 0. Norm vectors some tools add are skipped, as
// llama.cpp skips them.
Status ReadGguf(const std::string& path, const ModelArchitecture& arch, int max_rank,
                ParsedAdapter* parsed) {
  parsed->file = path;
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  const GgufFile& gguf = **file;
  auto type = gguf.String("general.type", "");
  if (!type.ok()) return type.status();
  if (*type != "adapter") {
    return Bad(path, "general.type",
               fmt::format("is '{}', not 'adapter': a model, not a LoRA adapter", *type));
  }
  auto adapter_type = gguf.String("adapter.type", "");
  if (!adapter_type.ok()) return adapter_type.status();
  if (*adapter_type != "lora") {
    return Bad(path, "adapter.type", fmt::format("is '{}'; only lora is served", *adapter_type));
  }
  auto architecture = gguf.String("general.architecture");
  if (!architecture.ok()) return architecture.status();
  if (*architecture != arch.name) {
    return Bad(path, "general.architecture",
               fmt::format("is '{}'; the base model is '{}'", *architecture, arch.name));
  }
  auto alpha = gguf.Number("adapter.lora.alpha", 0.0);
  if (!alpha.ok()) return alpha.status();
  parsed->qk_interleaved = *architecture == "llama";
  parsed->modules.resize(static_cast<size_t>(arch.layers));
  for (const GgufTensor& tensor : gguf.tensors()) {
    const std::string& name = tensor.name;
    if (name.size() > 12 && name.compare(name.size() - 12, 12, "_norm.weight") == 0) continue;
    static const std::regex kName(R"(blk\.(\d{1,6})\.(\w+)\.weight\.lora_([ab]))");
    std::smatch match;
    const std::optional<LoraModule> module =
        std::regex_match(name, match, kName) ? GgufModuleNamed(match.str(2)) : std::nullopt;
    const int layer = module ? std::stoi(match.str(1)) : -1;
    if (layer < 0 || layer >= arch.layers) {
      return Bad(path, name,
                 "is not a lora_a or lora_b of a decoder layer's attn_q, attn_k, attn_v, "
                 "attn_output, ffn_gate, ffn_up or ffn_down (embedding and output adapters are "
                 "not served)");
    }
    const LoraModule target = *module;
    const bool is_a = match.str(3) == "a";
    if (tensor.shape.size() != 2) {
      return Bad(path, name, fmt::format("has {} dimensions; 2 expected", tensor.shape.size()));
    }
    const int64_t rank = is_a ? tensor.shape[0] : tensor.shape[1];
    if (rank < 1 || rank > max_rank) {
      return Bad(path, name,
                 fmt::format("has rank {}; this model's max_lora_rank is {}", rank, max_rank));
    }
    if (parsed->rank == 0) parsed->rank = rank;
    if (rank != parsed->rank) {
      return Bad(path, name,
                 fmt::format("has rank {}, another tensor {}; per-module ranks are not served",
                             rank, parsed->rank));
    }
    const auto [out, in] = ShapeOf(target, arch);
    const std::vector<int64_t> want =
        is_a ? std::vector<int64_t>{rank, in} : std::vector<int64_t>{out, rank};
    if (tensor.shape != want) {
      return Bad(path, name,
                 fmt::format("has shape [{}]; the base model needs [{}]",
                             fmt::join(tensor.shape, ", "), fmt::join(want, ", ")));
    }
    std::vector<float> values(static_cast<size_t>(want[0] * want[1]));
    const auto type_id = static_cast<GgmlType>(tensor.type);
    if (type_id == GgmlType::kF32 || type_id == GgmlType::kF16 || type_id == GgmlType::kBF16 ||
        IsQuantType(tensor.type)) {
      const int64_t row_bytes = static_cast<int64_t>(tensor.bytes) / want[0];
      for (int64_t r = 0; r < want[0]; ++r) {
        DequantizeRow(tensor.type, static_cast<const uint8_t*>(tensor.data) + r * row_bytes,
                      want[1], values.data() + r * want[1]);
      }
    } else {
      return Bad(path, name, fmt::format("has ggml type {}, which is not served", tensor.type));
    }
    ModuleWeights& weights =
        parsed->modules[static_cast<size_t>(layer)][static_cast<size_t>(*module)];
    (is_a ? weights.a : weights.b) = std::move(values);
  }
  parsed->scale =
      *alpha != 0 ? static_cast<float>(*alpha / static_cast<double>(parsed->rank)) : 1.0f;
  return Status::Ok();
}

// A q or k projection's B rows (out x rank, `heads` heads of `head_dim` rows) from transformers'
// rotary order to llama.cpp's (row h*d + 2i + j <- h*d + j*d/2 + i, its converter's permute), or
// back.
void ReorderRotaryRows(std::vector<float>& b, int64_t heads, int64_t head_dim, int64_t rank,
                       bool to_interleaved) {
  const std::vector<float> from = b;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t interleaved = h * head_dim + 2 * i + j, halves = h * head_dim + j * half + i;
        const int64_t to = to_interleaved ? interleaved : halves;
        const int64_t source = to_interleaved ? halves : interleaved;
        std::copy_n(from.begin() + source * rank, rank, b.begin() + to * rank);
      }
    }
  }
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
                                                           const std::string& path,
                                                           const ModelArchitecture& arch,
                                                           int max_rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A GGUF file, or a folder with PEFT's files or one GGUF file.
  std::string gguf_path;
  if (fs::is_regular_file(path, ec)) {
    gguf_path = path;
  } else if (fs::is_directory(path, ec)) {
    std::vector<std::string> ggufs;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".gguf") ggufs.push_back(entry.path().string());
    }
    const bool peft = fs::exists(fs::path(path) / "adapter_config.json", ec);
    if (peft && !ggufs.empty()) {
      return Status::InvalidArgument(fmt::format(
          "LoRA adapter '{}': {} holds both PEFT's adapter_config.json and a GGUF file ({}); give "
          "a folder with one of them",
          name, path, ggufs.front()));
    }
    if (ggufs.size() > 1) {
      return Status::InvalidArgument(fmt::format(
          "LoRA adapter '{}': {} holds {} GGUF files; name the file", name, path, ggufs.size()));
    }
    if (!peft && ggufs.empty()) {
      return Status::InvalidArgument(fmt::format(
          "LoRA adapter '{}': {} holds neither adapter_config.json (PEFT's layout) nor a "
          "llama.cpp LoRA GGUF file",
          name, path));
    }
    if (!peft) gguf_path = ggufs.front();
  } else {
    return Status::InvalidArgument(
        fmt::format("LoRA adapter '{}': {} is neither a folder nor a file", name, path));
  }
  ParsedAdapter parsed;
  Status read = gguf_path.empty() ? ReadPeft(path, arch, max_rank, &parsed)
                                  : ReadGguf(gguf_path, arch, max_rank, &parsed);
  if (read.ok()) read = CheckPairs(parsed);
  if (read.ok() && arch.experts > 0) {
    // A mixture of experts has no dense feed-forward for gate_proj, up_proj or down_proj.
    for (const auto& layer : parsed.modules) {
      for (const LoraModule m : {LoraModule::kGate, LoraModule::kUp, LoraModule::kDown}) {
        if (layer[static_cast<size_t>(m)].a.empty()) continue;
        read = Status::InvalidArgument(fmt::format(
            "adapts {}, but '{}' is a mixture of experts: adapters of its experts are not "
            "supported (attention's q_proj, k_proj, v_proj and o_proj are)",
            LoraModuleName(m), arch.name));
      }
    }
  }
  if (!read.ok()) {
    return Status(read.code(), fmt::format("LoRA adapter '{}': {}", name, read.message()));
  }
  // q's and k's rows in the order the base model rotates them.
  if (parsed.qk_interleaved != arch.rope_interleaved) {
    for (auto& layer : parsed.modules) {
      for (const auto& [module, heads] :
           {std::pair{LoraModule::kQ, arch.heads}, std::pair{LoraModule::kK, arch.kv_heads}}) {
        std::vector<float>& b = layer[static_cast<size_t>(module)].b;
        if (!b.empty())
          ReorderRotaryRows(b, heads, arch.head_dim, parsed.rank, arch.rope_interleaved);
      }
    }
  }

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->dir = path;
  adapter->id = g_next_id.fetch_add(1);
  adapter->rank = static_cast<int>(parsed.rank);
  adapter->scale = parsed.scale;
  adapter->layers.resize(static_cast<size_t>(arch.layers));
  const int64_t rank = parsed.rank;
  // Fused as the base's products: each group's modules, their columns in the base's order.
  static const std::array<std::vector<LoraModule>, kLoraProducts> kGroups = {
      std::vector<LoraModule>{LoraModule::kQ, LoraModule::kK, LoraModule::kV},
      {LoraModule::kO},
      {LoraModule::kGate, LoraModule::kUp},
      {LoraModule::kDown}};
  for (size_t l = 0; l < parsed.modules.size(); ++l) {
    for (int g = 0; g < kLoraProducts; ++g) {
      const std::vector<LoraModule>& members = kGroups[static_cast<size_t>(g)];
      int64_t out_total = 0, fused_rank = 0;
      const int64_t in = ShapeOf(members[0], arch).second;
      for (const LoraModule m : members) {
        out_total += ShapeOf(m, arch).first;
        if (!parsed.modules[l][static_cast<size_t>(m)].a.empty()) fused_rank += rank;
      }
      if (fused_rank == 0) continue;
      LoraWeights& fused = adapter->layers[l][static_cast<size_t>(g)];
      fused.rank = static_cast<int>(fused_rank);
      fused.a.reserve(static_cast<size_t>(fused_rank * in));
      fused.b.assign(static_cast<size_t>(out_total * fused_rank), 0.0f);
      int64_t row = 0, column = 0;  // Of B: the module's output rows, its rank's columns.
      for (const LoraModule m : members) {
        const ModuleWeights& w = parsed.modules[l][static_cast<size_t>(m)];
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
