#include "llm/load_llm.h"

#include <fmt/format.h>

#include <filesystem>

#include "llm/files/gguf.h"

namespace sluice::llm {

namespace {

// The architecture from the directory's GGUF file or its config.json.
Result<ModelArchitecture> Architecture(const std::string& dir) {
  auto gguf = FindGgufFile(dir);
  if (!gguf.ok()) return gguf.status();
  if (gguf->empty())
    return ParseArchitecture((std::filesystem::path(dir) / "config.json").string());
  auto file = GgufFile::Open(*gguf);
  if (!file.ok()) return file.status();
  return ArchitectureFromGguf(**file);
}

// config.yaml's serving settings with the overrides applied.
Result<LlmServeConfig> ServeConfig(const std::string& dir, const ModelArchitecture& arch,
                                   const LlmLoadOverrides& overrides) {
  auto serve = ParseServeConfig((std::filesystem::path(dir) / "config.yaml").string(), arch);
  if (!serve.ok()) return serve.status();
  if (!overrides.precision.empty()) {
    if (overrides.precision == "fp32") {
      serve->precision = LlmPrecision::kFp32;
    } else if (overrides.precision == "bf16") {
      serve->precision = LlmPrecision::kBf16;
    } else if (overrides.precision == "int8") {
      serve->precision = LlmPrecision::kInt8;
    } else {
      return Status::InvalidArgument(
          fmt::format("precision '{}' is not fp32, bf16 or int8", overrides.precision));
    }
  }
  if (overrides.slots > 0) serve->slots = overrides.slots;
  if (overrides.context_length > 0) {
    if (overrides.context_length > arch.max_position_embeddings) {
      return Status::InvalidArgument(
          fmt::format("context length {} exceeds the model's max_position_embeddings {}",
                      overrides.context_length, arch.max_position_embeddings));
    }
    serve->context_length = overrides.context_length;
  }
  if (overrides.kv_cache_bytes >= 0) serve->kv_cache_bytes = overrides.kv_cache_bytes;
  if (overrides.threads >= 0) serve->threads = overrides.threads;
  if (overrides.max_step_tokens > 0) serve->max_step_tokens = overrides.max_step_tokens;
  if (overrides.speculative_tokens >= 0) serve->speculative_tokens = overrides.speculative_tokens;
  if (!overrides.prefix_caching.empty()) serve->prefix_caching = overrides.prefix_caching == "on";
  if (!overrides.weights_cache.empty()) serve->weights_cache = overrides.weights_cache;
  if (!overrides.kv_cache_dtype.empty() &&
      !ParseKvCacheDtype(overrides.kv_cache_dtype, &serve->kv_cache_dtype)) {
    return Status::InvalidArgument(fmt::format(
        "kv_cache_dtype '{}' is not auto, fp32, bf16 or q8_0", overrides.kv_cache_dtype));
  }
  return serve;
}

}  // namespace

Result<std::unique_ptr<StepModel>> LoadStepModel(const std::string& dir,
                                                 const LlmLoadOverrides& overrides) {
  auto arch = Architecture(dir);
  if (!arch.ok()) return arch.status();
  auto serve = ServeConfig(dir, *arch, overrides);
  if (!serve.ok()) return serve.status();
  return LoadLlamaModel(ModelLoadOptions{dir, *serve});
}

Result<std::shared_ptr<LlmEngine>> LoadLlmEngine(const std::string& dir,
                                                 const LlmLoadOverrides& overrides) {
  namespace fs = std::filesystem;
  auto arch = Architecture(dir);
  if (!arch.ok()) return arch.status();
  auto serve = ServeConfig(dir, *arch, overrides);
  if (!serve.ok()) return serve.status();
  auto gguf = FindGgufFile(dir);
  if (!gguf.ok()) return gguf.status();
  Result<std::unique_ptr<Tokenizer>> tokenizer = Status::Internal("no tokenizer");
  if (gguf->empty()) {
    tokenizer = Tokenizer::Load(dir);
  } else {
    auto file = GgufFile::Open(*gguf);
    if (!file.ok()) return file.status();
    tokenizer = Tokenizer::FromGguf(**file);
  }
  if (!tokenizer.ok()) return tokenizer.status();
  std::unique_ptr<ChatTemplate> chat_template;
  if (!(*tokenizer)->chat_template().empty()) {
    auto parsed = ChatTemplate::Parse((*tokenizer)->chat_template());
    if (!parsed.ok()) {
      return Status::InvalidArgument(fmt::format("{}: {}", dir, parsed.status().message()));
    }
    chat_template = std::move(*parsed);
  }
  if ((*tokenizer)->vocab_size() > arch->vocab_size) {
    return Status::InvalidArgument(fmt::format("{}: the tokenizer has {} tokens, the model {}", dir,
                                               (*tokenizer)->vocab_size(), arch->vocab_size));
  }
  auto model = LoadLlamaModel(ModelLoadOptions{dir, *serve});
  if (!model.ok()) return model.status();
  auto engine = std::make_shared<LlmEngine>(std::move(*model), std::move(*tokenizer),
                                            std::move(chat_template), *serve);
  // The adapters config.yaml lists, their folders relative to the model's.
  for (const auto& [name, folder] : serve->lora_adapters) {
    const std::filesystem::path path = std::filesystem::path(dir) / folder;
    if (Status loaded = engine->LoadAdapter(name, path.string()); !loaded.ok()) {
      return Status::InvalidArgument(
          fmt::format("{}: LoRA adapter '{}': {}", dir, name, loaded.message()));
    }
  }
  return engine;
}

}  // namespace sluice::llm
