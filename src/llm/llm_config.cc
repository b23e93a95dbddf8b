#include "llm/llm_config.h"

#include <fmt/format.h>
#include <simdjson.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include "common/duration.h"
#include "llm/files/gguf.h"
#include "llm/models/config_json.h"
#include "llm/models/family.h"

namespace sluice::llm {
namespace {

using simdjson::dom::element;

Status Bad(const std::string& path, std::string_view key, std::string_view why) {
  return Status::InvalidArgument(fmt::format("{}: '{}' {}", path, key, why));
}

// RoPE from config.json: rope_theta, and a scaling: transformers 5's rope_parameters (for Gemma 3
// per layer type: its full_attention entry) or older checkpoints' rope_scaling; linear, llama3,
// LongRoPE (longrope / su: Phi-3's short and long factors, the attention factor given or
// sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original) or YaRN
// (factor, original context, beta_fast / beta_slow, truncate, the attention factor given or
// 0.1 ln(factor) + 1).
Status ParseRope(const JsonConfig& root, ModelArchitecture& arch) {
  auto theta = root.Number("rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  arch.rope_theta = *theta;
  std::optional<JsonConfig> rope = root.Object("rope_parameters");
  if (rope) {
    if (auto full = rope->Object("full_attention")) rope = full;
    auto value = rope->Number("rope_theta", arch.rope_theta);
    if (!value.ok()) return value.status();
    arch.rope_theta = *value;
  }
  std::optional<JsonConfig> scaling = root.Object("rope_scaling");
  if (!scaling) scaling = rope;
  if (!scaling) return Status::Ok();
  auto type = scaling->String("rope_type", "");
  if (!type.ok()) return type.status();
  if (type->empty()) {
    type = scaling->String("type", "default");
    if (!type.ok()) return type.status();
  }
  if (*type == "default") return Status::Ok();
  auto factor = scaling->Number("factor", 1.0);
  if (!factor.ok()) return factor.status();
  arch.rope_factor = *factor;
  auto original = scaling->Int("original_max_position_embeddings", std::nullopt);
  if (!original.ok()) original = root.Int("original_max_position_embeddings", std::nullopt);
  if (*type == "linear") {
    arch.rope_scaling = RopeScaling::kLinear;
  } else if (*type == "llama3") {
    arch.rope_scaling = RopeScaling::kLlama3;
    auto low = scaling->Number("low_freq_factor", 1.0);
    auto high = scaling->Number("high_freq_factor", 4.0);
    if (!low.ok()) return low.status();
    if (!high.ok()) return high.status();
    if (!original.ok()) return original.status();
    arch.rope_low_freq_factor = *low;
    arch.rope_high_freq_factor = *high;
    arch.rope_original_max_positions = *original;
    if (arch.rope_high_freq_factor <= arch.rope_low_freq_factor) {
      return root.Bad("rope_scaling", "needs high_freq_factor > low_freq_factor");
    }
  } else if (*type == "longrope" || *type == "su") {
    arch.rope_scaling = RopeScaling::kLongRope;
    if (!original.ok()) return original.status();
    if (*original <= 0) return root.Bad("original_max_position_embeddings", "must be positive");
    arch.rope_original_max_positions = *original;
    for (auto [key, out] : {std::pair{"short_factor", &arch.rope_short_factors},
                            std::pair{"long_factor", &arch.rope_long_factors}}) {
      auto values = scaling->Numbers(key);
      if (!values.ok()) return values.status();
      if (values->size() != static_cast<size_t>(arch.head_dim / 2)) {
        return root.Bad(key, fmt::format("must hold {} factors (head_dim / 2)", arch.head_dim / 2));
      }
      for (double v : *values) {
        if (!(v > 0)) return root.Bad(key, "must hold positive factors");
        out->push_back(static_cast<float>(v));
      }
    }
    const double stretch =
        static_cast<double>(arch.max_position_embeddings) / arch.rope_original_max_positions;
    auto attention = scaling->Number(
        "attention_factor",
        stretch > 1 ? std::sqrt(1 + std::log(stretch) / std::log(arch.rope_original_max_positions))
                    : 1.0);
    if (!attention.ok()) return attention.status();
    arch.rope_attention_factor = *attention;
    arch.rope_factor = 1.0;
    return Status::Ok();
  } else if (*type == "yarn") {
    arch.rope_scaling = RopeScaling::kYarn;
    if (!original.ok()) return original.status();
    if (*original <= 0) return root.Bad("original_max_position_embeddings", "must be positive");
    arch.rope_original_max_positions = *original;
    for (const char* unsupported : {"mscale", "mscale_all_dim"}) {
      if (scaling->Has(unsupported)) {
        return root.Bad(fmt::format("rope_scaling.{}", unsupported), "is not supported");
      }
    }
    auto fast = scaling->Number("beta_fast", 32.0);
    auto slow = scaling->Number("beta_slow", 1.0);
    if (!fast.ok()) return fast.status();
    if (!slow.ok()) return slow.status();
    if (!(*fast > *slow && *slow > 0)) {
      return root.Bad("rope_scaling.beta_fast", "must exceed beta_slow (> 0)");
    }
    arch.rope_yarn_beta_fast = *fast;
    arch.rope_yarn_beta_slow = *slow;
    auto truncate = scaling->Bool("truncate", true);
    if (!truncate.ok()) return truncate.status();
    arch.rope_yarn_truncate = *truncate;
    auto attention = scaling->Number(
        "attention_factor", arch.rope_factor > 1 ? 0.1 * std::log(arch.rope_factor) + 1 : 1.0);
    if (!attention.ok()) return attention.status();
    arch.rope_attention_factor = *attention;
  } else {
    return root.Bad("rope_scaling",
                    fmt::format("type '{}' is not supported (default, linear, llama3, longrope, "
                                "yarn)",
                                *type));
  }
  if (arch.rope_factor <= 0) return root.Bad("rope_scaling.factor", "must be positive");
  return Status::Ok();
}

}  // namespace

std::string_view LlmPrecisionName(LlmPrecision precision) {
  switch (precision) {
    case LlmPrecision::kFp32:
      return "fp32";
    case LlmPrecision::kBf16:
      return "bf16";
    case LlmPrecision::kInt8:
      return "int8";
    case LlmPrecision::kInt4:
      return "int4";
  }
  return "?";
}

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kFp32:
      return "fp32";
    case KvCacheDtype::kBf16:
      return "bf16";
    case KvCacheDtype::kQ8_0:
      return "q8_0";
  }
  return "?";
}

std::string_view PoolingName(Pooling pooling) {
  switch (pooling) {
    case Pooling::kLast:
      return "last";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kNone:
      break;
  }
  return "none";
}

bool ParseKvCacheDtype(std::string_view name, KvCacheDtype* dtype) {
  for (KvCacheDtype d :
       {KvCacheDtype::kAuto, KvCacheDtype::kFp32, KvCacheDtype::kBf16, KvCacheDtype::kQ8_0}) {
    if (name == KvCacheDtypeName(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

KvCacheDtype ResolvedKvCacheDtype(const LlmServeConfig& serve) {
  if (serve.kv_cache_dtype != KvCacheDtype::kAuto) return serve.kv_cache_dtype;
  return serve.precision == LlmPrecision::kFp32 ? KvCacheDtype::kFp32 : KvCacheDtype::kBf16;
}

int64_t KvBlockBytes(const ModelArchitecture& arch, const LlmServeConfig& serve) {
  const KvCacheDtype dtype = ResolvedKvCacheDtype(serve);
  // A position's row of one head: its values, and a q8_0 cache's scale per 32 of them.
  const int64_t row = dtype == KvCacheDtype::kFp32   ? arch.head_dim * 4
                      : dtype == KvCacheDtype::kBf16 ? arch.head_dim * 2
                                                     : arch.head_dim + arch.head_dim / 32 * 4;
  return int64_t{arch.layers} * 2 * arch.kv_heads * serve.kv_block_size * row;
}

Result<ModelArchitecture> ParseArchitecture(const std::string& path) {
  simdjson::dom::parser parser;
  element document;
  if (parser.load(path).get(document) != simdjson::SUCCESS || !document.is_object()) {
    return Status::InvalidArgument(fmt::format("{}: cannot read it as a JSON object", path));
  }
  const JsonConfig top(document, path);
  auto model_type = top.String("model_type", "llama");
  if (!model_type.ok()) return model_type.status();
  static constexpr std::string_view kEncoders[] = {
      "bert",       "roberta", "xlm-roberta", "distilbert", "nomic_bert",
      "modernbert", "mpnet",   "electra",     "deberta-v2", "gte"};
  if (std::find(std::begin(kEncoders), std::end(kEncoders), *model_type) != std::end(kEncoders)) {
    return Bad(path, "model_type",
               fmt::format("is '{}', an encoder-only model of a type Sluice does not serve "
                           "(of encoders it serves 'bert', 'roberta', 'xlm-roberta', "
                           "'distilbert' and 'nomic_bert': embedding models and rerankers)",
                           *model_type));
  }
  const Family* family = FamilyByModelType(*model_type);
  if (family == nullptr) {
    return Bad(path, "model_type",
               fmt::format("is '{}'; Sluice serves {}", *model_type, ModelTypeNames()));
  }
  // A multimodal checkpoint's decoder settings are in its text config.
  JsonConfig root = top;
  if (!family->hf_text_config.empty()) {
    if (auto text = top.Object(std::string(family->hf_text_config).c_str())) root = *text;
  }
  ModelArchitecture arch;
  arch.name = std::string(family->name);
  struct IntKey {
    const char* key;
    int* field;
    std::optional<int> fallback;
  };
  for (const IntKey& item : std::initializer_list<IntKey>{
           {"vocab_size", &arch.vocab_size, std::nullopt},
           {"hidden_size", &arch.hidden_size, std::nullopt},
           {"intermediate_size", &arch.intermediate_size, std::nullopt},
           {"num_hidden_layers", &arch.layers, std::nullopt},
           {"num_attention_heads", &arch.heads, std::nullopt},
           {"max_position_embeddings", &arch.max_position_embeddings, 2048}}) {
    auto value = root.Int(item.key, item.fallback);
    if (!value.ok()) return value.status();
    *item.field = *value;
  }
  for (const IntKey& item :
       std::initializer_list<IntKey>{{"vocab_size", &arch.vocab_size, std::nullopt},
                                     {"hidden_size", &arch.hidden_size, std::nullopt},
                                     {"intermediate_size", &arch.intermediate_size, std::nullopt},
                                     {"num_hidden_layers", &arch.layers, std::nullopt},
                                     {"num_attention_heads", &arch.heads, std::nullopt}}) {
    if (*item.field == 0) return Bad(path, item.key, "must be positive");
  }
  auto kv = root.Int("num_key_value_heads", arch.heads);
  if (!kv.ok()) return kv.status();
  arch.kv_heads = *kv;
  if (arch.heads == 0 || arch.kv_heads == 0 || arch.heads % arch.kv_heads != 0) {
    return Bad(path, "num_key_value_heads", "must divide num_attention_heads");
  }
  auto head_dim = root.Int("head_dim", arch.hidden_size / arch.heads);
  if (!head_dim.ok()) return head_dim.status();
  arch.head_dim = *head_dim;
  if (arch.head_dim == 0 || arch.head_dim % 2 != 0) return Bad(path, "head_dim", "must be even");
  auto eps = root.Number("rms_norm_eps", 1e-5);
  if (!eps.ok()) return eps.status();
  arch.rms_norm_eps = *eps;
  SLUICE_RETURN_IF_ERROR(ParseRope(root, arch));
  for (const JsonConfig* where : {&top, static_cast<const JsonConfig*>(&root)}) {
    auto tied = where->Bool("tie_word_embeddings", arch.tie_word_embeddings);
    if (!tied.ok()) return tied.status();
    arch.tie_word_embeddings = *tied;
  }
  SLUICE_RETURN_IF_ERROR(family->from_config(root, &arch));
  // The special ids: the text config's, else the checkpoint's.
  for (const JsonConfig* where : {&top, static_cast<const JsonConfig*>(&root)}) {
    int64_t id = 0;
    if (where->object()["bos_token_id"].get(id) == simdjson::SUCCESS) {
      arch.bos_token_id = static_cast<int>(id);
    }
    simdjson::dom::array eos_list;
    if (where->object()["eos_token_id"].get(id) == simdjson::SUCCESS) {
      arch.eos_token_ids = {static_cast<int>(id)};
    } else if (where->object()["eos_token_id"].get(eos_list) == simdjson::SUCCESS) {
      arch.eos_token_ids.clear();
      for (auto item : eos_list) {
        if (item.get(id) == simdjson::SUCCESS) arch.eos_token_ids.push_back(static_cast<int>(id));
      }
    }
  }
  for (int eos : arch.eos_token_ids) {
    if (eos < 0 || eos >= arch.vocab_size) return Bad(path, "eos_token_id", "is outside the vocab");
  }
  return arch;
}

Result<LlmServeConfig> ParseServeConfig(const std::string& path,
                                        const ModelArchitecture& architecture) {
  LlmServeConfig config;
  config.context_length = std::min(config.context_length, architecture.max_position_embeddings);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return config;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, e.what()));
  }
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    if (key != "llm" && key != "instance_group") {
      return Bad(path, key,
                 "is not a language-model setting (expected 'llm:' or 'instance_group:')");
    }
  }
  if (const YAML::Node group = root["instance_group"]) {
    if (!group.IsSequence() || group.size() != 1 || !group[0].IsMap()) {
      return Bad(path, "instance_group", "must be a list of one group {kind, gpus}");
    }
    std::string kind = "KIND_GPU";
    std::vector<int> gpus;
    try {
      for (const auto& item : group[0]) {
        const std::string key = item.first.as<std::string>();
        if (key == "kind") {
          kind = item.second.as<std::string>();
        } else if (key == "gpus") {
          gpus = item.second.as<std::vector<int>>();
        } else {
          return Bad(path, "instance_group[0]." + key,
                     "is not a language model's key (kind, gpus: a language model runs one "
                     "engine on one device)");
        }
      }
    } catch (const YAML::Exception& e) {
      return Bad(path, "instance_group[0]", e.what());
    }
    if (kind == "KIND_GPU" || kind == "gpu") {
      if (gpus.size() > 1 || (gpus.size() == 1 && gpus[0] < 0)) {
        return Bad(path, "instance_group[0].gpus",
                   "must name one GPU ordinal: a language model runs on one GPU");
      }
      config.device = fmt::format("cuda:{}", gpus.empty() ? 0 : gpus[0]);
    } else if (kind == "KIND_CPU" || kind == "cpu") {
      if (!gpus.empty()) return Bad(path, "instance_group[0].gpus", "applies to KIND_GPU only");
    } else {
      return Bad(path, "instance_group[0].kind",
                 fmt::format("must be KIND_GPU or KIND_CPU (got '{}')", kind));
    }
  }
  const YAML::Node llm = root["llm"];
  if (!llm) return config;
  if (!llm.IsMap()) return Bad(path, "llm", "must be a map");
  static const std::set<std::string> kKeys = {"precision",         "slots",
                                              "context_length",    "max_step_tokens",
                                              "prefill_chunk",     "speculative_tokens",
                                              "speculative_ngram", "threads",
                                              "max_waiting",       "default_max_tokens",
                                              "model_file",        "prefix_caching",
                                              "kv_block_size",     "kv_cache_bytes",
                                              "kv_cache_dtype",    "weights_cache",
                                              "embedding",         "lora",
                                              "kv_cache_disk",     "kv_cache_disk_bytes",
                                              "keep_alive",        "cuda_graphs"};
  try {
    for (const auto& item : llm) {
      const std::string key = item.first.as<std::string>();
      if (!kKeys.count(key)) return Bad(path, "llm." + key, "is not a known key");
    }
    if (llm["precision"]) {
      const std::string value = llm["precision"].as<std::string>();
      if (value == "fp32") {
        config.precision = LlmPrecision::kFp32;
      } else if (value == "bf16") {
        config.precision = LlmPrecision::kBf16;
      } else if (value == "int8") {
        config.precision = LlmPrecision::kInt8;
      } else if (value == "int4") {
        config.precision = LlmPrecision::kInt4;
      } else {
        return Bad(path, "llm.precision",
                   fmt::format("'{}' is not fp32, bf16, int8 or int4", value));
      }
    }
    if (llm["model_file"]) config.model_file = llm["model_file"].as<std::string>();
    if (llm["weights_cache"]) {
      config.weights_cache = llm["weights_cache"].as<std::string>();
      if (config.weights_cache.empty()) {
        return Bad(path, "llm.weights_cache", "must name a folder");
      }
    }
    if (llm["kv_cache_disk"]) {
      config.kv_cache_disk = llm["kv_cache_disk"].as<std::string>();
      if (config.kv_cache_disk.empty()) {
        return Bad(path, "llm.kv_cache_disk", "must name a folder");
      }
    }
    if (llm["kv_cache_disk_bytes"]) {
      config.kv_cache_disk_bytes = llm["kv_cache_disk_bytes"].as<int64_t>();
      if (config.kv_cache_disk_bytes <= 0) {
        return Bad(path, "llm.kv_cache_disk_bytes", "must be > 0");
      }
    }
    if (llm["keep_alive"]) {
      auto keep_alive = ParseDuration(llm["keep_alive"].as<std::string>());
      if (!keep_alive.ok()) return Bad(path, "llm.keep_alive", keep_alive.status().message());
      config.keep_alive = *keep_alive;
    }
    if (llm["kv_cache_dtype"]) {
      const std::string value = llm["kv_cache_dtype"].as<std::string>();
      if (!ParseKvCacheDtype(value, &config.kv_cache_dtype)) {
        return Bad(path, "llm.kv_cache_dtype",
                   fmt::format("'{}' is not auto, fp32, bf16 or q8_0", value));
      }
    }
    if (const YAML::Node lora = llm["lora"]) {
      if (!lora.IsMap()) {
        return Bad(path, "llm.lora",
                   "must be a map: {max_loras, max_lora_rank, runtime_loading, adapters}");
      }
      for (const auto& item : lora) {
        const std::string key = item.first.as<std::string>();
        if (key != "max_loras" && key != "max_lora_rank" && key != "runtime_loading" &&
            key != "adapters") {
          return Bad(path, "llm.lora." + key,
                     "is not a known key (max_loras, max_lora_rank, runtime_loading, adapters)");
        }
      }
      config.max_loras = lora["max_loras"] ? lora["max_loras"].as<int>() : 4;
      if (config.max_loras < 1 || config.max_loras > 1024) {
        return Bad(path, "llm.lora.max_loras", "must be in [1, 1024]");
      }
      if (lora["max_lora_rank"]) config.max_lora_rank = lora["max_lora_rank"].as<int>();
      if (config.max_lora_rank < 1 || config.max_lora_rank > 1024) {
        return Bad(path, "llm.lora.max_lora_rank", "must be in [1, 1024]");
      }
      if (lora["runtime_loading"] &&
          !YAML::convert<bool>::decode(lora["runtime_loading"], config.lora_runtime_loading)) {
        return Bad(path, "llm.lora.runtime_loading", "must be true or false");
      }
      if (const YAML::Node adapters = lora["adapters"]) {
        if (!adapters.IsMap()) return Bad(path, "llm.lora.adapters", "must map names to folders");
        for (const auto& item : adapters) {
          config.lora_adapters[item.first.as<std::string>()] = item.second.as<std::string>();
        }
        if (static_cast<int>(config.lora_adapters.size()) > config.max_loras) {
          return Bad(path, "llm.lora.adapters", "lists more adapters than max_loras");
        }
      }
    }
    if (const YAML::Node embedding = llm["embedding"]) {
      if (!embedding.IsMap()) {
        return Bad(path, "llm.embedding", "must be a map: {pooling: last|mean|cls, normalize}");
      }
      for (const auto& item : embedding) {
        const std::string key = item.first.as<std::string>();
        if (key != "pooling" && key != "normalize") {
          return Bad(path, "llm.embedding." + key, "is not a known key (pooling, normalize)");
        }
      }
      const std::string pooling =
          embedding["pooling"] ? embedding["pooling"].as<std::string>() : "";
      if (pooling == "last") {
        config.pooling = Pooling::kLast;
      } else if (pooling == "mean") {
        config.pooling = Pooling::kMean;
      } else if (pooling == "cls") {
        config.pooling = Pooling::kCls;
      } else {
        return Bad(path, "llm.embedding.pooling", "must be last, mean or cls");
      }
      if (embedding["normalize"] &&
          !YAML::convert<bool>::decode(embedding["normalize"], config.normalize)) {
        return Bad(path, "llm.embedding.normalize", "must be true or false");
      }
    }
    if (llm["cuda_graphs"]) {
      bool on = true;
      if (!YAML::convert<bool>::decode(llm["cuda_graphs"], on)) {
        return Bad(path, "llm.cuda_graphs", "must be true or false");
      }
      if (on && config.device == "cpu") {
        return Bad(path, "llm.cuda_graphs",
                   "is for a GPU model (instance_group: [{kind: KIND_GPU}]); the CPU decoder "
                   "captures no graphs");
      }
      config.cuda_graphs = on;
    }
    if (llm["prefix_caching"]) {
      bool on = true;
      if (!YAML::convert<bool>::decode(llm["prefix_caching"], on)) {
        return Bad(path, "llm.prefix_caching", "must be true or false");
      }
      config.prefix_caching = on;
    }
    if (llm["kv_cache_bytes"]) {
      const int64_t bytes = llm["kv_cache_bytes"].as<int64_t>();
      if (bytes < 0) return Bad(path, "llm.kv_cache_bytes", "must be >= 0 (0: slots x context)");
      config.kv_cache_bytes = bytes;
    }
    struct IntKey {
      const char* key;
      int* field;
      int min;
      int max;
    };
    for (const IntKey& item : std::initializer_list<IntKey>{
             {"slots", &config.slots, 1, 1024},
             {"kv_block_size", &config.kv_block_size, 1, 1024},
             {"context_length", &config.context_length, 2, architecture.max_position_embeddings},
             {"max_step_tokens", &config.max_step_tokens, 1, 8192},
             {"prefill_chunk", &config.prefill_chunk, 1, 8192},
             {"speculative_tokens", &config.speculative_tokens, 0, 64},
             {"speculative_ngram", &config.speculative_ngram, 1, 8},
             {"threads", &config.threads, 0, 1024},
             {"max_waiting", &config.max_waiting, 0, 1 << 20},
             {"default_max_tokens", &config.default_max_tokens, 1, 1 << 20}}) {
      if (!llm[item.key]) continue;
      const int value = llm[item.key].as<int>();
      if (value < item.min || value > item.max) {
        return Bad(path, std::string("llm.") + item.key,
                   fmt::format("is {}; it must lie in [{}, {}]", value, item.min, item.max));
      }
      *item.field = value;
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, e.what()));
  }
  return config;
}

namespace {

// The GGUF files of `dir`, a split model's parts as one (its first part's name).
std::vector<std::string> GgufFilesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".gguf" && entry.is_regular_file(ec)) {
      const std::string name = entry.path().filename().string();
      const auto split = ParseGgufSplitName(name);
      if (split && split->part != 1) continue;
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

bool IsLanguageModelDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return LooksLikeGguf(dir);
  if (fs::exists(fs::path(dir) / "config.json", ec) &&
      (fs::exists(fs::path(dir) / "model.safetensors", ec) ||
       fs::exists(fs::path(dir) / "model.safetensors.index.json", ec))) {
    return true;
  }
  return !GgufFilesIn(dir).empty();
}

Result<std::string> FindGgufFile(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return dir;  // A GGUF file served on its own.
  const fs::path config = fs::path(dir) / "config.yaml";
  if (fs::exists(config, ec)) {
    try {
      const YAML::Node root = YAML::LoadFile(config.string());
      if (root["llm"] && root["llm"]["model_file"]) {
        const fs::path file = fs::path(dir) / root["llm"]["model_file"].as<std::string>();
        if (!fs::is_regular_file(file, ec)) {
          return Bad(config.string(), "llm.model_file",
                     fmt::format("names {}, which is not a file", file.string()));
        }
        return file.string();
      }
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument(fmt::format("{}: {}", config.string(), e.what()));
    }
  }
  const std::vector<std::string> files = GgufFilesIn(dir);
  if (files.empty()) return std::string();
  if (files.size() > 1) {
    return Status::InvalidArgument(
        fmt::format("{}: holds {} GGUF files ({}); name one with llm.model_file in config.yaml",
                    dir, files.size(), fmt::join(files, ", ")));
  }
  return (fs::path(dir) / files.front()).string();
}

}  // namespace sluice::llm
