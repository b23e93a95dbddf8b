// The browser console's routes and the dashboard's event stream.
#include "console/console.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>

#include "bench/utilization.h"
#include "common/json_writer.h"
#include "engine/engine.h"
#include "llm/generation_service.h"

namespace sluice {
namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

double Rate(double earlier, double later, double seconds) {
  return seconds > 0 ? std::max(0.0, later - earlier) / seconds : 0;
}

int64_t ResponsesWith(const HttpStats& stats, int status) {
  for (const auto& [code, count] : stats.responses_by_status) {
    if (code == status) return count;
  }
  return 0;
}

int64_t AllResponses(const HttpStats& stats) {
  int64_t total = 0;
  for (const auto& [code, count] : stats.responses_by_status) total += count;
  return total;
}

// Requests answered with `http_status`, of a model's outcomes.
int64_t OutcomesWith(const ModelStatsSnapshot& stats, int http_status) {
  int64_t total = 0;
  for (int code = 0; code < kStatusCodeCount; ++code) {
    if (HttpStatusFor(static_cast<StatusCode>(code)) == http_status) {
      total += stats.requests_by_outcome[code];
    }
  }
  return total;
}

// The interval's mean of a histogram (batch sizes), 0 when it saw nothing.
double IntervalMean(const HistogramSnapshot& earlier, const HistogramSnapshot& later) {
  const uint64_t count = later.count - std::min(later.count, earlier.count);
  return count == 0 ? 0 : (later.sum - earlier.sum) / static_cast<double>(count);
}

template <class T>
const T* Previous(const std::vector<std::pair<std::string, T>>& all, const std::string& name) {
  for (const auto& [n, value] : all) {
    if (n == name) return &value;
  }
  return nullptr;
}

const ConsoleCounters::LanguageModel* PreviousLanguageModel(const ConsoleCounters& counters,
                                                            const std::string& name) {
  for (const auto& model : counters.language_models) {
    if (model.name == name) return &model;
  }
  return nullptr;
}

constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// A validator per build, computed once per file: the body's length and a hash of it.
const std::string& EntityTag(const ConsoleAsset& asset) {
  static const std::vector<std::string> tags = [] {
    std::vector<std::string> out;
    for (const ConsoleAsset& a : ConsoleAssets()) {
      out.push_back("\"" + std::to_string(a.body.size()) + "-" +
                    std::to_string(std::hash<std::string_view>()(a.body) & 0xffffffffffffULL) +
                    "\"");
    }
    return out;
  }();
  return tags[static_cast<size_t>(&asset - ConsoleAssets().data())];
}

// Serves one embedded file: gzip-compressed when the client takes it, 304 when it has it.
HttpResponse AssetResponse(const ConsoleAsset& asset, const HttpRequest& request) {
  HttpResponse response;
  response.content_type = std::string(asset.content_type);
  const std::string& etag = EntityTag(asset);
  response.headers = {{"ETag", etag},
                      {"Cache-Control", "no-cache"},
                      {"Vary", "Accept-Encoding"},
                      {"X-Content-Type-Options", "nosniff"}};
  if (asset.name == "index.html") {
    response.headers.emplace_back("Content-Security-Policy", std::string(kContentSecurityPolicy));
    response.headers.emplace_back("Referrer-Policy", "no-referrer");
  }
  if (!request.if_none_match.empty() && request.if_none_match == etag) {
    response.status = 304;
    return response;
  }
  if (request.accept_encoding.find("gzip") != std::string::npos) {
    response.body = std::string(asset.gzipped);
    response.headers.emplace_back("Content-Encoding", "gzip");
  } else {
    response.body = std::string(asset.body);
  }
  return response;
}

const ConsoleAsset* FindAsset(std::string_view name) {
  for (const ConsoleAsset& asset : ConsoleAssets()) {
    if (asset.name == name) return &asset;
  }
  return nullptr;
}

}  // namespace

double IntervalQuantile(const HistogramSnapshot& earlier, const HistogramSnapshot& later,
                        double q) {
  const size_t buckets = later.counts.size();
  std::vector<uint64_t> counts(buckets);
  uint64_t total = 0;
  for (size_t i = 0; i < buckets; ++i) {
    const uint64_t before = i < earlier.counts.size() ? earlier.counts[i] : 0;
    counts[i] = later.counts[i] - std::min(later.counts[i], before);
    total += counts[i];
  }
  if (total == 0) return 0;
  const double rank = q * static_cast<double>(total);
  double seen = 0;
  for (size_t i = 0; i < buckets; ++i) {
    if (counts[i] == 0 || seen + static_cast<double>(counts[i]) < rank) {
      seen += static_cast<double>(counts[i]);
      continue;
    }
    // The +Inf bucket has no upper bound: its lower one stands for it.
    if (i >= later.upper_bounds.size())
      return later.upper_bounds.empty() ? 0 : later.upper_bounds.back();
    const double lower = i == 0 ? 0 : later.upper_bounds[i - 1];
    const double upper = later.upper_bounds[i];
    return lower + (upper - lower) * (rank - seen) / static_cast<double>(counts[i]);
  }
  return later.upper_bounds.empty() ? 0 : later.upper_bounds.back();
}

std::string RenderConsoleSample(const ConsoleCounters& earlier, const ConsoleCounters& later,
                                int64_t unix_ms) {
  const double seconds = std::chrono::duration<double>(later.at - earlier.at).count();
  JsonWriter json;
  json.BeginObject().Field("t", unix_ms).Field("seconds", seconds);
  // The server: every HTTP response, whatever its route.
  const HttpStats& a = earlier.http;
  const HttpStats& b = later.http;
  json.Key("server").BeginObject();
  json.Field("responses", AllResponses(b));
  json.Field("requests_per_second", Rate(static_cast<double>(AllResponses(a)),
                                         static_cast<double>(AllResponses(b)), seconds));
  json.Field("p50_ms", 1e3 * IntervalQuantile(a.request_seconds, b.request_seconds, 0.5));
  json.Field("p99_ms", 1e3 * IntervalQuantile(a.request_seconds, b.request_seconds, 0.99));
  json.Key("rejections_per_second").BeginObject();
  for (int status : {503, 504, 499}) {
    json.Field(std::to_string(status),
               Rate(static_cast<double>(ResponsesWith(a, status)),
                    static_cast<double>(ResponsesWith(b, status)), seconds));
  }
  json.EndObject();
  json.Field("open_connections", b.open_connections);
  json.Field("cpu_percent",
             100 * Rate(earlier.process_cpu_seconds, later.process_cpu_seconds, seconds) /
                 std::max(1, later.cores));
  json.Field("resident_bytes", later.resident_bytes);
  json.Field("memory_in_use_bytes", b.memory_in_use_bytes);
  json.EndObject();

  json.Key("models").BeginArray();
  for (const auto& [name, now] : later.models) {
    const ModelStatsSnapshot* before = Previous(earlier.models, name);
    const ModelStatsSnapshot zero;
    const ModelStatsSnapshot& was = before ? *before : zero;
    json.BeginObject().Field("name", name).Field("instances", now.instances);
    json.Field("answered", now.answered_requests());
    json.Field("requests_per_second", Rate(static_cast<double>(was.answered_requests()),
                                           static_cast<double>(now.answered_requests()), seconds));
    json.Field("p50_ms", 1e3 * IntervalQuantile(was.request_seconds, now.request_seconds, 0.5));
    json.Field("p99_ms", 1e3 * IntervalQuantile(was.request_seconds, now.request_seconds, 0.99));
    json.Field("queued", now.queued_requests).Field("in_flight", now.inflight_requests);
    json.Field("batch_size_mean", IntervalMean(was.batch_size, now.batch_size));
    json.Field("target_batch_size", now.target_batch_size);
    json.Field("busy", now.instances > 0
                           ? Rate(was.busy_seconds, now.busy_seconds, seconds) / now.instances
                           : 0.0);
    json.Key("rejections_per_second").BeginObject();
    for (int status : {503, 504, 499}) {
      json.Field(std::to_string(status),
                 Rate(static_cast<double>(OutcomesWith(was, status)),
                      static_cast<double>(OutcomesWith(now, status)), seconds));
    }
    json.EndObject().EndObject();
  }
  json.EndArray();

  json.Key("language_models").BeginArray();
  for (const auto& now : later.language_models) {
    const ConsoleCounters::LanguageModel* before = PreviousLanguageModel(earlier, now.name);
    const llm::LlmStats zero;
    const llm::LlmStats& was = before ? before->stats : zero;
    const llm::LlmStats& is = now.stats;
    json.BeginObject().Field("name", now.name);
    json.Field("weights", now.weights).Field("kernels", now.kernels);
    json.Field("finished", is.requests_finished);
    json.Field("tokens_per_second", Rate(static_cast<double>(was.generated_tokens),
                                         static_cast<double>(is.generated_tokens), seconds));
    json.Field("prompt_tokens_per_second", Rate(static_cast<double>(was.prompt_tokens),
                                                static_cast<double>(is.prompt_tokens), seconds));
    json.Field("ttft_p50_ms",
               1e3 * IntervalQuantile(was.time_to_first_token, is.time_to_first_token, 0.5));
    json.Field("ttft_p99_ms",
               1e3 * IntervalQuantile(was.time_to_first_token, is.time_to_first_token, 0.99));
    json.Field("itl_p50_ms", 1e3 * IntervalQuantile(was.inter_token, is.inter_token, 0.5));
    json.Field("itl_p99_ms", 1e3 * IntervalQuantile(was.inter_token, is.inter_token, 0.99));
    json.Field("slots", is.slots).Field("slots_busy", is.slots_busy).Field("waiting", is.waiting);
    json.Field("kv_cache_use",
               is.kv_blocks > 0 ? static_cast<double>(is.kv_blocks_used) / is.kv_blocks : 0.0);
    const double queries = static_cast<double>(is.prefix_cache_queries - was.prefix_cache_queries);
    json.Field("prefix_cache_hit_ratio",
               queries > 0
                   ? static_cast<double>(is.prefix_cache_hits - was.prefix_cache_hits) / queries
                   : 0.0);
    json.EndObject();
  }
  json.EndArray();
  json.EndObject();
  return json.str();
}

Console::CounterSource Console::ServerCounters(Engine& engine,
                                               std::function<HttpStats()> http_stats,
                                               const llm::GenerationService* llm) {
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return [&engine, http_stats = std::move(http_stats), llm, ticks, page, cores] {
    ConsoleCounters counters;
    counters.at = Clock::Real().Now();
    counters.cores = cores;
    if (auto cpu = ParseProcessCpuTicks(ReadSmallFile("/proc/self/stat"))) {
      counters.process_cpu_seconds = static_cast<double>(*cpu) / static_cast<double>(ticks);
    }
    std::istringstream statm(ReadSmallFile("/proc/self/statm"));
    int64_t size_pages = 0, resident_pages = 0;
    if (statm >> size_pages >> resident_pages) counters.resident_bytes = resident_pages * page;
    if (http_stats) counters.http = http_stats();
    for (const std::string& name : engine.ModelNames()) {
      if (auto scheduler = engine.Find(name))
        counters.models.emplace_back(name, scheduler->stats());
    }
    if (llm != nullptr) {
      for (const auto& [name, model] : llm->models()) {
        counters.language_models.push_back(
            {name, model->stats(), model->model().weight_formats(), model->model().kernel_paths()});
      }
    }
    return counters;
  };
}

Console::Console(CounterSource source, ConsoleOptions options)
    : source_(std::move(source)), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

Console::~Console() { Stop(); }

void Console::Stop() {
  std::vector<std::shared_ptr<ResponseStream>> watchers;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    watchers.swap(watchers_);
  }
  wake_.SignalAll();
  for (auto& stream : watchers) stream->Close();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

size_t Console::watchers() const {
  MutexLock lock(mu_);
  return watchers_.size();
}

void Console::Loop() {
  ConsoleCounters earlier = source_();
  auto next = std::chrono::steady_clock::now();
  while (true) {
    next += options_.sample_period;
    {
      MutexLock lock(mu_);
      while (!stopping_ && std::chrono::steady_clock::now() < next) wake_.WaitUntil(lock, next);
      if (stopping_) return;
    }
    ConsoleCounters later = source_();
    const int64_t unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    std::string sample = RenderConsoleSample(earlier, later, unix_ms);
    earlier = std::move(later);
    std::vector<std::shared_ptr<ResponseStream>> watchers;
    {
      MutexLock lock(mu_);
      history_.push_back(sample);
      while (history_.size() > options_.history) history_.pop_front();
      watchers = watchers_;
    }
    const std::string event = "event: sample\ndata: " + sample + "\n\n";
    std::vector<ResponseStream*> gone;
    for (auto& stream : watchers) {
      if (!stream->Write(event)) gone.push_back(stream.get());
    }
    if (!gone.empty()) {
      MutexLock lock(mu_);
      std::erase_if(watchers_, [&](const std::shared_ptr<ResponseStream>& stream) {
        return std::find(gone.begin(), gone.end(), stream.get()) != gone.end();
      });
    }
  }
}

void Console::Events(const HttpRequest&, Responder respond) {
  auto stream = std::make_shared<ResponseStream>();
  std::string history = "event: history\ndata: [";
  {
    MutexLock lock(mu_);
    if (stopping_ || watchers_.size() >= options_.max_watchers) {
      respond(HttpResponse::Error(
          Status::Unavailable(stopping_ ? "the server is shutting down"
                                        : "too many dashboards are watching; close one")
              .WithRetryAfter(5)));
      return;
    }
    bool first = true;
    for (const std::string& sample : history_) {
      history += first ? "" : ",";
      history += sample;
      first = false;
    }
    history += "]\n\n";
    // Written before the stream joins the watchers, so that the history comes first.
    stream->Write(std::move(history));
    watchers_.push_back(stream);
  }
  HttpResponse response;
  response.content_type = "text/event-stream";
  response.headers.emplace_back("Cache-Control", "no-cache");
  response.stream = stream;
  respond(std::move(response));
}

void Console::AddRoutes(Router& router) {
  router.Get("/", [](const HttpRequest& request, const PathParams&, Responder respond) {
    respond(AssetResponse(*FindAsset("index.html"), request));
  });
  router.SetPublic("GET", "/");
  router.Get("/console/static/{asset}",
             [](const HttpRequest& request, const PathParams& params, Responder respond) {
               const ConsoleAsset* asset = FindAsset(params.Get("asset"));
               if (asset == nullptr || asset->name == "index.html") {
                 respond(HttpResponse::Error(Status::NotFound(
                     "no console asset '" + std::string(params.Get("asset")) + "'")));
                 return;
               }
               respond(AssetResponse(*asset, request));
             });
  router.SetPublic("GET", "/console/static/{asset}");
  router.Get("/console/events", [this](const HttpRequest& request, const PathParams&,
                                       Responder respond) { Events(request, std::move(respond)); });
}

}  // namespace sluice
