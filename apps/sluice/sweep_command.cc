// `sluice sweep`: the flags and the grid.
#include "sweep_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "backends/load_backend.h"
#include "bench/results.h"
#include "bench/sweep.h"
#include "common/system_info.h"
#include "config/model_config.h"
#include "config/sweep_config.h"

namespace sluice {
namespace {

// The grid from the sweep file and the flags, and whether either named the backends or the
// precisions (otherwise RunSweepCommand fits them to the model directory and the CPU).
struct ResolvedSweep {
  SweepOptions options;
  bool backends_given = false;
  bool precisions_given = false;
};

Result<ResolvedSweep> SweepOptionsFrom(SweepCommand& cmd) {
  ResolvedSweep resolved;
  SweepOptions& options = resolved.options;
  if (!cmd.file.empty()) {
    auto file = LoadSweepConfig(cmd.file);
    if (!file.ok()) return file.status();
    // Flags win over the file.
    if (cmd.model.model.empty() && file->model) cmd.model.model = *file->model;
    if (file->model_repository && cmd.model.model_repository == "models") {
      cmd.model.model_repository = *file->model_repository;
    }
    if (cmd.model.workers == 0 && file->workers) cmd.model.workers = *file->workers;
    if (cmd.model.threads == 0 && file->threads) cmd.model.threads = *file->threads;
    if (cmd.results_dir.empty() && file->results_dir) cmd.results_dir = *file->results_dir;
    if (file->batch_sizes) options.batch_sizes = *file->batch_sizes;
    if (file->compile) {
      options.backends.clear();
      for (bool freeze : *file->compile)
        options.backends.push_back({BackendKind::kTorchScript, freeze});
    }
    if (file->backends) options.backends = *file->backends;
    if (file->precisions) options.precisions = *file->precisions;
    if (file->iterations) options.iterations = *file->iterations;
    resolved.backends_given = file->compile || file->backends;
    resolved.precisions_given = file->precisions.has_value();
  }
  resolved.backends_given |= !cmd.compile.empty() || !cmd.backends.empty();
  resolved.precisions_given |= !cmd.precisions.empty();
  if (cmd.results_dir.empty()) cmd.results_dir = "results";
  if (!cmd.batch_sizes.empty()) options.batch_sizes = cmd.batch_sizes;
  if (!cmd.compile.empty()) {
    options.backends.clear();
    for (const std::string& c : cmd.compile) {
      if (c != "on" && c != "off") {
        return Status::InvalidArgument(fmt::format("--compile takes on and/or off (got '{}')", c));
      }
      options.backends.push_back({BackendKind::kTorchScript, c == "on"});
    }
  }
  if (!cmd.backends.empty()) {
    options.backends.clear();
    for (const std::string& name : cmd.backends) {
      auto b = ParseBackendVariant(name);
      if (!b) {
        return Status::InvalidArgument(fmt::format(
            "--backends takes torchscript, torchscript+freeze and/or aotinductor (got '{}')",
            name));
      }
      options.backends.push_back(*b);
    }
  }
  if (!cmd.precisions.empty()) {
    options.precisions.clear();
    for (const std::string& name : cmd.precisions) {
      auto p = ParsePrecision(name);
      if (!p) return Status::InvalidArgument(fmt::format("unknown precision '{}'", name));
      options.precisions.push_back(*p);
    }
  }
  if (cmd.iterations > 0) options.iterations = cmd.iterations;
  return resolved;
}

}  // namespace

CLI::App* AddSweepCommand(CLI::App& parent, SweepCommand& cmd) {
  CLI::App* app = parent.add_subcommand("sweep", "Run a batch size x backend x precision grid");
  app->add_option("file", cmd.file, "Sweep file (YAML); flags override it");
  AddModelOptions(*app, cmd.model);
  app->add_option("--batch-sizes", cmd.batch_sizes, "e.g. 1,8,32,64")->delimiter(',');
  app->add_option("--compile", cmd.compile, "off,on: torchscript, torchscript+freeze")
      ->delimiter(',');
  app->add_option("--backends", cmd.backends,
                  "torchscript,torchscript+freeze,aotinductor (default: the TorchScript pair, "
                  "and aotinductor when the model has model.pt2)")
      ->delimiter(',');
  app->add_option("--precisions", cmd.precisions,
                  "fp32,bf16,int8 (default: fp32,bf16, and int8 when model_int8.pt2 exists)")
      ->delimiter(',');
  app->add_option("--iters,--num-iters,--num_iters", cmd.iterations,
                  "Timed requests per cell (default 20)");
  app->add_option("--results-dir", cmd.results_dir, "Where results/<run-id>/ goes");

  return app;
}

int RunSweepCommand(SweepCommand& cmd, const std::string& command_line) {
  auto resolved = SweepOptionsFrom(cmd);
  if (!resolved.ok()) return Fail(resolved.status());
  SweepOptions* options = &resolved->options;
  auto config = ResolveModel(cmd.model);
  if (!config.ok()) return Fail(config.status());
  // Unless told otherwise, the grid covers the AOTInductor packages the model directory holds.
  auto has = [&](const std::string& name) {
    return std::filesystem::exists(config->directory / name);
  };
  if (!resolved->backends_given &&
      has(DefaultModelFile(BackendKind::kAotInductor, Precision::kFp32))) {
    options->backends.push_back({BackendKind::kAotInductor, false});
  }
  if (!resolved->precisions_given) {
    if (has(DefaultModelFile(BackendKind::kAotInductor, Precision::kInt8))) {
      options->precisions.push_back(Precision::kInt8);
    }
    // Emulated bf16 only shows how slow emulation is, at length: asked for, it still runs.
    if (!CpuHasNativeBf16()) {
      std::erase(options->precisions, Precision::kBf16);
      fmt::print(
          "bf16 left out: this CPU has no native bf16 (avx512_bf16 or amx_bf16); "
          "--precisions fp32,bf16 runs it anyway\n");
    }
  }
  const bool tty = isatty(fileno(stderr));
  auto progress = [&](int index, int count, const std::string& what) {
    fmt::print(stderr, "{}[{}/{}] {}{}", tty ? "\r\033[K" : "", index + 1, count, what,
               tty ? "" : "\n");
  };
  auto cells = RunSweep(*config, *options, LoadSharedBackend, progress);
  if (tty) fmt::print(stderr, "\r\033[K");
  if (!cells.ok()) return Fail(cells.status());
  fmt::print("Sweep of {} ({} worker(s) x {} thread(s), {} timed requests per cell)\n",
             config->name, config->instances.count, config->instances.threads, options->iterations);
  fmt::print("{}", FormatSweepTable(*cells));
  auto dir = CreateRunDirectory(cmd.results_dir, fmt::format("sweep-{}", config->name));
  if (!dir.ok()) return Fail(dir.status());
  Status written = WriteSweepResults(*dir, RunInfo{command_line, TorchRuntimeVersion()}, *config,
                                     *options, *cells);
  if (!written.ok()) return Fail(written);
  fmt::print(
      "Results: {}/summary.csv\nPlots:   {}/throughput_vs_batch_size.svg\n"
      "         {}/latency_vs_batch_size.svg\n",
      dir->string(), dir->string(), dir->string());
  return WriteReport(*dir);
}

}  // namespace sluice
