// `sluice serve`: flags and the backends it loads.
#include "serve_command.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "backends/load_backend.h"
#include "backends/profiler.h"
#include "bench/results.h"

namespace sluice {

CLI::App* AddServeCommand(CLI::App& parent, ServeCommand& cmd) {
  CLI::App* app = parent.add_subcommand(
      "serve",
      "Serve a model repository over HTTP (KServe v2 REST; OpenAI-style /v1 for language models)");
  app->add_option("source", cmd.options.source,
                  "One model instead of a repository: a GGUF file, a model's folder, or a "
                  "Hugging Face model id in the local cache (org/name, org/name:Q4_K_M for one "
                  "of a repository's GGUF files; HF_HUB_CACHE or HF_HOME, nothing downloaded)");
  app->add_option("--model-repository", cmd.options.model_repository, "Directory of models")
      ->capture_default_str();
  app->add_option("--model,-m", cmd.options.models, "Serve only these models (repeatable)");
  app->add_option("--model-dir", cmd.options.model_dir,
                  "Serve one model's own directory (config.yaml or a language model's files at "
                  "its root, as KServe mounts /mnt/models) instead of a repository");
  app->add_option("--model-name", cmd.options.model_name,
                  "--model-dir or a source: the name to serve it under (default: the "
                  "directory's name, the file's stem, the model id)");
  app->add_option("--host", cmd.options.http.host, "Address to bind")->capture_default_str();
  app->add_option("--port,-p", cmd.options.http.port, "Port; 0 picks a free one")
      ->capture_default_str();
  app->add_option("--io-threads", cmd.options.http.io_threads,
                  "HTTP I/O threads, each with its own event loop; connections are dealt to "
                  "them in turn")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--decode-threads", cmd.options.decode_threads,
                  "Image decode threads for /predict and /predictions")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--llm-device", cmd.llm_overrides.device,
                  "Language models' device: cpu, cuda or cuda:N (default: each config.yaml's "
                  "instance_group; cpu)");
  app->add_option("--llm-precision", cmd.llm_overrides.precision,
                  "Language models' precision, over their config.yaml (fp32, bf16, int8; int4 "
                  "on a GPU)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4"}));
  app->add_option("--llm-slots", cmd.llm_overrides.slots,
                  "Language models' sequences run together (at most), over their config.yaml")
      ->check(CLI::Range(1, 1024));
  app->add_option("--llm-kv-cache-bytes", cmd.llm_overrides.kv_cache_bytes,
                  "Language models' paged KV cache in bytes (0: slots x context), over their "
                  "config.yaml")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--llm-threads", cmd.llm_overrides.threads,
                  "Language models' intra-op threads (0: every core)")
      ->check(CLI::Range(0, 1024));
  app->add_option("--llm-max-step-tokens", cmd.llm_overrides.max_step_tokens,
                  "Language models' prompt tokens per step beside decoding streams, over their "
                  "config.yaml")
      ->check(CLI::Range(1, 8192));
  app->add_option("--llm-speculative-tokens", cmd.llm_overrides.speculative_tokens,
                  "Language models' prompt-lookup drafts per step (0: off), over their config.yaml")
      ->check(CLI::Range(0, 64));
  app->add_option("--llm-prefix-caching", cmd.llm_overrides.prefix_caching,
                  "Language models' prefix caching (on, off), over their config.yaml")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_option("--llm-context-length", cmd.llm_overrides.context_length,
                  "Language models' tokens per sequence (prompt + output), over their config.yaml")
      ->check(CLI::Range(2, 1 << 20));
  app->add_option("--llm-kv-cache-dtype", cmd.llm_overrides.kv_cache_dtype,
                  "Language models' KV cache (auto, fp32, bf16, q8_0), over their config.yaml")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "q8_0"}));
  app->add_option("--llm-weights-cache", cmd.llm_overrides.weights_cache,
                  "Folder for GGUF models' repacked weights: later starts, and every server on "
                  "this machine serving the same file, map them instead of repacking")
      ->check(CLI::NonexistentPath | CLI::ExistingDirectory);
  app->add_option("--llm-kv-cache-disk", cmd.llm_overrides.kv_cache_disk,
                  "Folder for language models' prefix cache on disk: every full KV block is kept "
                  "there too, and a prompt whose prefix memory no longer holds (evicted, or "
                  "after a restart) reads it back instead of computing it")
      ->check(CLI::NonexistentPath | CLI::ExistingDirectory);
  app->add_option("--llm-kv-cache-disk-bytes", cmd.llm_overrides.kv_cache_disk_bytes,
                  "--llm-kv-cache-disk: its bound (least recently used blocks out first; with a "
                  "unit, 16GiB, the default)")
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--predict-model", cmd.options.predict_model,
                  "Model behind /predict (default: the first with preprocess.image)");
  app->add_option("--max-body-bytes", cmd.options.http.max_body_bytes,
                  "Larger bodies get 413 (bytes, or with a unit: 64MiB)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--max-header-bytes", cmd.options.http.max_header_bytes,
                  "Larger headers get 431 (bytes, or with a unit: 16KiB)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--memory-budget", cmd.options.http.memory_budget_bytes,
                  "Bytes of request bodies and decoded tensors in flight, server-wide (e.g. "
                  "512MiB, 4GiB; default: a quarter of the machine's memory); a body that does "
                  "not fit gets 503 with Retry-After before it is read")
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--max-connections", cmd.options.http.max_connections,
                  "Open connections beyond which new ones are closed")
      ->capture_default_str();
  app->add_option("--idle-timeout", cmd.idle_seconds,
                  "Seconds a connection may wait for a complete request")
      ->capture_default_str();
  app->add_option("--header-timeout", cmd.header_seconds,
                  "Seconds from a request's first byte to its complete header (408)")
      ->capture_default_str();
  app->add_option("--body-timeout", cmd.body_seconds,
                  "Seconds from the header to the complete body (408)")
      ->capture_default_str();
  app->add_option("--api-key", cmd.options.http.api_key,
                  "Require this key (Authorization: Bearer or X-API-Key) on every route but "
                  "health")
      ->envname("SLUICE_API_KEY");
  app->add_option("--grpc-port", cmd.options.grpc_port,
                  "Also serve KServe v2 over gRPC on this port of --host (0 picks a free one; "
                  "off unless given)")
      ->check(CLI::Range(0, 65535));
  app->add_option("--grpc-max-message-bytes", cmd.options.grpc_max_message_bytes,
                  "Larger gRPC messages fail with RESOURCE_EXHAUSTED (bytes, or with a unit)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_flag("--model-control", cmd.options.model_control,
                "Allow POST /v2/repository/models/{model}/load and /unload (off: 403)");
  app->add_flag("--no-autoload{false}", cmd.options.autoload,
                "Do not load a language model of the repository when a request names it (on: "
                "the request waits for the load, --load-wait at most)");
  app->add_option("--keep-alive", cmd.keep_alive_seconds,
                  "Seconds a language model loaded by a request stays loaded when idle (0: "
                  "until unloaded)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--load-wait", cmd.load_wait_seconds,
                  "Seconds a request waits for its language model's load at most; then, or "
                  "with 0, it is answered 503 with Retry-After while the model loads")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--max-loaded-models", cmd.options.max_loaded_models,
                  "Language models loaded at once at most; the least recently used idle one is "
                  "unloaded to load another (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--max-model-memory", cmd.options.max_model_memory,
                  "Memory the loaded language models may take together, by their estimates "
                  "(weights and a full KV cache; with a unit, 8GiB); past it the least recently "
                  "used idle ones are unloaded first, or the load is refused (0: the memory the "
                  "machine or container has left)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--kv-events", cmd.options.kv_events.endpoint,
                  "Publish language models' KV cache events (vLLM's ZeroMQ format) on this "
                  "address: bound where it has '*' (tcp://*:5557), else connected (off unless "
                  "given)");
  app->add_option("--kv-events-replay", cmd.options.kv_events.replay_endpoint,
                  "--kv-events: answer replay requests for missed batches on this address "
                  "(tcp://*:5558)");
  app->add_option("--kv-events-topic", cmd.options.kv_events.topic,
                  "--kv-events: the messages' topic; {model} stands for the model's name (use it "
                  "where several language models are served)");
  app->add_option("--kv-events-buffer", cmd.options.kv_events.buffer_steps,
                  "--kv-events-replay: batches kept for replay")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  app->add_flag("--no-console{false}", cmd.options.console,
                "Do not serve the browser console at / (dashboard, try-out, chat, bench)");
  AddProfileOptions(*app, cmd.profile.on, cmd.profile.options, /*with_dir=*/true);
  app->add_option("--trace", cmd.options.trace_file,
                  "Write each sampled request's stages to FILE (Chrome/Perfetto trace JSON)");
  app->add_option("--trace-sample-rate", cmd.options.trace_sample_rate,
                  "--trace: fraction of requests traced (a traceparent marked sampled always is)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--trace-max-bytes", cmd.options.trace_max_bytes,
                  "--trace: the file's size limit; later requests are dropped (bytes, or with "
                  "a unit)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--responses-store-max", cmd.options.responses_store.max_count,
                  "The Responses API keeps at most this many responses (store: true) for "
                  "previous_response_id and GET /v1/responses/{id}; the least recently used go")
      ->capture_default_str();
  app->add_option("--responses-store-bytes", cmd.options.responses_store.max_bytes,
                  "The Responses API's stored responses take at most this much memory (bytes, or "
                  "with a unit); the least recently used go")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--drain-delay", cmd.drain_seconds,
                  "Seconds after SIGTERM/SIGINT during which readiness fails but requests are "
                  "still taken and answered (with Connection: close), before the listener closes")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app->add_option("--shutdown-grace", cmd.grace_seconds,
                  "Seconds to finish in-flight requests once the listener closes")
      ->capture_default_str();
  return app;
}

int RunServeCommand(ServeCommand& cmd) {
  ServeOptions& options = cmd.options;
  options.http.idle_timeout = Seconds(cmd.idle_seconds);
  options.http.header_timeout = Seconds(cmd.header_seconds);
  options.http.body_timeout = Seconds(cmd.body_seconds);
  options.drain_delay = Seconds(cmd.drain_seconds);
  options.shutdown_grace = Seconds(cmd.grace_seconds);
  options.keep_alive = Seconds(cmd.keep_alive_seconds);
  options.load_wait = Seconds(cmd.load_wait_seconds);
  ProfileSwitch& profile = cmd.profile;
  BackendLoader loader = LoadSharedBackend;
  auto profile_log = std::make_shared<ProfileLog>();
  if (profile.on || ProfilerRequestedByEnvironment()) {
    if (profile.options.dir.empty()) {
      auto dir = CreateRunDirectory("results", "profile-serve");
      if (!dir.ok()) return Fail(dir.status());
      profile.options.dir = *dir;
    }
    fmt::print("profiling runs {}-{} of each model instance into {}\n",
               profile.options.skip_runs + 1, profile.options.skip_runs + profile.options.runs,
               profile.options.dir.string());
    loader = [options = profile.options,
              profile_log](const ModelConfig& config) -> Result<std::shared_ptr<Backend>> {
      auto backend = LoadSharedBackend(config);
      if (!backend.ok()) return backend.status();
      return WithProfiler(*backend, config.name, options, profile_log);
    };
  }
  Status status = RunServer(
      options, loader,
      [&](const std::string& dir) { return llm::LoadLlmEngine(dir, cmd.llm_overrides); },
      [&](const std::string& dir) { return llm::EstimateLlmMemory(dir, cmd.llm_overrides); });
  for (const auto& file : profile_log->files()) fmt::print("profile: {}\n", file.string());
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace sluice
