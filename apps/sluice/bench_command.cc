// `sluice bench`: the flags and the runs.
#include "bench_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/load_backend.h"
#include "bench/report.h"
#include "bench/results.h"
#include "bench/stats.h"
#include "common/mutex.h"
#include "common/system_info.h"
#include "config/model_config.h"
#include "llm/load_llm.h"
#include "llm/precision_agreement.h"
#include "llm/text/tokenizer.h"

namespace sluice {
namespace {

// Instances of a loaded backend; `owned` keeps them alive.
Result<std::vector<BackendInstance*>> MakeInstances(
    Backend& backend, int count, std::vector<std::unique_ptr<BackendInstance>>& owned) {
  std::vector<BackendInstance*> instances;
  for (int i = 0; i < count; ++i) {
    auto instance = backend.CreateInstance(i);
    if (!instance.ok()) return instance.status();
    instances.push_back(instance->get());
    owned.push_back(std::move(*instance));
  }
  return instances;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// "torchscript", "torchscript+freeze" or "aotinductor".
std::string BackendLabel(const ModelConfig& c) {
  return BackendVariantName({c.backend.value_or(BackendKind::kTorchScript), c.optimize.freeze});
}

void Describe(const ModelConfig& c, const InProcessOptions& o) {
  fmt::print(
      "Model: {} ({}), batch size {}, {} timed requests, {} worker(s) x {} thread(s), "
      "backend {}, precision {}, channels_last {}\n",
      c.name, c.model_path().string(), o.batch_size, o.iterations, c.instances.count,
      c.instances.threads, BackendLabel(c), PrecisionName(c.precision),
      c.optimize.channels_last ? "on" : "off");
}

void DescribeBatched(const ModelConfig& c, const InProcessOptions& o) {
  fmt::print(
      "Model: {} ({}), batched: {} clients x {} sample(s) per request, max_batch_size {}, "
      "max_queue_delay {} us, {} timed requests, {} worker(s) x {} thread(s), backend {}, "
      "precision {}, channels_last {}\n",
      c.name, c.model_path().string(), o.max_in_flight, o.batch_size, c.max_batch_size,
      c.dynamic_batching.max_queue_delay.count(), o.iterations, c.instances.count,
      c.instances.threads, BackendLabel(c), PrecisionName(c.precision),
      c.optimize.channels_last ? "on" : "off");
}

// `cmd`'s trace file, opened (null when none was asked for).
Result<std::unique_ptr<TraceWriter>> OpenBenchTrace(const BenchCommand& cmd) {
  if (cmd.trace_file.empty()) return std::unique_ptr<TraceWriter>();
  return TraceWriter::Open({.path = cmd.trace_file,
                            .sample_rate = cmd.trace_sample_rate,
                            .process_name = "sluice bench",
                            .lane_prefix = "slot"});
}

// Closes the trace and says where it is.
int FinishBenchTrace(TraceWriter* tracer) {
  if (tracer == nullptr) return 0;
  Status closed = tracer->Close();
  if (!closed.ok()) return Fail(closed);
  fmt::print("Trace:   {} ({} request(s))\n", tracer->path().string(), tracer->written());
  return 0;
}

int RunHttpBenchCommand(const BenchCommand& cmd, const std::string& command_line) {
  HttpBenchOptions o = cmd.http;
  o.url = cmd.url;
  o.model = cmd.model.model;
  if (!cmd.concurrency.empty()) o.concurrency = cmd.concurrency;
  if (!cmd.http.rates.empty() && cmd.concurrency.empty()) o.concurrency.clear();
  o.samples_per_request = cmd.samples_per_request;
  if (!o.input_file.empty() && o.endpoint == "v2") o.endpoint = "predict";
  auto tracer = OpenBenchTrace(cmd);
  if (!tracer.ok()) return Fail(tracer.status());
  o.tracer = tracer->get();
  auto levels = RunHttpBench(o, [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  });
  if (!levels.ok()) return Fail(levels.status());
  if (int failed = FinishBenchTrace(tracer->get())) return failed;
  fmt::print("{}", FormatHttpTable(o, *levels));
  if (cmd.write_results) {
    auto dir = CreateRunDirectory(cmd.results_dir,
                                  fmt::format("{}-{}", o.grpc ? "grpc" : "http", o.model));
    if (!dir.ok()) return Fail(dir.status());
    Status written =
        WriteHttpBenchResults(*dir, RunInfo{command_line, TorchRuntimeVersion()}, o, *levels);
    if (!written.ok()) return Fail(written);
    fmt::print(
        "Results: {}/summary.csv\nPlots:   {}/throughput_vs_concurrency.svg\n"
        "         {}/latency_vs_concurrency.svg\n",
        dir->string(), dir->string(), dir->string());
    if (int failed = WriteReport(*dir)) return failed;
  }
  return 0;
}

int RunLlmBenchCommand(const BenchCommand& cmd, const std::string& command_line) {
  LlmBenchOptions o = cmd.llm_options;
  o.url = cmd.url;
  o.model = cmd.model.model;
  o.rates = cmd.http.rates;
  o.seed = cmd.run.seed;
  if (!cmd.concurrency.empty()) o.concurrency = cmd.concurrency;
  if (!o.rates.empty() && cmd.concurrency.empty()) o.concurrency.clear();
  auto run = RunLlmBench(o, [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  });
  if (!run.ok()) return Fail(run.status());
  fmt::print("{}", FormatLlmTable(o, *run));
  if (cmd.write_results) {
    auto dir = CreateRunDirectory(cmd.results_dir, fmt::format("llm-{}", run->model));
    if (!dir.ok()) return Fail(dir.status());
    Status written =
        WriteLlmBenchResults(*dir, RunInfo{command_line, TorchRuntimeVersion()}, o, *run);
    if (!written.ok()) return Fail(written);
    fmt::print("Results: {}/summary.csv\nPlots:   {}/output_tokens.svg, ttft.svg, tpot.svg\n",
               dir->string(), dir->string());
    if (int failed = WriteReport(*dir)) return failed;
  }
  int failed = 0;
  for (const LlmLevelResult& level : run->levels)
    failed += level.summary.requests - level.summary.ok;
  return failed == 0 ? 0 : 1;
}

// A language model's directory: --model-dir, or --model in --model-repository.
std::string LlmModelDir(const ModelSelection& m) {
  return !m.model_dir.empty() ? m.model_dir
                              : (std::filesystem::path(m.model_repository) / m.model).string();
}

// The fixed prompts of --agreement: questions, instructions, code, arithmetic, lists, other
// languages.
const std::vector<std::string>& AgreementPrompts() {
  static const std::vector<std::string> prompts = {
      "The main reasons the Roman Empire declined were",
      "Write a Python function that returns the n-th Fibonacci number.\n\ndef fibonacci(n):",
      "Q: What is 17 multiplied by 23?\nA:",
      "Here is a list of five fruits that are high in vitamin C:\n1.",
      "Explain to a child why the sky is blue.",
      "La capitale de la France est une ville connue pour",
      "In a distributed system, a consensus algorithm such as Raft ensures that",
      "Once upon a time, in a small village by the sea, there lived",
  };
  return prompts;
}

// --agreement: the model at two precisions side by side on AgreementPrompts(), greedy.
int RunLlmAgreement(const BenchCommand& cmd) {
  const ModelSelection& m = cmd.model;
  const std::string dir = LlmModelDir(m);
  llm::LlmLoadOverrides reference_overrides;
  reference_overrides.precision = m.precision.empty() ? "bf16" : m.precision;
  reference_overrides.slots = 1;
  reference_overrides.threads = m.threads > 0 ? m.threads : -1;
  reference_overrides.device = cmd.llm_device;
  llm::LlmLoadOverrides candidate_overrides = reference_overrides;
  // PRECISION[@DEVICE]: bf16@cuda:0 is the model on GPU 0 against the reference on the CPU.
  const size_t at = cmd.agreement.find('@');
  candidate_overrides.precision = cmd.agreement.substr(0, at);
  if (at != std::string::npos) candidate_overrides.device = cmd.agreement.substr(at + 1);
  candidate_overrides.slots = 2;
  auto reference = llm::LoadStepModel(dir, reference_overrides);
  if (!reference.ok()) return Fail(reference.status());
  auto candidate = llm::LoadStepModel(dir, candidate_overrides);
  if (!candidate.ok()) return Fail(candidate.status());
  auto tokenizer = llm::Tokenizer::Load(dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : AgreementPrompts()) prompts.push_back((*tokenizer)->Encode(text));
  const int tokens = cmd.llm_options.output_tokens;
  auto result = llm::ComparePrecisions(**reference, **candidate, prompts, tokens);
  if (!result.ok()) return Fail(result.status());
  fmt::print(
      "{}: {} against {} on {} fixed prompts, {} greedy tokens each\n"
      "  teacher-forced ({} positions): same next token {:.1f}%, logits cosine mean {:.5f}, "
      "min {:.5f}\n"
      "  free-running: identical completions {}/{}, mean common prefix {:.1f} tokens\n",
      dir, cmd.agreement,
      reference_overrides.precision +
          (reference_overrides.device.empty() ? "" : "@" + reference_overrides.device),
      result->prompts, tokens, result->positions,
      100.0 * result->same_next_token / std::max(1, result->positions), result->mean_cosine,
      result->min_cosine, result->identical_completions, result->prompts,
      result->mean_common_prefix);
  return 0;
}

// The engine alone, no HTTP: the same prompts through LlmEngine::Submit, timed at its events. The
// first event of a request is its first token, so its time is the in-process prefill time (plus
// one sampling step) of the prompt, the reference for the TTFT over HTTP. Closed loop, as --url's
// levels: `concurrency` streams, each submitting its next request when one ends, --requests in
// all (default: one a stream).
int RunLlmInProcess(const BenchCommand& cmd) {
  const ModelSelection& m = cmd.model;
  const std::string dir = LlmModelDir(m);
  llm::LlmLoadOverrides overrides;
  overrides.precision = m.precision;
  overrides.threads = m.threads > 0 ? m.threads : -1;
  overrides.device = cmd.llm_device;
  overrides.slots = cmd.llm_slots;
  overrides.max_step_tokens = cmd.llm_max_step_tokens;
  auto engine = llm::LoadLlmEngine(dir, overrides);
  if (!engine.ok()) return Fail(engine.status());
  const LlmBenchOptions& o = cmd.llm_options;
  // Words per prompt until the tokenizer counts prompt_tokens.
  int words = std::max(1, o.prompt_tokens * 3 / 4);
  size_t counted = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    counted = (*engine)->tokenizer().Encode(MakeLlmPrompts(1, words, cmd.run.seed)[0]).size();
    if (static_cast<int>(counted) == o.prompt_tokens) break;
    words = std::max(1, words + (o.prompt_tokens - static_cast<int>(counted)) * 3 / 4 +
                            (o.prompt_tokens > static_cast<int>(counted) ? 1 : -1));
  }
  const std::vector<int> levels = cmd.concurrency.empty() ? std::vector<int>{1} : cmd.concurrency;
  const llm::LlmServeConfig& served = (*engine)->config();
  fmt::print(
      "in-process {} (weights {}, kernels {}; slots {}, step budget {} prompt tokens): prompts "
      "of {} tokens, {} output tokens\n",
      dir, (*engine)->model().weight_formats(), (*engine)->model().kernel_paths(), served.slots,
      served.max_step_tokens, counted, o.output_tokens);
  // Warm-up, untimed: one request through every step shape the levels will use.
  for (int concurrency : {1, *std::max_element(levels.begin(), levels.end())}) {
    Mutex mu;
    CondVar done_cv;
    int remaining = concurrency;
    for (const std::string& prompt : MakeLlmPrompts(concurrency, words, cmd.run.seed + 3)) {
      llm::GenerationRequest request;
      request.prompt = (*engine)->tokenizer().Encode(prompt);
      request.max_tokens = 8;
      request.ignore_eos = true;
      auto id = (*engine)->Submit(std::move(request), [&](const llm::GenerationEvent& e) {
        if (e.finish == llm::FinishReason::kNone) return;
        MutexLock lock(mu);
        --remaining;
        done_cv.SignalAll();
      });
      if (!id.ok()) return Fail(id.status());
    }
    MutexLock lock(mu);
    while (remaining > 0) done_cv.Wait(lock);
  }
  for (int concurrency : levels) {
    const int total = o.requests > 0 ? o.requests : concurrency;
    const auto prompts = MakeLlmPrompts(total, words, cmd.run.seed + 7);
    Mutex mu;
    CondVar done_cv;
    int finished = 0;
    // Per request, seconds from the start: submitted, its first and its latest token.
    std::vector<double> start(static_cast<size_t>(total), 0), first(static_cast<size_t>(total), 0),
        last(static_cast<size_t>(total), 0);
    std::vector<int> tokens(static_cast<size_t>(total), 0);
    std::vector<double> gaps;  // Between a stream's consecutive tokens (inter-token latency).
    const auto t0 = std::chrono::steady_clock::now();
    const auto since_t0 = [t0] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto submit = [&](int i) {
      {
        MutexLock lock(mu);
        start[static_cast<size_t>(i)] = since_t0();
      }
      llm::GenerationRequest request;
      request.prompt = (*engine)->tokenizer().Encode(prompts[static_cast<size_t>(i)]);
      request.max_tokens = o.output_tokens;
      request.ignore_eos = o.ignore_eos;
      request.sampling.temperature = 0;  // Greedy, as the HTTP bench asks.
      return (*engine)
          ->Submit(std::move(request),
                   [&, i](const llm::GenerationEvent& e) {
                     const double now = since_t0();
                     MutexLock lock(mu);
                     const size_t k = static_cast<size_t>(i);
                     if (first[k] == 0) {
                       first[k] = now;
                     } else {
                       gaps.push_back(now - last[k]);
                     }
                     last[k] = now;
                     tokens[k] = e.completion_tokens;
                     if (e.finish != llm::FinishReason::kNone) {
                       ++finished;
                       done_cv.SignalAll();
                     }
                   })
          .status();
    };
    // A stream's next request as soon as one of its requests ends.
    for (int submitted = 0;;) {
      {
        MutexLock lock(mu);
        while (finished < total && !(submitted < total && submitted - finished < concurrency)) {
          done_cv.Wait(lock);
        }
        if (finished == total) break;
      }
      const Status status = submit(submitted++);
      if (!status.ok()) return Fail(status);
    }
    std::vector<double> ttft, tpot;
    int64_t generated = 0;
    double end = 0;
    for (int i = 0; i < total; ++i) {
      const size_t k = static_cast<size_t>(i);
      ttft.push_back(first[k] - start[k]);
      generated += tokens[k];
      end = std::max(end, last[k]);
      if (tokens[k] > 1) tpot.push_back((last[k] - first[k]) / (tokens[k] - 1));
    }
    std::sort(ttft.begin(), ttft.end());
    std::sort(tpot.begin(), tpot.end());
    std::sort(gaps.begin(), gaps.end());
    fmt::print(
        "concurrency {:>3}, {} requests, {} output tokens in {:.3f} s: first token (prefill) "
        "median {:.1f} ms, max {:.1f} ms; TPOT median {:.2f} ms ({:.1f} tokens/s per stream); "
        "ITL p99 {:.2f} ms; {:.1f} output tokens/s overall\n",
        concurrency, total, generated, end, NearestRankPercentile(ttft, 50) * 1e3,
        ttft.back() * 1e3, tpot.empty() ? 0.0 : NearestRankPercentile(tpot, 50) * 1e3,
        tpot.empty() ? 0.0 : 1.0 / NearestRankPercentile(tpot, 50),
        gaps.empty() ? 0.0 : NearestRankPercentile(gaps, 99) * 1e3, generated / end);
  }
  return 0;
}

int RunBench(const BenchCommand& cmd, const std::string& command_line) {
  if ((cmd.llm_slots > 0 || cmd.llm_max_step_tokens > 0) &&
      !(cmd.llm && cmd.in_process && cmd.agreement.empty())) {
    return Fail(Status::InvalidArgument(
        "--llm-slots and --llm-max-step-tokens set the engine of --llm --in-process (without "
        "--agreement); a server's are its own (sluice serve --llm-slots, --llm-max-step-tokens)"));
  }
  if (cmd.llm && !cmd.url.empty()) return RunLlmBenchCommand(cmd, command_line);
  if (!cmd.agreement.empty() && !(cmd.llm && cmd.in_process)) {
    return Fail(Status::InvalidArgument("--agreement needs --llm --in-process"));
  }
  if (cmd.llm && cmd.in_process && !cmd.agreement.empty()) return RunLlmAgreement(cmd);
  if (cmd.llm && cmd.in_process) return RunLlmInProcess(cmd);
  if (cmd.llm) return Fail(Status::InvalidArgument("--llm needs --url URL or --in-process"));
  if (!cmd.url.empty()) return RunHttpBenchCommand(cmd, command_line);
  if (!cmd.in_process) {
    return Fail(Status::InvalidArgument(
        "say what to measure: --in-process (the model in this process) or --url URL"));
  }
  if (cmd.concurrency.size() > 1) {
    return Fail(Status::InvalidArgument("--in-process takes a single --concurrency value"));
  }
  const bool batched = !cmd.concurrency.empty() && cmd.concurrency[0] > 0;
  InProcessOptions pipeline_options = cmd.run;
  if (batched) {
    pipeline_options.batch_size = cmd.samples_per_request;
    pipeline_options.max_in_flight = cmd.concurrency[0];
  }
  auto config = ResolveModel(cmd.model, {pipeline_options.batch_size});
  if (!config.ok()) return Fail(config.status());
  // The ceiling runs full batches: the batched pipeline's best case.
  InProcessOptions ceiling_options = pipeline_options;
  if (batched) {
    ceiling_options.batch_size = config->max_batch_size;
    ceiling_options.max_in_flight = 0;
    const int64_t samples =
        static_cast<int64_t>(pipeline_options.iterations) * pipeline_options.batch_size;
    ceiling_options.iterations =
        static_cast<int>(std::max<int64_t>(1, samples / config->max_batch_size));
    DescribeBatched(*config, pipeline_options);
  } else {
    Describe(*config, cmd.run);
  }
  auto run_pipeline = [&](std::span<BackendInstance* const> instances) {
    return batched ? RunBatchedPipeline(*config, instances, pipeline_options)
                   : RunInProcessPipeline(*config, instances, pipeline_options);
  };
  auto loaded = LoadBackend(*config);
  if (!loaded.ok()) return Fail(loaded.status());
  std::shared_ptr<Backend> backend = std::move(*loaded);
  // The profile is written into the results folder once it exists (made after the run).
  auto profile_log = std::make_shared<ProfileLog>();
  const bool profile = cmd.profile || ProfilerRequestedByEnvironment();
  if (profile) {
    ProfileOptions po = cmd.profile_options;
    po.dir = cmd.results_dir;
    backend = WithProfiler(backend, config->name, po, profile_log);
  }
  // Moves the profile's files into the run's folder (or names where they are).
  auto place_profile = [&](const std::filesystem::path* dir) {
    if (!profile) return;
    auto files = profile_log->files();
    if (files.empty()) {
      fmt::print("Profile: no window completed (fewer than {} model runs after the first {})\n",
                 cmd.profile_options.runs, cmd.profile_options.skip_runs);
    }
    for (const auto& file : files) {
      std::error_code ec;
      if (dir) std::filesystem::rename(file, *dir / file.filename(), ec);
      fmt::print("Profile: {}\n", (dir && !ec ? *dir / file.filename() : file).string());
    }
  };
  std::vector<std::unique_ptr<BackendInstance>> owned;
  auto instances = MakeInstances(*backend, config->instances.workers(), owned);
  if (!instances.ok()) return Fail(instances.status());
  const LoadReport& load = backend->load_report();
  RunInfo info{command_line, load.runtime};

  auto tracer = OpenBenchTrace(cmd);
  if (!tracer.ok()) return Fail(tracer.status());
  if (!cmd.compare_ceiling) {
    auto run = run_pipeline(*instances);
    if (!run.ok()) return Fail(run.status());
    fmt::print("{}", FormatReport(load, *run));
    if (*tracer) TraceInProcessRecords(run->records, config->name, **tracer);
    if (int failed = FinishBenchTrace(tracer->get())) return failed;
    if (cmd.write_results) {
      auto dir = CreateRunDirectory(cmd.results_dir, fmt::format("bench-{}", config->name));
      if (!dir.ok()) return Fail(dir.status());
      Status written = WriteBenchResults(*dir, info, *config, pipeline_options, load, *run);
      if (!written.ok()) return Fail(written);
      fmt::print("Results: {}\n", dir->string());
      place_profile(&*dir);
      if (int failed = WriteReport(*dir)) return failed;
    } else {
      place_profile(nullptr);
    }
    return run->summary.ok_requests == run->summary.requests ? 0 : 1;
  }

  // Ceiling and pipeline alternate, the order flipping every round (A B B A A B ...), so drift
  // of the machine's speed hits both alike.
  std::vector<double> ceiling, pipeline, ratio;
  std::optional<BenchRun> last_pipeline;
  for (int r = 0; r < cmd.rounds; ++r) {
    std::optional<Result<BenchRun>> c, p;
    if (r % 2 == 0) c = RunEngineCeiling(*config, *instances, ceiling_options);
    p = run_pipeline(*instances);
    if (r % 2 == 1) c = RunEngineCeiling(*config, *instances, ceiling_options);
    if (!c->ok()) return Fail(c->status());
    if (!p->ok()) return Fail(p->status());
    const Summary& cs = (*c)->summary;
    const Summary& ps = (*p)->summary;
    ceiling.push_back(cs.samples_per_second);
    pipeline.push_back(ps.samples_per_second);
    ratio.push_back(pipeline.back() / ceiling.back());
    fmt::print(
        "round {}: engine ceiling {:.1f} samples/s ({:.2f} ms per batch of {}), pipeline {:.1f} "
        "samples/s ({:.2f} ms per batch{}), ratio {:.3f}\n",
        r + 1, ceiling.back(), cs.mean_compute_seconds * 1e3, ceiling_options.batch_size,
        pipeline.back(), ps.mean_compute_seconds * 1e3,
        batched ? fmt::format(", mean batch {:.1f}", ps.mean_batch_size) : std::string(),
        ratio.back());
    last_pipeline = std::move(**p);
  }
  fmt::print(
      "median of {} rounds: engine ceiling {:.1f} samples/s, pipeline {:.1f} samples/s, "
      "pipeline/ceiling {:.3f}\n",
      cmd.rounds, Median(ceiling), Median(pipeline), Median(ratio));
  fmt::print("{}", FormatReport(load, *last_pipeline));
  if (*tracer) TraceInProcessRecords(last_pipeline->records, config->name, **tracer);
  if (int failed = FinishBenchTrace(tracer->get())) return failed;
  if (cmd.write_results) {
    auto dir = CreateRunDirectory(cmd.results_dir, fmt::format("ceiling-{}", config->name));
    if (!dir.ok()) return Fail(dir.status());
    Status written = WriteBenchResults(*dir, info, *config, pipeline_options, load, *last_pipeline);
    if (!written.ok()) return Fail(written);
    JsonWriter json;
    json.BeginObject().Key("rounds").BeginArray();
    for (size_t i = 0; i < ratio.size(); ++i) {
      json.BeginObject()
          .Field("ceiling_samples_per_second", ceiling[i])
          .Field("pipeline_samples_per_second", pipeline[i])
          .Field("ratio", ratio[i])
          .EndObject();
    }
    json.EndArray()
        .Field("median_ceiling_samples_per_second", Median(ceiling))
        .Field("median_pipeline_samples_per_second", Median(pipeline))
        .Field("median_ratio", Median(ratio))
        .EndObject();
    written = WriteTextFile(*dir / "ceiling.json", json.str() + "\n");
    if (!written.ok()) return Fail(written);
    fmt::print("Results: {}\n", dir->string());
    place_profile(&*dir);
    if (int failed = WriteReport(*dir)) return failed;
  } else {
    place_profile(nullptr);
  }
  return 0;
}

}  // namespace

CLI::App* AddBenchCommand(CLI::App& parent, BenchCommand& cmd) {
  CLI::App* app = parent.add_subcommand("bench", "Measure a model (in-process)");
  AddModelOptions(*app, cmd.model);
  app->add_flag("--in-process", cmd.in_process,
                "Drive the model in this process: no HTTP, like PyTorch's benchmark server");
  app->add_option("--batch-size,--batch_size,-b", cmd.run.batch_size, "Samples per request")
      ->capture_default_str();
  app->add_option("--iters,--num-iters,--num_iters", cmd.run.iterations,
                  "Timed requests, after one warm-up request")
      ->capture_default_str();
  // Two callbacks rather than one negatable flag on the optional: CLI11 gives such a flag a value
  // (false) even when neither form is on the command line, which overrode the config's
  // `optimize: {freeze: true}` and benchmarked a model the server does not serve.
  app->add_flag_callback(
      "--compile", [&cmd] { cmd.model.compile = true; },
      "TorchScript: freeze + optimize_for_inference (default: the config's optimize.freeze)");
  app->add_flag_callback(
      "--no-compile", [&cmd] { cmd.model.compile = false; },
      "TorchScript: run unfrozen whatever the config says");
  app->add_option("--max-in-flight", cmd.run.max_in_flight,
                  "Requests queued or running at once (0: 2 x workers)");
  app->add_option("--seed", cmd.run.seed, "Seed of the random payloads");
  app->add_option("--concurrency,-c", cmd.concurrency,
                  "In-process: N clients, each with one request in flight, through the dynamic "
                  "batcher. --url: closed-loop levels, e.g. 1,8,32,64")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app->add_option("--url", cmd.url, "Measure a KServe v2 server, e.g. http://127.0.0.1:8000");
  app->add_option("--rate", cmd.http.rates, "--url: open-loop levels in requests/s")
      ->delimiter(',');
  app->add_option("--rate-connections", cmd.http.rate_connections,
                  "--url: connection pool of open-loop levels")
      ->capture_default_str();
  app->add_option("--duration", cmd.duration_seconds, "--url: measured seconds per level")
      ->capture_default_str();
  app->add_option("--warmup", cmd.warmup_seconds, "--url: warm-up seconds per level (excluded)")
      ->capture_default_str();
  app->add_option("--endpoint", cmd.http.endpoint,
                  "--url: v2 (random tensors), predict (base64 image) or predictions "
                  "(raw image)")
      ->check(CLI::IsMember({"v2", "predict", "predictions"}));
  app->add_option("--input", cmd.http.input_file,
                  "--url: PNG/JPEG to send (implies --endpoint predict)");
  app->add_flag("--binary,!--json", cmd.http.binary,
                "--url v2: binary-data extension instead of JSON tensors (--grpc: raw "
                "contents instead of typed)");
  app->add_flag("--grpc", cmd.http.grpc,
                "--url is a KServe v2 gRPC service (host:port): ModelInfer calls");
  app->add_option("--grpc-client", cmd.http.grpc_client,
                  "--grpc: h2 (gRPC's wire format on nghttp2, the leaner) or grpc++ (gRPC C++'s "
                  "asynchronous client)")
      ->capture_default_str()
      ->check(CLI::IsMember({"h2", "grpc++"}));
  app->add_option("--metrics-url", cmd.http.metrics_url,
                  "--grpc: the server's HTTP address, for batch and queue figures from "
                  "its /metrics");
  app->add_flag("--random", cmd.random_payload,
                "--url v2: random tensors shaped from the model's metadata (the default)");
  app->add_option("--samples-per-request,--requests-per-batch", cmd.samples_per_request,
                  "Batched pipeline: samples in each request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-batch-size", cmd.model.max_batch_size,
                  "Batched pipeline: the batcher's max_batch_size (default: config)");
  app->add_option("--max-queue-delay-us", cmd.model.max_queue_delay_us,
                  "Batched pipeline: longest wait for company in microseconds "
                  "(default: config)");
  app->add_flag("--compare-ceiling", cmd.compare_ceiling,
                "Alternate the engine ceiling (model called in a tight loop) with the "
                "pipeline and report the ratio");
  app->add_option("--rounds", cmd.rounds, "Ceiling/pipeline pairs for --compare-ceiling")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--results-dir", cmd.results_dir, "Where results/<run-id>/ goes")
      ->capture_default_str();
  app->add_flag("!--no-results", cmd.write_results, "Print only; write no result files");
  AddProfileOptions(*app, cmd.profile, cmd.profile_options, /*with_dir=*/false);
  app->add_option("--trace", cmd.trace_file,
                  "Write each sampled request's stages to FILE (Chrome/Perfetto trace JSON); "
                  "with --url, sampled requests carry a traceparent");
  app->add_option("--trace-sample-rate", cmd.trace_sample_rate, "--trace: fraction traced")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_flag("--llm", cmd.llm,
                "A language model: streamed /v1/completions against --url (any "
                "OpenAI-compatible server), or the engine --in-process");
  app->add_option("--prompt-tokens", cmd.llm_options.prompt_tokens,
                  "--llm: prompt length in the server's tokens")
      ->capture_default_str();
  app->add_option("--shared-prefix-tokens", cmd.llm_options.shared_prefix_tokens,
                  "--llm: of the prompt, a preamble every request shares (a system prompt); "
                  "the table adds the server's prefix-cache hit rate");
  app->add_option("--turns", cmd.llm_options.turns,
                  "--llm: conversations of this many requests per stream, each resending the "
                  "history with its answer and a new message")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--output-tokens", cmd.llm_options.output_tokens,
                  "--llm: tokens generated per request")
      ->capture_default_str();
  app->add_option("--requests", cmd.llm_options.requests,
                  "--llm: requests per level (default max(8, 2 x concurrency); 16 per rate; "
                  "--in-process: one a stream)");
  app->add_option("--api-key", cmd.llm_options.api_key, "--llm: sent as a Bearer token");
  app->add_flag("!--no-ignore-eos", cmd.llm_options.ignore_eos,
                "--llm: let the model stop at its end-of-sequence token");
  app->add_option("--agreement", cmd.agreement,
                  "--llm --in-process: compare this precision (PRECISION[@DEVICE], e.g. "
                  "bf16@cuda:0) with --precision's (default bf16) on a fixed prompt set: greedy "
                  "choices and logits, --output-tokens each")
      ->check([](const std::string& value) -> std::string {
        const std::string precision = value.substr(0, value.find('@'));
        if (precision == "fp32" || precision == "bf16" || precision == "int8" ||
            precision == "int4") {
          return "";
        }
        return "must be fp32, bf16, int8 or int4, optionally @DEVICE (int4@cuda:0)";
      });
  app->add_option("--llm-slots", cmd.llm_slots,
                  "--llm --in-process: the engine's sequences run together (at most), over "
                  "config.yaml's (streams beyond them wait for a slot)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--llm-max-step-tokens", cmd.llm_max_step_tokens,
                  "--llm --in-process: prompt tokens per step beside decoding streams, over "
                  "config.yaml's")
      ->check(CLI::Range(1, 8192));
  app->add_option("--llm-device", cmd.llm_device,
                  "--llm --in-process: run the model on this device (cpu, cuda, cuda:N; "
                  "default: its config.yaml's instance_group)");

  return app;
}

int RunBenchCommand(BenchCommand& cmd, const std::string& command_line) {
  cmd.http.duration = Seconds(cmd.duration_seconds);
  cmd.http.warmup = Seconds(cmd.warmup_seconds);
  cmd.http.seed = cmd.run.seed;
  return RunBench(cmd, command_line);
}

}  // namespace sluice
