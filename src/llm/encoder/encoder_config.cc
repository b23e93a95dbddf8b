#include "llm/encoder/encoder_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <optional>

#include "llm/files/gguf.h"
#include "llm/models/config_json.h"

namespace sluice::llm {

namespace {

namespace fs = std::filesystem;

Status SetPoolingMode(std::string_view mode, const std::string& path, EncoderConfig* config) {
  if (mode == "mean") {
    config->pooling = Pooling::kMean;
  } else if (mode == "cls") {
    config->pooling = Pooling::kCls;
  } else if (mode == "lasttoken") {
    config->pooling = Pooling::kLast;
  } else {
    return Status::InvalidArgument(fmt::format(
        "{}: pooling mode '{}' is not supported (Sluice pools by mean, cls or lasttoken)", path,
        mode));
  }
  return Status::Ok();
}

// sentence-transformers' modules.json: the Pooling module's mode (its config.json: "pooling_mode",
// or the older pooling_mode_*_tokens flags), whether a Normalize module follows; a module that
// changes the vectors otherwise (Dense) is refused by name.
Status ReadSentenceTransformers(const std::string& dir, EncoderConfig* config) {
  const fs::path modules_path = fs::path(dir) / "modules.json";
  std::error_code ec;
  if (!fs::exists(modules_path, ec)) return Status::Ok();
  simdjson::dom::parser parser;
  simdjson::dom::array modules;
  if (parser.load(modules_path.string()).get(modules) != simdjson::SUCCESS) {
    return Status::InvalidArgument(
        fmt::format("{}: cannot read it as a JSON list", modules_path.string()));
  }
  std::string pooling_dir;
  for (auto module : modules) {
    std::string_view type, path;
    if (module["type"].get(type) != simdjson::SUCCESS) {
      return Status::InvalidArgument(
          fmt::format("{}: a module without a type", modules_path.string()));
    }
    if (module["path"].get(path) != simdjson::SUCCESS) path = "";
    const std::string_view name = type.substr(type.rfind('.') + 1);
    if (name == "Transformer") continue;
    if (name == "Pooling") {
      pooling_dir = std::string(path);
    } else if (name == "Normalize") {
      config->normalize = true;
    } else {
      return Status::InvalidArgument(fmt::format(
          "{}: module '{}' is not supported (Sluice applies Transformer, Pooling and Normalize)",
          modules_path.string(), type));
    }
  }
  if (pooling_dir.empty()) return Status::Ok();
  const std::string pooling_path = (fs::path(dir) / pooling_dir / "config.json").string();
  simdjson::dom::parser pooling_parser;
  simdjson::dom::element pooling;
  if (pooling_parser.load(pooling_path).get(pooling) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: cannot read it as JSON", pooling_path));
  }
  std::string_view mode;
  if (pooling["pooling_mode"].get(mode) == simdjson::SUCCESS) {
    SLUICE_RETURN_IF_ERROR(SetPoolingMode(mode, pooling_path, config));
  } else {
    std::vector<std::string_view> modes;
    for (const auto& [key, name] :
         {std::pair<const char*, const char*>{"pooling_mode_cls_token", "cls"},
          {"pooling_mode_mean_tokens", "mean"},
          {"pooling_mode_max_tokens", "max"},
          {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"},
          {"pooling_mode_weightedmean_tokens", "weightedmean"},
          {"pooling_mode_lasttoken", "lasttoken"}}) {
      bool on = false;
      if (pooling[key].get(on) == simdjson::SUCCESS && on) modes.push_back(name);
    }
    if (modes.size() != 1) {
      return Status::InvalidArgument(
          fmt::format("{}: {} pooling modes are set; Sluice pools by one (mean, cls or lasttoken)",
                      pooling_path, modes.size()));
    }
    SLUICE_RETURN_IF_ERROR(SetPoolingMode(modes[0], pooling_path, config));
  }
  bool include_prompt = true;
  if (pooling["include_prompt"].get(include_prompt) == simdjson::SUCCESS && !include_prompt) {
    return Status::InvalidArgument(
        fmt::format("{}: include_prompt false (prompts left out of the pooling) is not supported",
                    pooling_path));
  }
  return Status::Ok();
}

}  // namespace

bool IsEncoderModel(const std::string& dir) {
  std::error_code ec;
  auto gguf = FindGgufFile(dir);
  if (gguf.ok() && !gguf->empty()) {
    auto file = GgufFile::Open(*gguf);
    if (!file.ok()) return false;
    auto name = (*file)->String("general.architecture", "");
    return name.ok() && (*name == "bert" || *name == "nomic-bert");
  }
  const fs::path config = fs::path(dir) / "config.json";
  if (!fs::exists(config, ec)) return false;
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  std::string_view type;
  return parser.load(config.string()).get(root) == simdjson::SUCCESS &&
         root["model_type"].get(type) == simdjson::SUCCESS &&
         (type == "bert" || type == "xlm-roberta" || type == "roberta" || type == "distilbert" ||
          type == "nomic_bert");
}

namespace {

// nomic-bert's config.json: nomic's own keys (n_embd, n_layer, rotary_emb_base, ...) or the ones
// transformers 5 writes (hidden_size, num_hidden_layers, rope_parameters, ...).
Result<EncoderConfig> ParseNomicConfig(const JsonConfig& json, const std::string& dir) {
  EncoderConfig config;
  ModelArchitecture& arch = config.arch;
  arch.name = "nomic-bert";
  config.nomic = true;
  config.position_offset = 0;
  auto integer = [&](std::initializer_list<const char*> keys, std::optional<int> fallback,
                     int* out) -> Status {
    for (const char* key : keys) {
      if (!json.Has(key)) continue;
      auto value = json.Int(key, std::nullopt);
      if (!value.ok()) return value.status();
      *out = *value;
      return Status::Ok();
    }
    if (!fallback) return json.Bad(*keys.begin(), "is missing");
    *out = *fallback;
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(integer({"vocab_size"}, std::nullopt, &arch.vocab_size));
  SLUICE_RETURN_IF_ERROR(integer({"n_embd", "hidden_size"}, std::nullopt, &arch.hidden_size));
  SLUICE_RETURN_IF_ERROR(integer({"n_layer", "num_hidden_layers"}, std::nullopt, &arch.layers));
  SLUICE_RETURN_IF_ERROR(integer({"n_head", "num_attention_heads"}, std::nullopt, &arch.heads));
  SLUICE_RETURN_IF_ERROR(
      integer({"n_inner", "intermediate_size"}, std::nullopt, &arch.intermediate_size));
  // The positions it was trained at (nomic-embed-text: 2,048 of its 8,192 rotary ones).
  SLUICE_RETURN_IF_ERROR(integer({"max_trained_positions", "max_position_embeddings"}, 2048,
                                 &arch.max_position_embeddings));
  SLUICE_RETURN_IF_ERROR(integer({"type_vocab_size"}, 2, &config.type_vocab_size));
  if (arch.heads <= 0 || arch.hidden_size % arch.heads != 0) {
    return json.Bad("n_head", "does not divide the hidden size");
  }
  arch.kv_heads = arch.heads;
  arch.head_dim = arch.hidden_size / arch.heads;
  for (const char* key : {"layer_norm_epsilon", "layer_norm_eps"}) {
    if (!json.Has(key)) continue;
    auto eps = json.Number(key, 1e-12);
    if (!eps.ok()) return eps.status();
    arch.rms_norm_eps = *eps;
    break;
  }
  if (!json.Has("layer_norm_epsilon") && !json.Has("layer_norm_eps")) arch.rms_norm_eps = 1e-12;
  if (json.Has("rotary_emb_base")) {
    auto theta = json.Number("rotary_emb_base", 1000.0);
    if (!theta.ok()) return theta.status();
    config.rope_theta = *theta;
  } else if (auto parameters = json.Object("rope_parameters")) {
    auto theta = parameters->Number("rope_theta", 1000.0);
    if (!theta.ok()) return theta.status();
    config.rope_theta = *theta;
  } else {
    auto theta = json.Number("rope_theta", 1000.0);
    if (!theta.ok()) return theta.status();
    config.rope_theta = *theta;
  }
  // What this block is not: refused by name rather than served differently.
  auto fraction = json.Number("rotary_emb_fraction", 1.0);
  if (!fraction.ok()) return fraction.status();
  if (*fraction != 1.0) return json.Bad("rotary_emb_fraction", "is not 1 (partial rotary)");
  for (const char* key : {"rotary_emb_interleaved", "prenorm", "qkv_proj_bias", "mlp_fc1_bias",
                          "mlp_fc2_bias", "causal"}) {
    auto on = json.Bool(key, false);
    if (!on.ok()) return on.status();
    if (*on) return json.Bad(key, "is true; Sluice serves nomic-bert's block without it");
  }
  if (json.Has("moe_every_n_layers")) {
    return json.Bad("moe_every_n_layers", "is set: mixture-of-experts encoders are not served");
  }
  auto act = json.String("activation_function", "swiglu");
  if (!act.ok()) return act.status();
  auto hidden_act = json.String("hidden_act", "silu");
  if (!hidden_act.ok()) return hidden_act.status();
  if (*act != "swiglu" || *hidden_act != "silu") {
    return json.Bad("activation_function", "is not swiglu");
  }
  SLUICE_RETURN_IF_ERROR(ReadSentenceTransformers(dir, &config));
  return config;
}

// config.json's integer `key` into `out` (`fallback` when absent; an error naming it without one).
Status ReadInt(const JsonConfig& json, const char* key, std::optional<int> fallback, int* out) {
  auto value = json.Int(key, fallback);
  if (!value.ok()) return value.status();
  *out = *value;
  return Status::Ok();
}

// The head config.json's architectures name: a ...ForSequenceClassification (a cross-encoder: its
// labels) or one of `bare` (embeddings); any other class is refused by name.
Status ReadHead(const simdjson::dom::element& document, const JsonConfig& json,
                std::initializer_list<std::string_view> bare, EncoderConfig* config) {
  constexpr std::string_view kClassifier = "ForSequenceClassification";
  simdjson::dom::array architectures;
  if (document["architectures"].get(architectures) != simdjson::SUCCESS) return Status::Ok();
  for (auto item : architectures) {
    std::string_view name;
    if (item.get(name) != simdjson::SUCCESS) continue;
    if (name.ends_with(kClassifier) &&
        std::find(bare.begin(), bare.end(),
                  std::string(name.substr(0, name.size() - kClassifier.size())) + "Model") !=
            bare.end()) {
      simdjson::dom::object labels;
      config->num_labels = document["id2label"].get(labels) == simdjson::SUCCESS
                               ? static_cast<int>(labels.size())
                               : 2;
      auto num_labels = json.Int("num_labels", config->num_labels);
      if (!num_labels.ok()) return num_labels.status();
      config->num_labels = *num_labels;
    } else if (std::find(bare.begin(), bare.end(), name) == bare.end()) {
      return json.Bad("architectures",
                      fmt::format("names '{}'; Sluice serves {} (embeddings) and the "
                                  "ForSequenceClassification heads of their models (rerankers)",
                                  name, fmt::join(bare, ", ")));
    }
  }
  return Status::Ok();
}

// DistilBERT's config.json (dim, n_layers, n_heads, hidden_dim, activation): BERT's block without
// token types, its LayerNorms' eps fixed at 1e-12 as transformers' DistilBertModel has it.
Result<EncoderConfig> ParseDistilBertConfig(const simdjson::dom::element& document,
                                            const JsonConfig& json, const std::string& dir) {
  EncoderConfig config;
  ModelArchitecture& arch = config.arch;
  arch.name = "bert";  // llama.cpp's converter writes DistilBERT's as BERT's.
  config.distilbert = true;
  config.type_vocab_size = 0;
  config.position_offset = 0;
  auto integer = [&](const char* key, std::optional<int> fallback, int* out) {
    return ReadInt(json, key, fallback, out);
  };
  SLUICE_RETURN_IF_ERROR(integer("vocab_size", std::nullopt, &arch.vocab_size));
  SLUICE_RETURN_IF_ERROR(integer("dim", std::nullopt, &arch.hidden_size));
  SLUICE_RETURN_IF_ERROR(integer("hidden_dim", std::nullopt, &arch.intermediate_size));
  SLUICE_RETURN_IF_ERROR(integer("n_layers", std::nullopt, &arch.layers));
  SLUICE_RETURN_IF_ERROR(integer("n_heads", std::nullopt, &arch.heads));
  SLUICE_RETURN_IF_ERROR(integer("max_position_embeddings", 512, &arch.max_position_embeddings));
  if (arch.heads <= 0 || arch.hidden_size % arch.heads != 0) {
    return json.Bad("n_heads", "does not divide dim");
  }
  arch.kv_heads = arch.heads;
  arch.head_dim = arch.hidden_size / arch.heads;
  arch.rms_norm_eps = 1e-12;
  // sinusoidal_pos_embds: the position table's rows are fixed sinusoids, stored in the checkpoint
  // as any table's, so it is read the same way.
  auto act = json.String("activation", "gelu");
  if (!act.ok()) return act.status();
  if (*act != "gelu") {
    return json.Bad("activation", fmt::format("is '{}'; Sluice serves DistilBERT with gelu", *act));
  }
  SLUICE_RETURN_IF_ERROR(
      ReadHead(document, json, {"DistilBertModel", "DistilBertForMaskedLM"}, &config));
  SLUICE_RETURN_IF_ERROR(ReadSentenceTransformers(dir, &config));
  return config;
}

}  // namespace

Result<EncoderConfig> ParseEncoderConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  simdjson::dom::parser parser;
  simdjson::dom::element document;
  if (parser.load(path).get(document) != simdjson::SUCCESS || !document.is_object()) {
    return Status::InvalidArgument(fmt::format("{}: cannot read it as a JSON object", path));
  }
  const JsonConfig json(document, path);
  std::string_view type_name;
  if (document["model_type"].get(type_name) == simdjson::SUCCESS && type_name == "nomic_bert") {
    return ParseNomicConfig(json, dir);
  }
  if (type_name == "distilbert") return ParseDistilBertConfig(document, json, dir);
  EncoderConfig config;
  ModelArchitecture& arch = config.arch;
  arch.name = "bert";  // As llama.cpp names XLM-RoBERTa's too: the same block.
  auto integer = [&](const char* key, std::optional<int> fallback, int* out) {
    return ReadInt(json, key, fallback, out);
  };
  SLUICE_RETURN_IF_ERROR(integer("vocab_size", std::nullopt, &arch.vocab_size));
  SLUICE_RETURN_IF_ERROR(integer("hidden_size", std::nullopt, &arch.hidden_size));
  SLUICE_RETURN_IF_ERROR(integer("intermediate_size", std::nullopt, &arch.intermediate_size));
  SLUICE_RETURN_IF_ERROR(integer("num_hidden_layers", std::nullopt, &arch.layers));
  SLUICE_RETURN_IF_ERROR(integer("num_attention_heads", std::nullopt, &arch.heads));
  SLUICE_RETURN_IF_ERROR(integer("max_position_embeddings", 512, &arch.max_position_embeddings));
  SLUICE_RETURN_IF_ERROR(integer("type_vocab_size", 2, &config.type_vocab_size));
  auto model_type = json.String("model_type", "bert");
  if (!model_type.ok()) return model_type.status();
  // RoBERTa's and XLM-RoBERTa's positions start after the padding index.
  const bool roberta = *model_type == "xlm-roberta" || *model_type == "roberta";
  if (roberta) {
    int pad = 1;
    SLUICE_RETURN_IF_ERROR(integer("pad_token_id", 1, &pad));
    config.position_offset = pad + 1;
    if (arch.max_position_embeddings <= config.position_offset) {
      return json.Bad("max_position_embeddings", "leaves no positions after the padding index");
    }
    arch.max_position_embeddings -= config.position_offset;
  }
  if (arch.heads <= 0 || arch.hidden_size % arch.heads != 0) {
    return json.Bad("num_attention_heads", "does not divide hidden_size");
  }
  arch.kv_heads = arch.heads;
  arch.head_dim = arch.hidden_size / arch.heads;
  auto eps = json.Number("layer_norm_eps", 1e-12);
  if (!eps.ok()) return eps.status();
  arch.rms_norm_eps = *eps;
  auto act = json.String("hidden_act", "gelu");
  if (!act.ok()) return act.status();
  if (*act == "gelu_new" || *act == "gelu_pytorch_tanh") {
    config.gelu_tanh = true;
  } else if (*act != "gelu") {
    return json.Bad("hidden_act",
                    fmt::format("is '{}'; Sluice's encoders use gelu or its tanh form", *act));
  }
  auto position_type = json.String("position_embedding_type", "absolute");
  if (!position_type.ok()) return position_type.status();
  if (*position_type != "absolute") {
    return json.Bad("position_embedding_type",
                    fmt::format("is '{}'; Sluice reads absolute positions", *position_type));
  }
  // The head: config.json's architectures name it (BertModel: none).
  SLUICE_RETURN_IF_ERROR(
      ReadHead(document, json,
               {"BertModel", "BertForMaskedLM", "BertForPreTraining", "XLMRobertaModel",
                "XLMRobertaForMaskedLM", "RobertaModel", "RobertaForMaskedLM"},
               &config));
  SLUICE_RETURN_IF_ERROR(ReadSentenceTransformers(dir, &config));
  return config;
}

Result<EncoderConfig> EncoderConfigFromGguf(const GgufFile& file) {
  EncoderConfig config;
  ModelArchitecture& arch = config.arch;
  auto architecture = file.String("general.architecture", "bert");
  if (!architecture.ok()) return architecture.status();
  arch.name = *architecture;
  const std::string prefix = *architecture + ".";
  if (*architecture == "nomic-bert") {
    config.nomic = true;
    auto theta = file.Number(prefix + "rope.freq_base", 1000.0);
    if (!theta.ok()) return theta.status();
    config.rope_theta = *theta;
  }
  auto integer = [&](const char* key, int* out) -> Status {
    auto value = file.Integer(prefix + key);
    if (!value.ok()) return value.status();
    *out = static_cast<int>(*value);
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(integer("block_count", &arch.layers));
  SLUICE_RETURN_IF_ERROR(integer("context_length", &arch.max_position_embeddings));
  SLUICE_RETURN_IF_ERROR(integer("embedding_length", &arch.hidden_size));
  SLUICE_RETURN_IF_ERROR(integer("feed_forward_length", &arch.intermediate_size));
  SLUICE_RETURN_IF_ERROR(integer("attention.head_count", &arch.heads));
  if (arch.heads <= 0 || arch.hidden_size % arch.heads != 0) {
    return Status::InvalidArgument(
        fmt::format("{}: {}attention.head_count {} does not divide the embedding length {}",
                    file.path(), prefix, arch.heads, arch.hidden_size));
  }
  arch.kv_heads = arch.heads;
  arch.head_dim = arch.hidden_size / arch.heads;
  auto eps = file.Number(prefix + "attention.layer_norm_epsilon", 1e-12);
  if (!eps.ok()) return eps.status();
  arch.rms_norm_eps = *eps;
  auto causal = file.Bool(prefix + "attention.causal", false);
  if (!causal.ok()) return causal.status();
  if (*causal) {
    return Status::InvalidArgument(
        fmt::format("{}: {}attention.causal is true; an encoder's attention is bidirectional",
                    file.path(), prefix));
  }
  const GgufTensor* embedding = file.FindTensor("token_embd.weight");
  if (embedding == nullptr || embedding->shape.size() != 2) {
    return Status::InvalidArgument(
        fmt::format("{}: tensor 'token_embd.weight' is missing", file.path()));
  }
  arch.vocab_size = static_cast<int>(embedding->shape[0]);
  const GgufTensor* types = file.FindTensor("token_types.weight");
  config.type_vocab_size = types == nullptr ? 0 : static_cast<int>(types->shape[0]);
  // llama.cpp's pooling types: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a classifier's scores).
  auto pooling = file.Integer(prefix + "pooling_type", 1);
  if (!pooling.ok()) return pooling.status();
  const GgufTensor* classifier = file.FindTensor("cls.output.weight");
  switch (*pooling) {
    case 1:
      config.pooling = Pooling::kMean;
      break;
    case 2:
    case 4:
      config.pooling = Pooling::kCls;
      break;
    case 3:
      config.pooling = Pooling::kLast;
      break;
    default:
      return Status::InvalidArgument(
          fmt::format("{}: {}pooling_type {} is not supported (1 mean, 2 cls, 3 last, 4 rank)",
                      file.path(), prefix, *pooling));
  }
  if (classifier != nullptr) {
    config.num_labels = static_cast<int>(classifier->shape[0]);
    config.pooling = Pooling::kCls;
  } else {
    config.normalize = true;  // As llama.cpp's server returns embeddings.
  }
  return config;
}

}  // namespace sluice::llm
