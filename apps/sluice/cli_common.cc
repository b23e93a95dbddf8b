// What the sluice subcommands share.
#include "cli_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "backends/load_backend.h"
#include "bench/report.h"

namespace sluice {

// The binary's backend loader: TorchScript or AOTInductor, as the config says.
Result<std::shared_ptr<Backend>> LoadSharedBackend(const ModelConfig& config) {
  auto backend = LoadBackend(config);
  if (!backend.ok()) return backend.status();
  return std::shared_ptr<Backend>(std::move(*backend));
}

int Fail(const Status& status) {
  fmt::print(stderr, "error: {}\n", status.message());
  return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound
             ? 2
             : 1;
}

void AddProfileOptions(CLI::App& app, bool& on, ProfileOptions& options, bool with_dir) {
  app.add_flag("--profile", on,
               "Run libtorch's profiler over a window of model runs (or SLUICE_TORCH_PROFILER=1)");
  app.add_option("--profile-runs", options.runs, "--profile: model runs recorded per instance")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--profile-skip", options.skip_runs, "--profile: model runs before the window")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  if (with_dir) {
    app.add_option("--profile-dir", options.dir,
                   "--profile: where the traces go (default: results/<time>-profile-serve)");
  }
}

Result<ModelConfig> ResolveModel(const ModelSelection& s, std::vector<int> extra_warmup_sizes) {
  std::filesystem::path dir = s.model_dir;
  if (dir.empty()) {
    if (s.model.empty()) return Status::InvalidArgument("name a model with --model or --model-dir");
    if (!IsValidModelName(s.model)) {
      return Status::InvalidArgument(fmt::format("'{}' is not a valid model name", s.model));
    }
    dir = std::filesystem::path(s.model_repository) / s.model;
  }
  ModelConfigOverrides o;
  if (s.workers > 0) o.instance_count = s.workers;
  if (s.threads > 0) o.threads = s.threads;
  o.share_cores = s.share_cores;
  if (!s.precision.empty()) {
    auto p = ParsePrecision(s.precision);
    if (!p) return Status::InvalidArgument(fmt::format("unknown precision '{}'", s.precision));
    o.precision = *p;
  }
  if (!s.backend.empty()) o.backend = ParseBackendKind(s.backend);
  o.freeze = s.compile;
  if (s.channels_last) o.channels_last = true;
  if (s.max_batch_size > 0) o.max_batch_size = s.max_batch_size;
  if (s.max_queue_delay_us >= 0) o.max_queue_delay = Micros(s.max_queue_delay_us);
  auto config = LoadModelConfig(dir, o);
  if (!config.ok() || extra_warmup_sizes.empty()) return config;
  for (int size : extra_warmup_sizes) {
    auto& sizes = config->warmup_batch_sizes;
    if (size >= 1 && size <= config->max_batch_size &&
        std::find(sizes.begin(), sizes.end(), size) == sizes.end()) {
      sizes.push_back(size);
    }
  }
  return config;
}

void AddModelOptions(CLI::App& app, ModelSelection& s) {
  app.add_option("--model,-m", s.model, "Model name in the repository");
  app.add_option("--model-repository", s.model_repository, "Directory of models")
      ->capture_default_str();
  app.add_option("--model-dir,--model_dir", s.model_dir, "A model directory (instead of --model)");
  app.add_option("--workers,--num-workers,--num_workers", s.workers,
                 "Model instances, each on its own worker thread (default: config)");
  app.add_option("--threads", s.threads,
                 "Intra-op threads per instance (default: config, else cores / workers)");
  app.add_flag_callback(
      "--share-cores", [&s] { s.share_cores = true; },
      "The instances share their workers x threads cores: a run alone takes them all, runs at "
      "once split them (default: config)");
  app.add_flag_callback(
      "--no-share-cores", [&s] { s.share_cores = false; },
      "Each instance keeps its own threads, whatever the config says");
  app.add_option("--precision", s.precision,
                 "fp32, bf16 or int8 (int8: AOTInductor only; int4: a language model on a GPU; "
                 "default: config)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "int8", "int4"}));
  app.add_option("--backend", s.backend,
                 "torchscript (model.pt) or aotinductor (model.pt2; default: config, else the "
                 "package when present)")
      ->check(CLI::IsMember({"torchscript", "aotinductor"}));
  app.add_flag("--channels-last", s.channels_last, "NHWC weights and inputs");
}

int WriteReport(const std::filesystem::path& dir) {
  Status written = WriteRunReport(dir);
  if (!written.ok()) return Fail(written);
  fmt::print("Report:  {}\n", (dir / "report.html").string());
  return 0;
}

}  // namespace sluice
