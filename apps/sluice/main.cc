// sluice: the command-line entry point. Each subcommand's flags sit beside its run:
// bench_command, sweep_command, serve_command, report_command; what they share in cli_common.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "backends/cuda_loader.h"
#include "bench_command.h"
#include "llm/load_llm.h"
#include "report_command.h"
#include "serve_command.h"
#include "sweep_command.h"

namespace {

std::string CommandLine(int argc, char** argv) {
  std::string line = "sluice";
  for (int i = 1; i < argc; ++i) line += fmt::format(" {}", argv[i]);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sluice;
  spdlog::set_level(spdlog::level::warn);
  // A language model on a GPU runs ATen's CUDA kernels, which Sluice's CUDA library brings.
  llm::SetDeviceRuntimeLoader([](const std::string&) { return LoadCudaRuntime(); });
  // Its decode steps replay CUDA graphs from the same library (device: "cuda:N").
  llm::SetDeviceGraphsMaker([](const std::string& device) {
    return LoadCudaStepGraphs(std::stoi(device.substr(device.find(':') + 1)));
  });
  CLI::App app{"Sluice: a C++ inference server for PyTorch models, and its benchmark harness"};
  app.require_subcommand(1);
  const std::string command_line = CommandLine(argc, argv);

  BenchCommand bench;
  CLI::App* bench_app = AddBenchCommand(app, bench);
  SweepCommand sweep;
  CLI::App* sweep_app = AddSweepCommand(app, sweep);
  ServeCommand serve;
  CLI::App* serve_app = AddServeCommand(app, serve);
  ReportCommand report;
  CLI::App* report_app = AddReportCommand(app, report);

  CLI11_PARSE(app, argc, argv);
  if (serve_app->parsed()) return RunServeCommand(serve);
  if (bench_app->parsed()) return RunBenchCommand(bench, command_line);
  if (sweep_app->parsed()) return RunSweepCommand(sweep, command_line);
  if (report_app->parsed()) return RunReportCommand(report);
  return 2;
}
