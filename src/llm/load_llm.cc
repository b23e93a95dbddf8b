#include "llm/load_llm.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "llm/encoder/bert_model.h"
#include "llm/encoder/encoder_config.h"
#include "llm/files/gguf.h"
#include "llm/llama/device_step.h"

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
    } else if (overrides.precision == "int4") {
      serve->precision = LlmPrecision::kInt4;
    } else {
      return Status::InvalidArgument(
          fmt::format("precision '{}' is not fp32, bf16, int8 or int4", overrides.precision));
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
  if (!overrides.kv_cache_disk.empty()) serve->kv_cache_disk = overrides.kv_cache_disk;
  if (overrides.kv_cache_disk_bytes > 0) serve->kv_cache_disk_bytes = overrides.kv_cache_disk_bytes;
  if (!overrides.kv_cache_dtype.empty() &&
      !ParseKvCacheDtype(overrides.kv_cache_dtype, &serve->kv_cache_dtype)) {
    return Status::InvalidArgument(fmt::format(
        "kv_cache_dtype '{}' is not auto, fp32, bf16 or q8_0", overrides.kv_cache_dtype));
  }
  if (!overrides.device.empty()) {
    const std::string& d = overrides.device;
    const bool ordinal = d.size() > 5 && d.rfind("cuda:", 0) == 0 &&
                         d.find_first_not_of("0123456789", 5) == std::string::npos;
    if (d != "cpu" && d != "cuda" && !ordinal) {
      return Status::InvalidArgument(fmt::format("device '{}' is not cpu, cuda or cuda:N", d));
    }
    serve->device = d == "cuda" ? "cuda:0" : d;
    serve->device_key = "--llm-device";
  }
  if (serve->precision == LlmPrecision::kInt4 && serve->device == "cpu") {
    return Status::InvalidArgument(fmt::format(
        "{}: precision int4 is the GPU executor's (instance_group: [{{kind: KIND_GPU}}]); on the "
        "CPU serve a Q4_K_M or Q4_0 GGUF file (kept quantised), or precision int8",
        dir));
  }
  return serve;
}

// An encoder's configuration from its GGUF file or its folder.
Result<EncoderConfig> EncoderConfigOf(const std::string& dir) {
  auto gguf = FindGgufFile(dir);
  if (!gguf.ok()) return gguf.status();
  if (gguf->empty()) return ParseEncoderConfig(dir);
  auto file = GgufFile::Open(*gguf);
  if (!file.ok()) return file.status();
  return EncoderConfigFromGguf(**file);
}

// An encoder's serving settings: config.yaml's, its pooling (unless config.yaml's llm.embedding
// says) from its files, a cross-encoder's scores unnormalised from its first token, and a step
// budget that takes a whole sequence of its context.
Result<LlmServeConfig> EncoderServeConfig(const std::string& dir, const EncoderConfig& config,
                                          const LlmLoadOverrides& overrides) {
  auto serve = ServeConfig(dir, config.arch, overrides);
  if (!serve.ok()) return serve.status();
  if (serve->precision == LlmPrecision::kInt4) {
    return Status::InvalidArgument(fmt::format(
        "{}: precision int4 is the GPU decoder's; an encoder takes fp32, bf16 or int8", dir));
  }
  if (config.num_labels > 0) {
    serve->pooling = Pooling::kCls;
    serve->normalize = false;
  } else if (serve->pooling == Pooling::kNone) {
    serve->pooling = config.pooling;
    serve->normalize = config.normalize;
  }
  serve->prefill_chunk = std::max(serve->prefill_chunk, serve->context_length);
  serve->max_step_tokens = std::max(serve->max_step_tokens, serve->context_length);
  serve->prefix_caching = false;
  serve->speculative_tokens = 0;
  return serve;
}

// The directory's weight files: its GGUF file, or model.safetensors, or a sharded checkpoint's
// model-00001-of-0000N.safetensors files (sorted).
Result<std::vector<std::string>> WeightFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  auto gguf = FindGgufFile(dir);
  if (!gguf.ok()) return gguf.status();
  if (!gguf->empty()) return std::vector<std::string>{*gguf};
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.starts_with("model-") && name.find("-of-") != std::string::npos;
    if (entry.path().extension() == ".safetensors" && (name == "model.safetensors" || shard)) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

namespace {

// Leaked: loads may run while the process exits.
DeviceRuntimeLoader& RuntimeLoader() {
  static DeviceRuntimeLoader* loader = new DeviceRuntimeLoader();
  return *loader;
}

DeviceGraphsMaker& GraphsMaker() {
  static DeviceGraphsMaker* maker = new DeviceGraphsMaker();
  return *maker;
}

// The decoder where `options.serve.device` says: the CPU decoder, or the device executor on a GPU
// (its weights in the precision's dtype; int8 or int4: quantised rows beside a bf16 cache).
Result<std::unique_ptr<StepModel>> LoadDecoder(const ModelLoadOptions& options) {
  const std::string& device = options.serve.device;
  if (device == "cpu") return LoadLlamaModel(options);
  const std::string& key = options.serve.device_key;
  if (!RuntimeLoader()) {
    return Status::InvalidArgument(fmt::format(
        "{}: {}: asks for a GPU, and this program has no GPU runtime", options.dir, key));
  }
  Status runtime = RuntimeLoader()(device);
  if (!runtime.ok()) {
    return Status::InvalidArgument(
        fmt::format("{}: {}: asks for a GPU, and {}", options.dir, key, runtime.message()));
  }
  const c10::Device where(device);
  const size_t visible = at::getNumGPUs();
  if (where.index() >= static_cast<int>(visible)) {
    return Status::InvalidArgument(
        visible == 0 ? fmt::format("{}: {}: asks for a GPU, and CUDA finds none on this machine",
                                   options.dir, key)
                     : fmt::format("{}: {}: GPU {} does not exist (CUDA sees {})", options.dir, key,
                                   where.index(), visible));
  }
  const LlmPrecision precision = options.serve.precision;
  llama::DeviceOptions on{.device = where,
                          .dtype = precision == LlmPrecision::kFp32 ? at::kFloat : at::kBFloat16,
                          .int8_weights = precision == LlmPrecision::kInt8,
                          .int4_weights = precision == LlmPrecision::kInt4};
  if (options.serve.cuda_graphs && where.is_cuda()) {
    Result<std::shared_ptr<llama::StepGraphs>> graphs =
        Status::Unavailable("this program makes no CUDA graphs");
    if (GraphsMaker()) graphs = GraphsMaker()(device);
    if (graphs.ok()) {
      on.graphs = *graphs;
    } else {
      on.graphs_off = graphs.status().message();
    }
  }
  return llama::DeviceStepModel::Load(options, on);
}

}  // namespace

void SetDeviceRuntimeLoader(DeviceRuntimeLoader loader) { RuntimeLoader() = std::move(loader); }
void SetDeviceGraphsMaker(DeviceGraphsMaker maker) { GraphsMaker() = std::move(maker); }

Result<std::unique_ptr<StepModel>> LoadStepModel(const std::string& dir,
                                                 const LlmLoadOverrides& overrides) {
  if (IsEncoderModel(dir)) {
    auto config = EncoderConfigOf(dir);
    if (!config.ok()) return config.status();
    auto serve = EncoderServeConfig(dir, *config, overrides);
    if (!serve.ok()) return serve.status();
    return encoder::BertModel::Load(ModelLoadOptions{dir, *serve}, *config);
  }
  auto arch = Architecture(dir);
  if (!arch.ok()) return arch.status();
  auto serve = ServeConfig(dir, *arch, overrides);
  if (!serve.ok()) return serve.status();
  return LoadDecoder(ModelLoadOptions{dir, *serve});
}

Result<LlmMemoryEstimate> EstimateLlmMemory(const std::string& dir,
                                            const LlmLoadOverrides& overrides) {
  namespace fs = std::filesystem;
  LlmMemoryEstimate estimate;
  auto files = WeightFiles(dir);
  if (!files.ok()) return files.status();
  std::error_code ec;
  for (const std::string& file : *files) {
    estimate.weights += static_cast<int64_t>(fs::file_size(file, ec));
  }
  if (IsEncoderModel(dir)) return estimate;  // No KV cache.
  auto arch = Architecture(dir);
  if (!arch.ok()) return arch.status();
  auto serve = ServeConfig(dir, *arch, overrides);
  if (!serve.ok()) return serve.status();
  if (serve->kv_cache_bytes > 0) {
    estimate.kv_cache = serve->kv_cache_bytes;
    return estimate;
  }
  // As LoadLlamaModel sizes it: slots x context, in blocks.
  const int64_t block = serve->kv_block_size;
  const int64_t blocks = serve->slots * ((serve->context_length + block - 1) / block);
  estimate.kv_cache = blocks * KvBlockBytes(*arch, *serve);
  return estimate;
}

Result<std::shared_ptr<LlmEngine>> LoadLlmEngine(const std::string& dir,
                                                 const LlmLoadOverrides& overrides) {
  namespace fs = std::filesystem;
  const bool is_encoder = IsEncoderModel(dir);
  Result<EncoderConfig> encoder_config = EncoderConfig{};
  if (is_encoder) {
    encoder_config = EncoderConfigOf(dir);
    if (!encoder_config.ok()) return encoder_config.status();
  }
  auto arch = is_encoder ? Result<ModelArchitecture>(encoder_config->arch) : Architecture(dir);
  if (!arch.ok()) return arch.status();
  auto serve = is_encoder ? EncoderServeConfig(dir, *encoder_config, overrides)
                          : ServeConfig(dir, *arch, overrides);
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
  Result<std::unique_ptr<StepModel>> model = Status::Internal("no model");
  if (is_encoder) {
    // A cross-encoder's pair: the second text's tokens (type 1) follow the template's separator.
    const PairTemplate& pair = (*tokenizer)->pair_template();
    if (encoder_config->num_labels > 0 && !pair.middle.empty()) {
      encoder_config->separator_id = pair.middle.front();
    }
    model = encoder::BertModel::Load(ModelLoadOptions{dir, *serve}, *encoder_config);
  } else {
    model = LoadDecoder(ModelLoadOptions{dir, *serve});
  }
  if (!model.ok()) return model.status();
  std::shared_ptr<KvDiskStore> disk;
  if (!serve->kv_cache_disk.empty() && !(*model)->kv_layout().empty()) {
    // The files' bytes hold for these weights, this precision and this cache layout only.
    auto files = WeightFiles(dir);
    if (!files.ok()) return files.status();
    auto opened = KvDiskStore::Open(
        serve->kv_cache_disk,
        fmt::format("{} weights {}", (*model)->kv_layout(), KvDiskStore::FilesDigest(*files)),
        serve->kv_cache_disk_bytes);
    if (!opened.ok()) return opened.status();
    disk = std::move(*opened);
  }
  auto engine = std::make_shared<LlmEngine>(std::move(*model), std::move(*tokenizer),
                                            std::move(chat_template), *serve);
  if (disk != nullptr) engine->SetKvDisk(std::move(disk));
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
