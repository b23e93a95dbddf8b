// The serve command's lifecycle: signals, model loading, HTTP, graceful shutdown.
#include "server/serve.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "config/model_config.h"
#include "llm/llm_config.h"
#include "server/openai_handlers.h"
#include "server/predict_handlers.h"
#include "server/repository_handlers.h"
#include "server/v2_handlers.h"

namespace sluice {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t written = write(g_signal_pipe[1], &byte, 1);
}

}  // namespace

Status RunServer(const ServeOptions& options, const BackendLoader& loader,
                 const llm::LlmLoader& llm_loader) {
  // Termination signals: a handler (async-signal-safe) writes the signal number to a pipe that
  // this thread reads. A handler, not a blocked mask, because libraries start threads before
  // main() (OpenBLAS's pool) and a process signal may be delivered to any of them.
  if (pipe(g_signal_pipe) != 0) return Status::Internal("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  namespace fs = std::filesystem;
  const fs::path repository = options.model_repository;
  std::error_code ec;
  if (!fs::is_directory(repository, ec)) {
    return Status::InvalidArgument(
        fmt::format("model repository '{}' is not a directory", repository.string()));
  }
  std::vector<std::string> names =
      options.models.empty() ? ListRepositoryModels(repository) : options.models;
  // Language models: every one in the repository (or those named), each its own engine.
  std::map<std::string, std::shared_ptr<llm::LlmEngine>> language_models;
  std::vector<std::string> llm_names =
      options.models.empty() ? ListLanguageModels(repository) : std::vector<std::string>();
  for (const std::string& name : options.models) {
    if (llm::IsLanguageModelDir((repository / name).string())) llm_names.push_back(name);
  }
  std::erase_if(names, [&](const std::string& name) {
    return std::find(llm_names.begin(), llm_names.end(), name) != llm_names.end();
  });
  for (const std::string& name : llm_names) {
    if (!llm_loader) return Status::InvalidArgument("this build cannot serve language models");
    auto engine = llm_loader((repository / name).string());
    if (!engine.ok()) {
      return Status(engine.status().code(),
                    fmt::format("language model '{}': {}", name, engine.status().message()));
    }
    fmt::print("language model '{}' ready: {} slots x {} tokens, {}\n", name,
               (*engine)->model().slots(), (*engine)->model().context_length(),
               llm::LlmPrecisionName((*engine)->config().precision));
    language_models.emplace(name, std::move(*engine));
  }
  OpenAiHandlers openai(language_models);

  Engine engine(loader);
  HttpServer* server_ptr = nullptr;
  V2Handlers handlers(engine,
                      [&server_ptr] { return server_ptr ? server_ptr->stats() : HttpStats{}; });
  auto decode_pool = std::make_unique<ThreadPool>(options.decode_threads, 4096);
  PredictHandlers predict(engine, *decode_pool, options.predict_model);
  // One thread: loads and unloads run one at a time, in the order asked.
  auto control_pool = std::make_unique<ThreadPool>(1, 16);
  RepositoryHandlers repository_handlers(engine, handlers, predict, *control_pool,
                                         {repository, options.model_control});
  for (const std::string& name : names) {
    Status status = repository_handlers.LoadModel(name);
    if (!status.ok() && status.code() == StatusCode::kNotFound) {
      handlers.SetLoadError(name, status.message());
    }
  }

  Router router;
  handlers.AddRoutes(router);
  openai.AddRoutes(router);
  if (!openai.empty()) handlers.AddExtraMetrics([&openai] { return openai.RenderMetrics(); });
  predict.AddRoutes(router);
  repository_handlers.AddRoutes(router);
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
    GrpcModelSource source;
    source.engine = &engine;
    source.load_error = [&handlers](const std::string& model) { return handlers.LoadError(model); };
    source.ready = [&handlers] { return !handlers.HasLoadErrors(); };
    grpc = std::make_unique<GrpcServer>(std::move(grpc_options), std::move(source));
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
  server_ptr = &server;
  SLUICE_RETURN_IF_ERROR(server.Start());
  fmt::print("Sluice listening on http://{}:{}\n", options.http.host, server.port());
  std::fflush(stdout);

  unsigned char signal = 0;
  while (read(g_signal_pipe[0], &signal, 1) < 0 && errno == EINTR) {
  }
  fmt::print("received signal {}: finishing in-flight requests\n", signal);
  std::fflush(stdout);
  // Stop taking connections and answer every request already read; then drain the engine (the
  // server stays alive, so late completions still have a loop to post to), then close.
  // Both servers wind down at once, each with the whole grace.
  const auto grace = std::chrono::duration_cast<Clock::duration>(options.shutdown_grace);
  std::thread grpc_shutdown;
  if (grpc) grpc_shutdown = std::thread([&grpc, grace] { grpc->Shutdown(grace); });
  server.Shutdown(grace);
  if (grpc_shutdown.joinable()) grpc_shutdown.join();
  control_pool.reset();  // Finishes a load or unload under way.
  decode_pool.reset();   // Joins decode tasks (they refer to the handlers) before they go.
  engine.Stop(StopMode::kDrain);
  for (auto& [name, llm_engine] : language_models) llm_engine->Stop();
  server_ptr = nullptr;
  if (tracer) {
    SLUICE_RETURN_IF_ERROR(tracer->Close());
    fmt::print("trace: {} request(s) in {}\n", tracer->written(), options.trace_file);
  }
  return Status::Ok();
}

}  // namespace sluice
