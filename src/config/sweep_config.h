// The sweep file given to `sluice sweep FILE`: which model and which grid.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"

namespace sluice {

// Every field is optional; command-line flags override what the file says.
struct SweepFileConfig {
  std::optional<std::string> model;             // Model name in the repository.
  std::optional<std::string> model_repository;  // Directory of models.
  std::optional<std::vector<int>> batch_sizes;
  std::optional<std::vector<bool>> compile;  // [false, true]: torchscript, torchscript+freeze.
  // torchscript, torchscript+freeze, aotinductor; wins over `compile`.
  std::optional<std::vector<BackendVariant>> backends;
  std::optional<std::vector<Precision>> precisions;
  std::optional<int> iterations;  // Timed requests per cell.
  std::optional<int> workers;     // Instances.
  std::optional<int> threads;     // Intra-op threads per instance.
  std::optional<std::string> results_dir;
};

// Parses a sweep file's text; `source` names it in errors.
Result<SweepFileConfig> ParseSweepConfig(std::string_view yaml_text, std::string_view source);
// Reads and parses a sweep file.
Result<SweepFileConfig> LoadSweepConfig(const std::string& path);

}  // namespace sluice
