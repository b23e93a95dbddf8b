// Result files: results/<run-id>/ with run.json, samples.csv and summary.json.
#pragma once

#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "bench/in_process.h"
#include "common/json_writer.h"
#include "config/model_config.h"
#include "metrics/trace.h"

namespace sluice {

// What run.json says beside the configuration.
struct RunInfo {
  std::string command_line;  // The sluice command as typed.
  std::string runtime;       // e.g. "libtorch 1.13.0".
};

// Creates <base>/<YYYYmmdd-HHMMSS>-<label>, with -2, -3... appended when the name is taken.
Result<std::filesystem::path> CreateRunDirectory(const std::filesystem::path& base,
                                                 std::string_view label);

Status WriteTextFile(const std::filesystem::path& path, std::string_view content);

// run.json: start time, command, machine (CPU model, cores), versions, git commit, then the
// "config" object that `write_config` fills.
std::string RunJson(const RunInfo& info, const std::function<void(JsonWriter&)>& write_config);

// The model configuration as a JSON object (the value of a key already written).
void WriteModelConfigJson(JsonWriter& json, const ModelConfig& config);
// Summary fields (as members of an open object).
void WriteSummaryFields(JsonWriter& json, const Summary& summary, const UtilizationAverages& util);
void WriteLoadFields(JsonWriter& json, const LoadReport& load);

// One row per request, times in seconds from the first request_time; the warm-up row is marked.
std::string SamplesCsv(std::span<const RequestRecord> records);

// Hands the in-process records `tracer` samples to it (warm-up included): a batched run's as
// submit, queue, batch, compute, complete; an unbatched run's as queue, compute. Each root span
// is the record's latency exactly; lanes are assigned so no two requests on one overlap.
void TraceInProcessRecords(std::span<const RequestRecord> records, std::string_view model,
                           TraceWriter& tracer);

// One part of a run (a level, a cell) and the utilisation samples taken during it.
struct UtilizationPart {
  std::string label;
  std::span<const UtilizationSample> samples;
};

// Writes <dir>/utilization.csv: one row per sample, labelled with its part, time in seconds from
// the first sample of the run. Writes nothing when no part has a sample (a run under 100 ms).
Status WriteUtilizationCsv(const std::filesystem::path& dir,
                           const std::vector<UtilizationPart>& parts);

// Writes run.json, samples.csv, utilization.csv and summary.json of one in-process run into
// `dir`.
Status WriteBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                         const ModelConfig& config, const InProcessOptions& options,
                         const LoadReport& load, const BenchRun& run);

}  // namespace sluice
