// Model configuration: models/<name>/config.yaml parsed, normalised and validated.
//
// Parse turns YAML into typed fields (unknown keys and wrong types are errors), normalise fills
// defaults that depend on other fields, validate rejects impossible combinations. Every error
// names the file and the key, e.g. "models/m/config.yaml: instances.threads: must be >= 1 (got 0)".
#pragma once

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

// kInt8: statically quantised weights and activations (PT2E, x86), AOTInductor packages only.
enum class Precision { kFp32, kBf16, kFp16, kInt8 };
std::string_view PrecisionName(Precision p);  // "fp32", "bf16", "fp16", "int8".
std::optional<Precision> ParsePrecision(std::string_view name);

// Which runtime runs the model file.
enum class BackendKind {
  kTorchScript,  // model.pt, torch::jit; optimize.freeze is its "compile".
  kAotInductor,  // model.pt2 (model_bf16.pt2, model_int8.pt2): an AOTInductor package.
};
std::string_view BackendKindName(BackendKind kind);  // "torchscript", "aotinductor".
std::optional<BackendKind> ParseBackendKind(std::string_view name);

// A way to run a model, as sweeps and reports name it: "torchscript", "torchscript+freeze"
// (freeze + optimize_for_inference) or "aotinductor".
struct BackendVariant {
  BackendKind kind = BackendKind::kTorchScript;
  bool freeze = false;  // TorchScript only.
  bool operator==(const BackendVariant&) const = default;
};
std::string BackendVariantName(BackendVariant variant);
std::optional<BackendVariant> ParseBackendVariant(std::string_view name);

// The file a backend loads by default for a precision: "model.pt" for TorchScript (which converts
// precision at load time); "model.pt2", "model_bf16.pt2" or "model_int8.pt2" for AOTInductor,
// whose packages are compiled for one precision each.
std::string DefaultModelFile(BackendKind kind, Precision precision);

// One declared input or output. `shape` excludes the batch dimension; -1 marks a variable dim.
struct TensorSpec {
  std::string name;
  DataType datatype = DataType::kFp32;
  Shape shape;
};

struct DynamicBatchingConfig {
  // `policy: adaptive` (default): batch sizes from the learned cost model, waiting only when the
  // expected company pays (dynamic_batcher.h); `policy: fixed`: Triton's fixed delay and cap.
  bool adaptive = true;
  Micros max_queue_delay{1000};            // Longest the oldest request waits for company; >= 0.
  std::vector<int> preferred_batch_sizes;  // Dispatch at once at these sizes; ascending, unique.
  int max_queue_size = 1024;               // Queued samples beyond which requests get 503; >= 1.
  Micros default_timeout{0};  // Per-request deadline when the client sets none; 0: none.
  // Longest predicted queue wait a request is admitted with (dynamic_batcher.h); 0: no budget.
  Micros max_queue_time{1'000'000};
  // `slo: {p99_ms: N}`: the latency a request should get. A request whose predicted latency (its
  // queue wait plus its own batch) exceeds it is refused at once, and the adaptive policy keeps
  // batches to sizes that run in at most half of it. 0: none.
  Micros slo_p99{0};
};

// `instances:` (Sluice's form) or `instance_group:` (Triton's: a list of one {kind, count, gpus}).
struct InstancesConfig {
  // CPU: workers (model instances); GPU: instances on each of `gpus`. >= 1.
  int count = 1;
  // "cpu", "cuda" or "cuda:N"; `instance_group` kind KIND_GPU makes it "cuda".
  std::string device = "cpu";
  int threads = 0;  // Intra-op threads per instance; 0: cores / count (at least 1).
  // CPU only. The instances share a pool of count x threads cores, at most the machine's
  // (common/core_pool.h): a run alone takes them all, runs at once split them, an instance that
  // finds none free waits. Off: each instance keeps its `threads`.
  bool share_cores = false;
  int pool_cores = 0;  // The pool's size: set by NormalizeModelConfig when share_cores is on.
  // How long an idle instance polls for work before it sleeps (dynamic_batcher.h); 0: never.
  Micros idle_spin{500};
  // GPU only. The GPUs' ordinals; normalised from `device` when unset ("cuda": {0}, "cuda:N":
  // {N}); left empty by an instance_group that names none: every visible GPU, resolved at load
  // (engine.h's LoadedConfig). Each GPU instance owns a compute stream and a copy pipeline
  // (device/copy_pipeline.h).
  std::vector<int> gpus;
  // GPU only: batches in flight per GPU instance (one copied in while another computes), each
  // fed by its own engine worker; 1..8, default 2.
  int copy_slots = 2;
  // The key that asked for a GPU, for errors: "instance_group[0].kind" or "instances.device".
  std::string gpu_source_key = "instances.device";

  bool on_gpu() const { return device != "cpu"; }
  // Engine workers: `count` on CPU; count x GPUs x copy_slots on GPU (one GPU while `gpus` is
  // still to be resolved).
  int workers() const {
    if (!on_gpu()) return count;
    return count * std::max<int>(1, static_cast<int>(gpus.size())) * copy_slots;
  }
};

struct OptimizeConfig {
  bool freeze = false;         // torch::jit::freeze + optimize_for_inference ("compile").
  bool channels_last = false;  // NHWC weights and inputs for 4-D convolutional models.
  // GPU only: the forward pass captured as a CUDA graph per batch bucket (powers of two up to
  // max_batch_size) and replayed, a batch padded up to its bucket. Unset: on for GPU models whose
  // inputs have fixed shapes. Set on a CPU model or with variable input dims: a load error.
  std::optional<bool> cuda_graphs;
};

struct ImagePreprocessConfig {
  int resize = 0;           // Shorter side resized to this many pixels; 0: no resize.
  int crop = 0;             // Centre crop to crop x crop; 0: no crop. <= resize when both set.
  int channels = 3;         // 1 (grey) or 3 (RGB).
  std::vector<float> mean;  // Per channel, on [0, 1] pixel values; default 0.
  std::vector<float> std;   // Per channel, > 0; default 1.
};

struct ModelConfig {
  std::string name;                 // The model directory's name.
  std::filesystem::path directory;  // models/<name>.
  // `backend: torchscript | aotinductor`. Unset: inferred by NormalizeModelConfig from
  // `model_file`'s extension, else from the files present (the AOTInductor package for the
  // precision when it exists, else model.pt).
  std::optional<BackendKind> backend;
  std::string model_file;  // Relative to `directory`. Empty: DefaultModelFile(backend, precision).
  int max_batch_size = 1;  // Samples per batch; >= 1.
  DynamicBatchingConfig dynamic_batching;
  InstancesConfig instances;
  Precision precision = Precision::kFp32;
  // `precision: auto`: the precision the exporter measured as fastest within its agreement bound
  // on its CPU, recorded beside it as `precision_auto: {chosen: int8, note: "..."}`
  // (tools/export_models.py); `precision` holds the chosen one. Empty when the precision was
  // pinned (the file or --precision). Shown in the load line and the v2 model metadata.
  std::string precision_auto_note;
  OptimizeConfig optimize;
  std::vector<TensorSpec> inputs;   // At least one.
  std::vector<TensorSpec> outputs;  // At least one.
  std::optional<ImagePreprocessConfig> preprocess_image;
  int postprocess_topk = 0;             // Top-k classes in classification replies; 0: raw output.
  std::vector<int> warmup_batch_sizes;  // Default: {1, max_batch_size}.
  int warmup_iterations = 2;            // Runs per warm-up batch size; >= 1.

  std::filesystem::path model_path() const { return directory / model_file; }
};

// Parses YAML text; `source` names it in errors. Fills only what the text says (no defaults that
// depend on other fields).
Result<ModelConfig> ParseModelConfig(std::string_view yaml_text, std::string_view source);

// Fills derived defaults (warm-up sizes, thread counts) given the machine's core count, and
// resolves `backend` and `model_file` (looking into `directory` when neither is given).
void NormalizeModelConfig(ModelConfig& config, int cores);

// Checks every rule; `source` names the file in errors.
Status ValidateModelConfig(const ModelConfig& config, int cores, std::string_view source);

// Settings given on the command line, applied over the file before normalising, so derived
// defaults (threads per instance) follow them.
struct ModelConfigOverrides {
  // The name to serve the directory under, whatever its own name and the file's `name` (a single
  // model's directory, as KServe mounts one at /mnt/models). Unset: the directory's name.
  std::optional<std::string> name;
  std::optional<int> instance_count;
  std::optional<int> threads;
  std::optional<bool> share_cores;
  std::optional<int> max_batch_size;
  std::optional<Micros> max_queue_delay;
  std::optional<Precision> precision;
  std::optional<BackendKind> backend;  // Also clears a model_file the file set.
  std::optional<bool> freeze;
  std::optional<bool> channels_last;
  std::optional<std::vector<int>> warmup_batch_sizes;
};

// Applies `overrides` to `config`.
void ApplyOverrides(const ModelConfigOverrides& overrides, ModelConfig& config);

// Reads <model_dir>/config.yaml, parses it, applies `overrides`, normalises and validates.
// `cores` <= 0 means the machine's core count.
Result<ModelConfig> LoadModelConfig(const std::filesystem::path& model_dir,
                                    const ModelConfigOverrides& overrides = {}, int cores = 0);

// Model names are restricted to [A-Za-z0-9_.-], not starting with '.'.
bool IsValidModelName(std::string_view name);

}  // namespace sluice
