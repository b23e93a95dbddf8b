// What the sluice subcommands share.
#include "cli_common.h"

#include <fmt/format.h>

#include <cstdio>

#include "backends/load_backend.h"

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

}  // namespace sluice
