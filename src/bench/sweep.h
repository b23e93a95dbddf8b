// The sweep: the PyTorch seed's runner.sh grid, run in one process and written to one folder.
//
// Batch sizes x backend {torchscript, torchscript+freeze, aotinductor} x precision {fp32, bf16,
// int8}. The model is loaded once per (backend, precision) pair and every batch size runs on that
// load, as runner.sh does. TorchScript has no int8: those pairs are left out of the grid.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/in_process.h"
#include "bench/results.h"
#include "config/model_config.h"
#include "engine/engine.h"
#include "sluice/backend.h"

namespace sluice {

struct SweepOptions {
  std::vector<int> batch_sizes{1, 8, 32, 64};  // Each <= the model's max_batch_size.
  // TorchScript without and with freeze ("compile"), and the AOTInductor packages.
  std::vector<BackendVariant> backends{{BackendKind::kTorchScript, false},
                                       {BackendKind::kTorchScript, true}};
  std::vector<Precision> precisions{Precision::kFp32, Precision::kBf16};
  int iterations = 20;    // Timed requests per cell; >= 1.
  int max_in_flight = 0;  // As InProcessOptions.
};

struct SweepCell {
  int batch_size = 0;
  BackendVariant backend;
  Precision precision = Precision::kFp32;
  LoadReport load;
  BenchRun run;
};

// Called before each cell with its 0-based index, the cell count and a description.
using SweepProgress = std::function<void(int index, int count, const std::string& what)>;

// Whether the sweep runs `backend` at `precision` (TorchScript has no int8).
bool SweepRuns(BackendVariant backend, Precision precision);

// Runs the grid over `base` (instances, threads and the rest stay as configured).
Result<std::vector<SweepCell>> RunSweep(const ModelConfig& base, const SweepOptions& options,
                                        const BackendLoader& loader,
                                        const SweepProgress& progress = {});

// summary.csv: one row per cell.
std::string SweepSummaryCsv(const std::vector<SweepCell>& cells);
// The table printed at the end of a sweep.
std::string FormatSweepTable(const std::vector<SweepCell>& cells);
// Writes run.json, summary.csv, summary.json, throughput_vs_batch_size.svg and
// latency_vs_batch_size.svg into `dir`.
Status WriteSweepResults(const std::filesystem::path& dir, const RunInfo& info,
                         const ModelConfig& base, const SweepOptions& options,
                         const std::vector<SweepCell>& cells);

}  // namespace sluice
