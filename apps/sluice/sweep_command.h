// `sluice sweep`: a batch size x backend x precision grid of in-process runs, from a sweep file
// and flags.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli_common.h"

namespace sluice {

struct SweepCommand {
  std::string file;
  ModelSelection model;
  std::vector<int> batch_sizes;
  std::vector<std::string> compile;     // "off", "on": torchscript without / with freeze.
  std::vector<std::string> backends;    // torchscript, torchscript+freeze, aotinductor.
  std::vector<std::string> precisions;  // "fp32", "bf16", "int8".
  int iterations = 0;
  std::string results_dir;
};

// Adds the `sweep` subcommand to `parent`, its flags writing into `cmd`.
CLI::App* AddSweepCommand(CLI::App& parent, SweepCommand& cmd);

// Runs the grid; returns the process's exit code.
int RunSweepCommand(SweepCommand& cmd, const std::string& command_line);

}  // namespace sluice
