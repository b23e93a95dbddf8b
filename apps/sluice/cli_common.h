// What the sluice subcommands share: how an error ends the command, the model options of bench and
// sweep, a run's report, and the profiler switches.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/profiler.h"
#include "config/model_config.h"
#include "sluice/backend.h"
#include "sluice/status.h"

namespace sluice {

// Where the model comes from and how to override its config.
struct ModelSelection {
  std::string model;                        // Name in the repository.
  std::string model_repository = "models";  // Directory of models.
  std::string model_dir;                    // A model directory; wins over the two above.
  int workers = 0;                          // Instances; 0: as configured.
  int threads = 0;                          // Threads per instance; 0: as configured / derived.
  std::optional<bool> share_cores;          // instances.share_cores; unset: as configured.
  std::string precision;                    // "", fp32, bf16, int8.
  std::string backend;                      // "", torchscript, aotinductor.
  std::optional<bool> compile;
  bool channels_last = false;
  int max_batch_size = 0;           // 0: as configured.
  int64_t max_queue_delay_us = -1;  // < 0: as configured.
};

// The model `s` names, its config loaded with the overrides `s` holds. `extra_warmup_sizes` are
// warmed up besides the configured ones (the sizes a benchmark sends).
Result<ModelConfig> ResolveModel(const ModelSelection& s, std::vector<int> extra_warmup_sizes = {});

// --model, --model-repository, --model-dir, --workers, --threads, --share-cores, --precision,
// --backend, --channels-last.
void AddModelOptions(CLI::App& app, ModelSelection& s);

// Writes <dir>/report.html and says where it is; returns the exit code.
int WriteReport(const std::filesystem::path& dir);

// The profiler switches of serve and bench.
struct ProfileSwitch {
  bool on = false;
  ProfileOptions options;
};

// The binary's backend loader: TorchScript or AOTInductor, as the config says.
Result<std::shared_ptr<Backend>> LoadSharedBackend(const ModelConfig& config);

// Prints `status` to stderr; returns the exit code: 2 for bad input, 1 otherwise.
int Fail(const Status& status);

// --profile, --profile-runs, --profile-skip (and --profile-dir when `with_dir`).
void AddProfileOptions(CLI::App& app, bool& on, ProfileOptions& options, bool with_dir);

}  // namespace sluice
