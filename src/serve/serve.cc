// The serve command's lifecycle: signals, model loading, HTTP, graceful shutdown.
#include "serve/serve.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "config/model_config.h"
#include "console/console.h"
#include "http/anthropic_handlers.h"
#include "http/openai_handlers.h"
#include "http/responses_handlers.h"
#include "http/predict_handlers.h"
#include "http/repository_handlers.h"
#include "http/v2_handlers.h"
#include "llm/files/model_source.h"
#include "llm/llm_config.h"
#include "metrics/prometheus.h"
#include "service/model_repository.h"
#include "service/v2_service.h"

namespace sluice {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t written = write(g_signal_pipe[1], &byte, 1);
}

// Waits for a termination signal, at most `timeout` when given; returns its number, or 0 when
// the timeout passed first.
int WaitForSignal(std::optional<Seconds> timeout) {
  const auto until = Clock::Real().Now() +
                     std::chrono::duration_cast<Clock::duration>(timeout.value_or(Seconds(0)));
  while (true) {
    int wait_ms = -1;
    if (timeout) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::Real().Now());
      if (left.count() <= 0) return 0;
      wait_ms = static_cast<int>(left.count());
    }
    pollfd readable{.fd = g_signal_pipe[0], .events = POLLIN, .revents = 0};
    if (poll(&readable, 1, wait_ms) <= 0) continue;  // EINTR or the timeout: checked above.
    unsigned char signal = 0;
    if (read(g_signal_pipe[0], &signal, 1) == 1) return signal;
  }
}

// A served name given by a model id: "org/name" or "org/name:TAG", each part a valid name.
bool IsValidSourceName(std::string_view name) {
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos) return IsValidModelName(name);
  std::string_view rest = name.substr(slash + 1);
  const size_t colon = rest.find(':');
  return IsValidModelName(name.substr(0, slash)) && IsValidModelName(rest.substr(0, colon)) &&
         (colon == std::string_view::npos || IsValidModelName(rest.substr(colon + 1)));
}

Result<ModelLocations> ModelLocationsOf(const ServeOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!options.source.empty()) {
    if (!options.model_dir.empty()) {
      return Status::InvalidArgument("serve a model source or --model-dir, not both");
    }
    auto source = llm::ResolveModelSource(options.source, llm::HubEnvironment());
    if (!source.ok()) return source.status();
    const std::string name = options.model_name.empty() ? source->name : options.model_name;
    if (!IsValidSourceName(name)) {
      return Status::InvalidArgument(fmt::format(
          "cannot serve '{}' under the name '{}': use letters, digits, '_', '.', '-' (and one "
          "'/' between an organisation and a model); --model-name picks another",
          options.source, name));
    }
    if (!options.models.empty() && options.models != std::vector<std::string>{name}) {
      return Status::InvalidArgument("--model cannot name other models beside a model source");
    }
    return ModelLocations{.repository = source->path, .single_model_name = name};
  }
  if (!options.model_dir.empty()) {
    if (!fs::is_directory(options.model_dir, ec)) {
      return Status::InvalidArgument(
          fmt::format("--model-dir '{}' is not a directory", options.model_dir));
    }
    std::string name = options.model_name;
    if (name.empty()) name = fs::path(options.model_dir).lexically_normal().filename().string();
    if (name.empty()) {
      name = fs::path(options.model_dir).lexically_normal().parent_path().filename().string();
    }
    if (!IsValidModelName(name)) {
      return Status::InvalidArgument(fmt::format(
          "--model-name '{}' is not a valid model name ([A-Za-z0-9_.-], not starting with '.')",
          name));
    }
    if (!options.models.empty() && options.models != std::vector<std::string>{name}) {
      return Status::InvalidArgument("--model cannot name other models with --model-dir");
    }
    return ModelLocations{.repository = options.model_dir, .single_model_name = name};
  }
  if (!options.model_name.empty()) {
    return Status::InvalidArgument("--model-name needs --model-dir (a single model's directory)");
  }
  if (!fs::is_directory(options.model_repository, ec)) {
    return Status::InvalidArgument(
        fmt::format("model repository '{}' is not a directory", options.model_repository));
  }
  return ModelLocations{.repository = options.model_repository, .single_model_name = {}};
}

}  // namespace

Status RunServer(const ServeOptions& options, const BackendLoader& loader,
                 const llm::LlmLoader& llm_loader, const llm::LlmSizer& llm_sizer) {
  // Termination signals: a handler (async-signal-safe) writes the signal number to a pipe that
  // this thread reads. A handler, not a blocked mask, because libraries start threads before
  // main() (OpenBLAS's pool) and a process signal may be delivered to any of them.
  if (pipe(g_signal_pipe) != 0) return Status::Internal("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  Result<ModelLocations> locations = ModelLocationsOf(options);
  if (!locations.ok()) return locations.status();
  std::vector<std::string> names =
      options.models.empty() ? locations->TensorModels() : options.models;
  // Language models: every one in the repository (or those named), each its own engine.
  std::vector<std::string> llm_names =
      options.models.empty() ? locations->LanguageModels() : std::vector<std::string>();
  for (const std::string& name : options.models) {
    if (llm::IsLanguageModelDir(locations->DirOf(name).string())) llm_names.push_back(name);
  }
  std::erase_if(names, [&](const std::string& name) {
    return std::find(llm_names.begin(), llm_names.end(), name) != llm_names.end();
  });
  if (!locations->single_model_name.empty() && names.empty() && llm_names.empty()) {
    return Status::InvalidArgument(
        fmt::format("'{}' holds neither a config.yaml nor a language model",
                    options.source.empty() ? options.model_dir : locations->repository.string()));
  }
  if (!llm_names.empty() && !llm_loader) {
    return Status::InvalidArgument("this build cannot serve language models");
  }
  Engine engine(loader);
  // Set once the HTTP server exists; read by /metrics and by the console's sampling thread.
  std::atomic<HttpServer*> server_ptr{nullptr};
  auto http_stats = [&server_ptr] {
    HttpServer* server = server_ptr.load(std::memory_order_acquire);
    return server ? server->stats() : HttpStats{};
  };
  V2Service service(engine);
  V2Handlers handlers(service, http_stats);
  auto decode_pool = std::make_unique<ThreadPool>(options.decode_threads, 4096);
  PredictHandlers predict(engine, *decode_pool, options.predict_model);
  // One thread: loads and unloads run one at a time, in the order asked.
  auto control_pool = std::make_unique<ThreadPool>(1, 16);
  // The one model repository every front (HTTP, gRPC, the console) loads and unloads through.
  ModelRepository repository(
      engine, service, *control_pool,
      {.models = *locations,
       .model_control = options.model_control,
       .llm_loader = llm_loader,
       .autoload = options.autoload && llm_loader != nullptr,
       .keep_alive = std::chrono::duration_cast<std::chrono::milliseconds>(options.keep_alive),
       .load_wait = std::chrono::duration_cast<std::chrono::milliseconds>(options.load_wait),
       .max_loaded_models = options.max_loaded_models,
       .llm_sizer = llm_sizer,
       .max_model_memory = options.max_model_memory,
       .available_memory = nullptr,
       .on_tensor_model_loaded =
           [&predict](const std::string& name, const std::filesystem::path& dir) {
             predict.SetLabels(name, LoadLabels((dir / "labels.txt").string()));
           }});
  // The LLM fronts serve the repository's language models, loaded through it as any later load.
  OpenAiHandlers openai(repository.generation_service());
  std::shared_ptr<llm::KvEventPublisher> kv_events;
  if (!options.kv_events.endpoint.empty()) {
    auto started = llm::KvEventPublisher::Start(options.kv_events);
    if (!started.ok()) return started.status();
    kv_events = std::move(*started);
    openai.service().SetKvEvents(kv_events);
    fmt::print("KV events on {}{}\n", kv_events->endpoint(),
               kv_events->replay_endpoint().empty()
                   ? ""
                   : fmt::format(", replay on {}", kv_events->replay_endpoint()));
  }
  AnthropicHandlers anthropic(openai.service());
  ResponsesHandlers responses(openai.service(), options.responses_store);

  // Language models first, and each must load: one that cannot stops the start.
  for (const std::string& name : llm_names) {
    SLUICE_RETURN_IF_ERROR(repository.LoadLanguageModel(name));
  }
  for (const std::string& name : names) {
    Status status = repository.LoadModel(name);
    if (!status.ok() && status.code() == StatusCode::kNotFound) {
      spdlog::error("model '{}' not loaded: {}", name, status.message());
      service.SetLoadError(name, status.message());
    }
  }

  repository.Start();  // Language models on demand, from here on.

  Router router;
  handlers.AddRoutes(router);
  openai.AddRoutes(router);
  anthropic.AddRoutes(router);
  responses.AddRoutes(router);
  // Language models may be loaded later (the repository API): their series from then on.
  handlers.AddExtraMetrics([&openai] { return openai.RenderMetrics(); });
  // The HTTP server, the only reader of /metrics, stops before the pool goes.
  handlers.AddExtraMetrics([pool = decode_pool.get()] {
    PrometheusWriter w;
    w.Family("sluice_decode_pool_wakeups_total", "counter",
             "Times an image-decode thread waiting for work was woken: a thread hand-off each.");
    w.Sample("sluice_decode_pool_wakeups_total", "", static_cast<double>(pool->wakeups()));
    return w.text();
  });
  predict.AddRoutes(router);
  RepositoryHandlers repository_handlers(repository);
  repository_handlers.AddRoutes(router);
  std::unique_ptr<Console> console;
  if (options.console) {
    console =
        std::make_unique<Console>(Console::ServerCounters(engine, http_stats, &openai.service()));
    console->AddRoutes(router);
  }
  std::unique_ptr<GrpcServer> grpc;
  if (options.grpc_port) {
    GrpcServerOptions grpc_options;
    grpc_options.host = options.http.host;
    grpc_options.port = *options.grpc_port;
    grpc_options.api_key = options.http.api_key;
    grpc_options.max_message_bytes = options.grpc_max_message_bytes;
    grpc_options.memory_budget_bytes = options.http.memory_budget_bytes > 0
                                           ? options.http.memory_budget_bytes
                                           : MemoryBudget::DefaultLimit();
    if (options.model_control) {
      grpc_options.model_control = [&repository](const std::string& name, bool load,
                                                 std::function<void(Status)> done) {
        repository.Change(name, load, std::move(done));
      };
    }
    grpc_options.repository_index = [&repository](bool ready_only) {
      std::vector<GrpcServerOptions::IndexEntry> out;
      for (auto& entry : repository.IndexEntries(ready_only)) {
        out.push_back({std::move(entry.name), std::move(entry.version), std::move(entry.state),
                       std::move(entry.reason)});
      }
      return out;
    };
    grpc = std::make_unique<GrpcServer>(std::move(grpc_options), service);
    SLUICE_RETURN_IF_ERROR(grpc->Start());
    handlers.AddExtraMetrics([&grpc] { return grpc->RenderMetrics(); });
    fmt::print("Sluice gRPC listening on {}:{}\n", options.http.host, grpc->port());
  }
  std::unique_ptr<TraceWriter> tracer;
  HttpServerOptions http_options = options.http;
  if (!options.trace_file.empty()) {
    auto opened = TraceWriter::Open({.path = options.trace_file,
                                     .sample_rate = options.trace_sample_rate,
                                     .process_name = "sluice serve",
                                     .max_bytes = options.trace_max_bytes});
    if (!opened.ok()) return opened.status();
    tracer = std::move(*opened);
    http_options.tracer = tracer.get();
  }
  HttpServer server(http_options, router);
  server_ptr.store(&server, std::memory_order_release);
  // The console's sampler reads the server's statistics: it stops before the server goes,
  // whichever way this function returns (a server that fails to start included).
  struct StopFirst {
    Console* console;
    ~StopFirst() {
      if (console) console->Stop();
    }
  } stop_console_first{console.get()};
  SLUICE_RETURN_IF_ERROR(server.Start());
  fmt::print("Sluice listening on http://{}:{}\n", options.http.host, server.port());
  if (console) {
    fmt::print("console: http://{}:{}/\n",
               options.http.host == "0.0.0.0" ? "127.0.0.1" : options.http.host, server.port());
  }
  std::fflush(stdout);

  const int signal = WaitForSignal(std::nullopt);
  service.SetShuttingDown();
  if (options.drain_delay.count() > 0) {
    // Readiness fails first, while requests are still answered: Kubernetes removes the pod from
    // its endpoints (and a load balancer's health check marks it down) asynchronously.
    server.CloseConnectionsAfterResponses();
    fmt::print("received signal {}: not ready; still serving for {:g} s before closing\n", signal,
               options.drain_delay.count());
    std::fflush(stdout);
    const int second = WaitForSignal(options.drain_delay);
    if (second != 0) fmt::print("received signal {}: ending the drain delay\n", second);
  }
  fmt::print("received signal {}: finishing in-flight requests\n", signal);
  std::fflush(stdout);
  if (console) console->Stop();  // Its event streams never end by themselves.
  // Stop taking connections and answer every request already read; then drain the engine (the
  // server stays alive, so late completions still have a loop to post to), then close.
  // Both servers wind down at once, each with the whole grace.
  const auto grace = std::chrono::duration_cast<Clock::duration>(options.shutdown_grace);
  std::thread grpc_shutdown;
  if (grpc) grpc_shutdown = std::thread([&grpc, grace] { grpc->Shutdown(grace); });
  server.Shutdown(grace);
  if (grpc_shutdown.joinable()) grpc_shutdown.join();
  repository.Stop();  // No autoload or idle unload after this.
  control_pool.reset();        // Finishes a load or unload under way.
  decode_pool.reset();   // Joins decode tasks (they refer to the handlers) before they go.
  engine.Stop(StopMode::kDrain);
  for (auto& [name, llm_engine] : openai.service().models()) llm_engine->Stop();
  server_ptr.store(nullptr, std::memory_order_release);
  if (tracer) {
    SLUICE_RETURN_IF_ERROR(tracer->Close());
    fmt::print("trace: {} request(s) in {}\n", tracer->written(), options.trace_file);
  }
  return Status::Ok();
}

}  // namespace sluice
