// `sluice bench`: its flags, and the runs they choose (a model in this process, a server over HTTP
// or gRPC, a language model over the OpenAI API or in this process).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "backends/profiler.h"
#include "bench/http_bench.h"
#include "bench/in_process.h"
#include "bench/llm_bench.h"
#include "cli_common.h"

namespace sluice {

struct BenchCommand {
  ModelSelection model;
  bool in_process = false;
  InProcessOptions run;
  // > 0: the batched pipeline, with this many clients each keeping one request of
  // `samples_per_request` samples in flight through the dynamic batcher.
  std::vector<int> concurrency;  // In-process: one value. --url: the closed-loop levels.
  int samples_per_request = 1;
  // --url: an HTTP server to measure instead of an in-process model.
  std::string url;
  HttpBenchOptions http;
  bool compare_ceiling = false;  // Also run the engine ceiling, interleaved, and report the ratio.
  int rounds = 3;                // Ceiling/pipeline pairs with --compare-ceiling.
  std::string results_dir = "results";
  bool write_results = true;
  // --llm: a language model over the OpenAI API (--url), or in this process (--in-process).
  bool llm = false;
  LlmBenchOptions llm_options;
  // --llm --in-process: this precision (PRECISION[@DEVICE]) compared with --precision's on the
  // CPU (or --llm-device).
  std::string agreement;
  std::string llm_device;  // --llm --in-process: where the model runs (cpu, cuda, cuda:N).
  // --llm --in-process: the engine's slots and step budget over config.yaml's (0: its own), as
  // `sluice serve --llm-slots / --llm-max-step-tokens` set them.
  int llm_slots = 0;
  int llm_max_step_tokens = 0;
  // Trace-event JSON of the requests' stages (in-process, or --url's client side); off if empty.
  std::string trace_file;
  double trace_sample_rate = 1;
  // libtorch's profiler over a window of model runs (also SLUICE_TORCH_PROFILER=1).
  bool profile = false;
  ProfileOptions profile_options;
  // --url: seconds as the flags take them, into `http` when the command runs.
  double duration_seconds = HttpBenchOptions{}.duration.count();
  double warmup_seconds = HttpBenchOptions{}.warmup.count();
  bool random_payload = false;  // --random: the default payload, named.
};

// Adds the `bench` subcommand to `parent`, its flags writing into `cmd`.
CLI::App* AddBenchCommand(CLI::App& parent, BenchCommand& cmd);

// Runs the measurement `cmd` describes; returns the process's exit code. `command_line` goes into
// the result files.
int RunBenchCommand(BenchCommand& cmd, const std::string& command_line);

}  // namespace sluice
