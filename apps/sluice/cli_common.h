// What the sluice subcommands share: how an error ends the command, and the profiler switches.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "backends/profiler.h"
#include "config/model_config.h"
#include "sluice/backend.h"
#include "sluice/status.h"

namespace sluice {

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
