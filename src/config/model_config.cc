// config.yaml: parse -> normalise -> validate.
#include "config/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "config/yaml_reader.h"

namespace sluice {
namespace {

using config_internal::ConfigError;
using config_internal::Join;
using config_internal::MapReader;
using config_internal::ReadList;

std::vector<TensorSpec> ReadTensorSpecs(const YAML::Node& n, const std::string& path) {
  std::vector<TensorSpec> specs;
  if (!n.IsDefined() || n.IsNull()) return specs;
  if (!n.IsSequence()) throw ConfigError{path, "must be a list of {name, datatype, shape}"};
  for (size_t i = 0; i < n.size(); ++i) {
    std::string item_path = fmt::format("{}[{}]", path, i);
    MapReader r(n[i], item_path);
    TensorSpec spec;
    r.Read("name", spec.name);
    std::string datatype = "FP32";
    r.Read("datatype", datatype);
    auto parsed = ParseDataType(datatype);
    if (!parsed) {
      throw ConfigError{Join(item_path, "datatype"),
                        fmt::format("unsupported datatype '{}' (use BOOL, UINT8, INT8, INT16, "
                                    "INT32, INT64, FP16, BF16, FP32 or FP64)",
                                    datatype)};
    }
    spec.datatype = *parsed;
    YAML::Node shape = r.Get("shape");
    if (!shape.IsDefined()) throw ConfigError{Join(item_path, "shape"), "is required"};
    spec.shape = ReadList<int64_t>(shape, Join(item_path, "shape"));
    r.RejectUnknownKeys();
    specs.push_back(std::move(spec));
  }
  return specs;
}

// Triton's `instance_group: [{kind: KIND_GPU, count: 2, gpus: [0]}]` into `instances`.
void ReadInstanceGroup(const YAML::Node& n, bool has_instances, InstancesConfig& instances) {
  if (has_instances) {
    throw ConfigError{"instance_group", "give either instances or instance_group, not both"};
  }
  if (!n.IsSequence() || n.size() != 1) {
    throw ConfigError{"instance_group",
                      "must be a list of one group {kind, count, gpus} (several groups per "
                      "model are not supported)"};
  }
  MapReader r(n[0], "instance_group[0]");
  std::string kind = "KIND_GPU";
  r.Read("kind", kind);
  if (kind == "KIND_GPU" || kind == "gpu") {
    instances.device = "cuda";
    instances.gpu_source_key = "instance_group[0].kind";
  } else if (kind == "KIND_CPU" || kind == "cpu") {
    instances.device = "cpu";
  } else {
    throw ConfigError{"instance_group[0].kind",
                      fmt::format("must be KIND_GPU or KIND_CPU (got '{}')", kind)};
  }
  r.Read("count", instances.count);
  instances.gpus = ReadList<int>(r.Get("gpus"), "instance_group[0].gpus");
  if (!instances.gpus.empty() && !instances.on_gpu()) {
    throw ConfigError{"instance_group[0].gpus", "applies to kind KIND_GPU only"};
  }
  r.Read("copy_slots", instances.copy_slots);
  r.Read("threads", instances.threads);
  r.RejectUnknownKeys();
}

ModelConfig ParseTopLevel(const YAML::Node& root) {
  ModelConfig c;
  MapReader top(root, "");
  top.Read("name", c.name);
  top.Read("model_file", c.model_file);
  if (YAML::Node n = top.Get("backend"); n.IsDefined() && !n.IsNull()) {
    std::string backend;
    top.Read("backend", backend);
    c.backend = ParseBackendKind(backend);
    if (!c.backend) {
      throw ConfigError{"backend",
                        fmt::format("must be torchscript or aotinductor (got '{}')", backend)};
    }
  }
  top.Read("max_batch_size", c.max_batch_size);

  if (YAML::Node n = top.Get("dynamic_batching"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "dynamic_batching");
    int64_t delay_us = c.dynamic_batching.max_queue_delay.count();
    int64_t timeout_us = c.dynamic_batching.default_timeout.count();
    r.Read("max_queue_delay_us", delay_us);
    r.Read("default_timeout_us", timeout_us);
    r.Read("max_queue_size", c.dynamic_batching.max_queue_size);
    int64_t queue_time_ms = c.dynamic_batching.max_queue_time.count() / 1000;
    r.Read("max_queue_time_ms", queue_time_ms);
    if (queue_time_ms < 0) {
      throw ConfigError{"dynamic_batching.max_queue_time_ms",
                        fmt::format("must be >= 0 (got {})", queue_time_ms)};
    }
    c.dynamic_batching.max_queue_time = Micros(queue_time_ms * 1000);
    std::string policy = c.dynamic_batching.adaptive ? "adaptive" : "fixed";
    r.Read("policy", policy);
    if (policy != "adaptive" && policy != "fixed") {
      throw ConfigError{"dynamic_batching.policy",
                        fmt::format("must be adaptive or fixed (got '{}')", policy)};
    }
    c.dynamic_batching.adaptive = policy == "adaptive";
    c.dynamic_batching.preferred_batch_sizes =
        ReadList<int>(r.Get("preferred_batch_sizes"), "dynamic_batching.preferred_batch_sizes");
    c.dynamic_batching.max_queue_delay = Micros(delay_us);
    c.dynamic_batching.default_timeout = Micros(timeout_us);
    r.RejectUnknownKeys();
  }
  if (YAML::Node n = top.Get("slo"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "slo");
    double p99_ms = 0;
    r.Read("p99_ms", p99_ms);
    r.RejectUnknownKeys();
    if (!(p99_ms > 0) || p99_ms > 3.6e6) {
      throw ConfigError{"slo.p99_ms",
                        fmt::format("must be > 0 and at most an hour (got {})", p99_ms)};
    }
    c.dynamic_batching.slo_p99 = Micros(static_cast<int64_t>(p99_ms * 1000));
  }
  if (YAML::Node n = top.Get("instances"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "instances");
    r.Read("count", c.instances.count);
    r.Read("device", c.instances.device);
    r.Read("threads", c.instances.threads);
    r.Read("share_cores", c.instances.share_cores);
    int64_t spin_us = c.instances.idle_spin.count();
    r.Read("idle_spin_us", spin_us);
    if (spin_us < 0 || spin_us > 1'000'000) {
      throw ConfigError{"instances.idle_spin_us",
                        fmt::format("must be >= 0 and at most 1000000 (got {})", spin_us)};
    }
    c.instances.idle_spin = Micros(spin_us);
    c.instances.gpus = ReadList<int>(r.Get("gpus"), "instances.gpus");
    r.Read("copy_slots", c.instances.copy_slots);
    r.RejectUnknownKeys();
  }
  if (YAML::Node n = top.Get("instance_group"); n.IsDefined() && !n.IsNull()) {
    ReadInstanceGroup(n, top.Get("instances").IsDefined(), c.instances);
  }
  std::string precision = "fp32";
  top.Read("precision", precision);
  YAML::Node auto_node = top.Get("precision_auto");
  const bool has_auto = auto_node.IsDefined() && !auto_node.IsNull();
  if (precision == "auto") {
    if (!has_auto) {
      throw ConfigError{"precision",
                        "auto needs precision_auto.chosen, the exporter's measured choice "
                        "(tools/export_models.py writes it); or pin fp32, bf16 or int8"};
    }
    MapReader r(auto_node, "precision_auto");
    std::string chosen;
    r.Read("chosen", chosen);
    r.Read("note", c.precision_auto_note);
    r.RejectUnknownKeys();
    auto parsed = ParsePrecision(chosen);
    if (!parsed) {
      throw ConfigError{"precision_auto.chosen",
                        fmt::format("must be fp32, bf16, fp16 or int8 (got '{}')", chosen)};
    }
    c.precision = *parsed;
    if (c.precision_auto_note.empty()) c.precision_auto_note = "chosen at export";
  } else {
    if (has_auto) {
      throw ConfigError{"precision_auto", fmt::format("applies only to precision: auto (the "
                                                      "file pins '{}')",
                                                      precision)};
    }
    auto parsed_precision = ParsePrecision(precision);
    if (!parsed_precision) {
      throw ConfigError{
          "precision", fmt::format("must be auto, fp32, bf16, fp16 or int8 (got '{}')", precision)};
    }
    c.precision = *parsed_precision;
  }
  if (YAML::Node n = top.Get("optimize"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "optimize");
    r.Read("freeze", c.optimize.freeze);
    r.Read("channels_last", c.optimize.channels_last);
    if (YAML::Node g = r.Get("cuda_graphs"); g.IsDefined() && !g.IsNull()) {
      bool graphs = false;
      r.Read("cuda_graphs", graphs);
      c.optimize.cuda_graphs = graphs;
    }
    r.RejectUnknownKeys();
  }
  c.inputs = ReadTensorSpecs(top.Get("inputs"), "inputs");
  c.outputs = ReadTensorSpecs(top.Get("outputs"), "outputs");
  if (YAML::Node n = top.Get("preprocess"); n.IsDefined() && !n.IsNull()) {
    MapReader pre(n, "preprocess");
    if (YAML::Node img = pre.Get("image"); img.IsDefined() && !img.IsNull()) {
      MapReader r(img, "preprocess.image");
      ImagePreprocessConfig image;
      r.Read("resize", image.resize);
      r.Read("crop", image.crop);
      r.Read("channels", image.channels);
      image.mean = ReadList<float>(r.Get("mean"), "preprocess.image.mean");
      image.std = ReadList<float>(r.Get("std"), "preprocess.image.std");
      r.RejectUnknownKeys();
      c.preprocess_image = std::move(image);
    }
    pre.RejectUnknownKeys();
  }
  if (YAML::Node n = top.Get("postprocess"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "postprocess");
    r.Read("topk", c.postprocess_topk);
    r.RejectUnknownKeys();
  }
  if (YAML::Node n = top.Get("warmup"); n.IsDefined() && !n.IsNull()) {
    MapReader r(n, "warmup");
    c.warmup_batch_sizes = ReadList<int>(r.Get("batch_sizes"), "warmup.batch_sizes");
    r.Read("iterations", c.warmup_iterations);
    r.RejectUnknownKeys();
  }
  top.RejectUnknownKeys();
  return c;
}

Status Error(std::string_view source, std::string_view key, std::string_view message) {
  return Status::InvalidArgument(fmt::format("{}: {}: {}", source, key, message));
}

Status ValidateSpecs(const std::vector<TensorSpec>& specs, std::string_view what,
                     std::string_view source) {
  if (specs.empty()) return Error(source, what, "at least one is required");
  std::set<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string path = fmt::format("{}[{}]", what, i);
    const TensorSpec& s = specs[i];
    if (s.name.empty()) return Error(source, path + ".name", "is required");
    if (!names.insert(s.name).second) {
      return Error(source, path + ".name", fmt::format("duplicate name '{}'", s.name));
    }
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if (s.shape[d] == 0 || s.shape[d] < -1) {
        return Error(
            source, fmt::format("{}.shape[{}]", path, d),
            fmt::format("must be >= 1 or -1 for a variable dimension (got {})", s.shape[d]));
      }
    }
  }
  return Status::Ok();
}

bool IsValidDevice(std::string_view device) {
  if (device == "cpu" || device == "cuda") return true;
  if (device.substr(0, 5) != "cuda:" || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(),
                     [](char ch) { return ch >= '0' && ch <= '9'; });
}

}  // namespace

std::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kInt8:
      return "int8";
  }
  return "fp32";
}

std::optional<Precision> ParsePrecision(std::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16, Precision::kInt8}) {
    if (PrecisionName(p) == name) return p;
  }
  return std::nullopt;
}

std::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kAotInductor ? "aotinductor" : "torchscript";
}

std::optional<BackendKind> ParseBackendKind(std::string_view name) {
  for (BackendKind k : {BackendKind::kTorchScript, BackendKind::kAotInductor}) {
    if (BackendKindName(k) == name) return k;
  }
  return std::nullopt;
}

std::string BackendVariantName(BackendVariant variant) {
  if (variant.kind == BackendKind::kAotInductor) return "aotinductor";
  return variant.freeze ? "torchscript+freeze" : "torchscript";
}

std::optional<BackendVariant> ParseBackendVariant(std::string_view name) {
  for (BackendVariant v : {BackendVariant{BackendKind::kTorchScript, false},
                           BackendVariant{BackendKind::kTorchScript, true},
                           BackendVariant{BackendKind::kAotInductor, false}}) {
    if (BackendVariantName(v) == name) return v;
  }
  return std::nullopt;
}

std::string DefaultModelFile(BackendKind kind, Precision precision) {
  if (kind == BackendKind::kTorchScript) return "model.pt";
  if (precision == Precision::kFp32) return "model.pt2";
  return fmt::format("model_{}.pt2", PrecisionName(precision));
}

bool IsValidModelName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.' || ch == '-';
  });
}

Result<ModelConfig> ParseModelConfig(std::string_view yaml_text, std::string_view source) {
  try {
    YAML::Node root = YAML::Load(std::string(yaml_text));
    if (!root.IsDefined() || root.IsNull()) {
      return Status::InvalidArgument(fmt::format("{}: file is empty", source));
    }
    return ParseTopLevel(root);
  } catch (const ConfigError& e) {
    return Error(source, e.key, e.message);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("{}:{}:{}: invalid YAML: {}", source,
                                               e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

void NormalizeModelConfig(ModelConfig& c, int cores) {
  if (!c.backend) {
    if (!c.model_file.empty()) {
      c.backend = std::filesystem::path(c.model_file).extension() == ".pt2"
                      ? BackendKind::kAotInductor
                      : BackendKind::kTorchScript;
    } else {
      std::error_code ignored;
      bool has_package =
          !c.directory.empty() &&
          std::filesystem::exists(
              c.directory / DefaultModelFile(BackendKind::kAotInductor, c.precision), ignored);
      c.backend = has_package ? BackendKind::kAotInductor : BackendKind::kTorchScript;
    }
  }
  if (c.model_file.empty()) c.model_file = DefaultModelFile(*c.backend, c.precision);
  if (c.instances.on_gpu()) {
    // A GPU worker's host thread only stages bytes and launches work.
    if (c.instances.threads == 0) c.instances.threads = 1;
    // `instances.device` names one GPU; an instance_group that names none takes every visible
    // GPU at load (as Triton's does), which only the CUDA runtime can count.
    if (c.instances.gpus.empty() && c.instances.gpu_source_key == "instances.device" &&
        IsValidDevice(c.instances.device)) {
      const std::string& d = c.instances.device;
      c.instances.gpus = {d == "cuda" ? 0
                                      : static_cast<int>(std::min<long>(
                                            std::strtol(d.c_str() + 5, nullptr, 10), 1 << 20))};
    }
    if (!c.optimize.cuda_graphs) {
      bool fixed = true;
      for (const TensorSpec& in : c.inputs) {
        for (int64_t d : in.shape) fixed &= d >= 1;
      }
      // An AOTInductor package's runtime cannot be captured (PyTorch 2.11: its run fails with
      // "invalid argument" under capture), so packages run without graphs by default.
      c.optimize.cuda_graphs = fixed && c.backend != BackendKind::kAotInductor;
    }
  }
  if (c.instances.threads == 0)
    c.instances.threads = std::max(1, cores / std::max(1, c.instances.count));
  if (c.instances.share_cores && !c.instances.on_gpu()) {
    c.instances.pool_cores = std::max(1, std::min(c.instances.count * c.instances.threads, cores));
  }
  if (c.warmup_batch_sizes.empty()) {
    c.warmup_batch_sizes = {1};
    if (c.max_batch_size > 1) c.warmup_batch_sizes.push_back(c.max_batch_size);
  }
}

Status ValidateModelConfig(const ModelConfig& c, int cores, std::string_view source) {
  if (!IsValidModelName(c.name)) {
    return Error(source, "name",
                 fmt::format("'{}' is not a valid model name (use A-Z a-z 0-9 _ . -)", c.name));
  }
  if (c.model_file.empty() || c.model_file.find("..") != std::string::npos ||
      c.model_file.front() == '/') {
    return Error(source, "model_file", "must be a file name inside the model directory");
  }
  if (c.max_batch_size < 1) {
    return Error(source, "max_batch_size", fmt::format("must be >= 1 (got {})", c.max_batch_size));
  }
  const DynamicBatchingConfig& b = c.dynamic_batching;
  if (b.max_queue_delay.count() < 0) {
    return Error(source, "dynamic_batching.max_queue_delay_us",
                 fmt::format("must be >= 0 (got {})", b.max_queue_delay.count()));
  }
  if (b.default_timeout.count() < 0) {
    return Error(source, "dynamic_batching.default_timeout_us",
                 fmt::format("must be >= 0 (got {})", b.default_timeout.count()));
  }
  if (b.max_queue_size < 1) {
    return Error(source, "dynamic_batching.max_queue_size",
                 fmt::format("must be >= 1 (got {})", b.max_queue_size));
  }
  for (size_t i = 0; i < b.preferred_batch_sizes.size(); ++i) {
    int size = b.preferred_batch_sizes[i];
    std::string key = fmt::format("dynamic_batching.preferred_batch_sizes[{}]", i);
    if (size < 1 || size > c.max_batch_size) {
      return Error(
          source, key,
          fmt::format("must be between 1 and max_batch_size {} (got {})", c.max_batch_size, size));
    }
    if (i > 0 && size <= b.preferred_batch_sizes[i - 1]) {
      return Error(source, key, "sizes must be strictly increasing");
    }
  }
  if (c.instances.count < 1) {
    return Error(source, "instances.count",
                 fmt::format("must be >= 1 (got {})", c.instances.count));
  }
  if (c.instances.threads < 1) {
    return Error(source, "instances.threads",
                 fmt::format("must be >= 1 (got {})", c.instances.threads));
  }
  if (!IsValidDevice(c.instances.device)) {
    return Error(source, "instances.device",
                 fmt::format("must be cpu, cuda or cuda:N (got '{}')", c.instances.device));
  }
  bool on_cpu = c.instances.device == "cpu";
  if (on_cpu && !c.instances.gpus.empty()) {
    return Error(source, "instances.gpus", "applies to GPU instances only (device cuda)");
  }
  if (!on_cpu && c.instances.share_cores) {
    return Error(source, "instances.share_cores",
                 "applies to CPU instances only (a GPU instance's thread only launches work)");
  }
  if (on_cpu && c.optimize.cuda_graphs.value_or(false)) {
    return Error(source, "optimize.cuda_graphs",
                 "needs GPU instances (instance_group kind KIND_GPU, or instances.device cuda)");
  }
  if (!on_cpu) {
    std::set<int> seen;
    for (size_t i = 0; i < c.instances.gpus.size(); ++i) {
      int gpu = c.instances.gpus[i];
      if (gpu < 0 || !seen.insert(gpu).second) {
        return Error(source, fmt::format("instance_group[0].gpus[{}]", i),
                     fmt::format("must be a GPU ordinal >= 0, listed once (got {})", gpu));
      }
    }
    if (c.instances.copy_slots < 1 || c.instances.copy_slots > 8) {
      return Error(source, "instances.copy_slots",
                   fmt::format("must be between 1 and 8 (got {})", c.instances.copy_slots));
    }
    if (c.precision == Precision::kInt8) {
      return Error(source, "precision",
                   "int8 packages are x86 CPU code; on a GPU use fp16, bf16 or fp32");
    }
    if (c.optimize.cuda_graphs.value_or(false) && c.backend == BackendKind::kAotInductor) {
      return Error(source, "optimize.cuda_graphs",
                   "AOTInductor packages cannot be captured as CUDA graphs (their runtime fails "
                   "under capture); set cuda_graphs: false or serve model.pt");
    }
    if (c.optimize.cuda_graphs.value_or(false)) {
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        for (int64_t d : c.inputs[i].shape) {
          if (d < 1) {
            return Error(source, "optimize.cuda_graphs",
                         fmt::format("needs fixed input shapes; inputs[{}] has a variable "
                                     "dimension (set cuda_graphs: false)",
                                     i));
          }
        }
      }
    }
  }
  // Shared cores: instances beyond the cores wait for one, so only one thread each may exceed.
  const bool waits_for_cores = c.instances.share_cores && c.instances.threads == 1;
  if (on_cpu && !waits_for_cores && c.instances.count * c.instances.threads > cores) {
    return Error(source, "instances",
                 fmt::format("count {} x threads {} exceeds the machine's {} cores",
                             c.instances.count, c.instances.threads, cores));
  }
  if (on_cpu && c.precision == Precision::kFp16) {
    return Error(source, "precision", "fp16 needs a CUDA device; use bf16 on CPU");
  }
  if (c.precision == Precision::kInt8 && c.backend != BackendKind::kAotInductor) {
    return Error(source, "precision",
                 "int8 needs the aotinductor backend (a quantised package, model_int8.pt2, "
                 "written by tools/export_models.py)");
  }
  SLUICE_RETURN_IF_ERROR(ValidateSpecs(c.inputs, "inputs", source));
  SLUICE_RETURN_IF_ERROR(ValidateSpecs(c.outputs, "outputs", source));
  if (c.preprocess_image) {
    const ImagePreprocessConfig& img = *c.preprocess_image;
    if (img.resize < 0) return Error(source, "preprocess.image.resize", "must be >= 0");
    if (img.crop < 0) return Error(source, "preprocess.image.crop", "must be >= 0");
    if (img.resize > 0 && img.crop > img.resize) {
      return Error(source, "preprocess.image.crop",
                   fmt::format("crop {} is larger than resize {}", img.crop, img.resize));
    }
    if (img.channels != 1 && img.channels != 3) {
      return Error(source, "preprocess.image.channels",
                   fmt::format("must be 1 or 3 (got {})", img.channels));
    }
    for (const auto& [key, values] : {std::pair{"mean", &img.mean}, std::pair{"std", &img.std}}) {
      if (!values->empty() && values->size() != 1 &&
          static_cast<int>(values->size()) != img.channels) {
        return Error(source, fmt::format("preprocess.image.{}", key),
                     fmt::format("needs 1 or {} values (got {})", img.channels, values->size()));
      }
    }
    for (float s : img.std) {
      if (!(s > 0)) return Error(source, "preprocess.image.std", "values must be > 0");
    }
    if (c.inputs.size() != 1) {
      return Error(source, "preprocess.image", "needs a model with exactly one input");
    }
    if (c.inputs[0].datatype == DataType::kUInt8) {
      // Raw pixels, [H, W, C], normalised by preprocess.image's mean and std on the device.
      const Shape& shape = c.inputs[0].shape;
      if (on_cpu) {
        return Error(source, "inputs[0].datatype",
                     "UINT8 images are normalised on GPU instances only; on CPU declare FP32");
      }
      if (shape.size() != 3 || shape[2] != img.channels) {
        return Error(source, "inputs[0].shape",
                     fmt::format("UINT8 images are [height, width, {}] (got {})", img.channels,
                                 ShapeToString(shape)));
      }
    }
  }
  if (c.postprocess_topk < 0) {
    return Error(source, "postprocess.topk",
                 fmt::format("must be >= 0 (got {})", c.postprocess_topk));
  }
  for (size_t i = 0; i < c.warmup_batch_sizes.size(); ++i) {
    int size = c.warmup_batch_sizes[i];
    if (size < 1 || size > c.max_batch_size) {
      return Error(
          source, fmt::format("warmup.batch_sizes[{}]", i),
          fmt::format("must be between 1 and max_batch_size {} (got {})", c.max_batch_size, size));
    }
  }
  if (c.warmup_iterations < 1) {
    return Error(source, "warmup.iterations",
                 fmt::format("must be >= 1 (got {})", c.warmup_iterations));
  }
  return Status::Ok();
}

void ApplyOverrides(const ModelConfigOverrides& o, ModelConfig& c) {
  if (o.instance_count) c.instances.count = *o.instance_count;
  if (o.threads) c.instances.threads = *o.threads;
  if (o.share_cores) c.instances.share_cores = *o.share_cores;
  if (o.max_batch_size) c.max_batch_size = *o.max_batch_size;
  if (o.max_queue_delay) c.dynamic_batching.max_queue_delay = *o.max_queue_delay;
  if (o.precision) {
    c.precision = *o.precision;
    c.precision_auto_note.clear();
  }
  if (o.backend) {
    c.backend = *o.backend;
    c.model_file.clear();
  }
  if (o.freeze) c.optimize.freeze = *o.freeze;
  if (o.channels_last) c.optimize.channels_last = *o.channels_last;
  if (o.warmup_batch_sizes) c.warmup_batch_sizes = *o.warmup_batch_sizes;
}

Result<ModelConfig> LoadModelConfig(const std::filesystem::path& model_dir,
                                    const ModelConfigOverrides& overrides, int cores) {
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::filesystem::path file = model_dir / "config.yaml";
  std::string source = file.string();
  std::ifstream in(file);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open", source));
  std::stringstream text;
  text << in.rdbuf();
  Result<ModelConfig> parsed = ParseModelConfig(text.str(), source);
  if (!parsed.ok()) return parsed;
  ModelConfig c = std::move(parsed).value();
  std::string dir_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (dir_name.empty()) dir_name = model_dir.lexically_normal().parent_path().filename().string();
  if (overrides.name) c.name = *overrides.name;
  if (c.name.empty()) c.name = dir_name;
  if (!overrides.name && c.name != dir_name) {
    return Error(source, "name",
                 fmt::format("'{}' differs from the directory name '{}'", c.name, dir_name));
  }
  c.directory = model_dir;
  ApplyOverrides(overrides, c);
  NormalizeModelConfig(c, cores);
  SLUICE_RETURN_IF_ERROR(ValidateModelConfig(c, cores, source));
  return c;
}

}  // namespace sluice
