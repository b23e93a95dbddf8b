// The browser console at `/`: a dashboard of the served models and the server's counters, a
// model try-out, a chat playground for language models and a bench run from the page.
//
// Its page, script and style (assets/), with Debian's Chart.js, marked and highlight.js, are
// embedded in the binary at build time (console_assets.cc), each also gzip-compressed; nothing is
// fetched from elsewhere. The page, its code and its styles hold no data and load without the API
// key (the page asks for it); everything it shows comes from routes that need the key: the v2,
// repository and OpenAI APIs, and the dashboard's event stream.
//
//   GET /                          the console's page
//   GET /console/static/{asset}    its scripts, styles and the libraries' licences
//   GET /console/events            server-sent events: `history` (the samples kept, oldest
//                                  first) on connecting, then a `sample` each second
//
// A sample (JSON) is what changed since the one before: per second rates, latency quantiles of the
// requests finished in between (from the histograms the engine keeps), and gauges as they are.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "engine/model_stats.h"
#include "http/router.h"
#include "llm/llm_engine.h"
#include "metrics/prometheus.h"

namespace sluice {

class Engine;
namespace llm {
class GenerationService;
}

// The counters a sample is the difference of, read at one moment.
struct ConsoleCounters {
  Clock::time_point at;
  double process_cpu_seconds = 0;
  int64_t resident_bytes = 0;
  int cores = 1;
  HttpStats http;
  std::vector<std::pair<std::string, ModelStatsSnapshot>> models;
  struct LanguageModel {
    std::string name;
    llm::LlmStats stats;
    std::string weights;  // Weight formats and kernel paths, as the load line names them.
    std::string kernels;
  };
  std::vector<LanguageModel> language_models;
};

// The `q` quantile (0-1) of the observations `later` holds and `earlier` did not, interpolated
// within its bucket as Prometheus' histogram_quantile does; 0 when there are none. Both snapshots
// are of one histogram (the same bounds).
double IntervalQuantile(const HistogramSnapshot& earlier, const HistogramSnapshot& later, double q);

// One sample's JSON: what changed from `earlier` to `later`. `unix_ms` stamps it.
std::string RenderConsoleSample(const ConsoleCounters& earlier, const ConsoleCounters& later,
                                int64_t unix_ms);

// One embedded file.
struct ConsoleAsset {
  std::string_view name;  // As in /console/static/{name}; "index.html" is served at `/`.
  std::string_view content_type;
  std::string_view body;
  std::string_view gzipped;  // The same, gzip-compressed.
};
// Every embedded file (console_assets.cc).
std::span<const ConsoleAsset> ConsoleAssets();

struct ConsoleOptions {
  Millis sample_period{1000};
  size_t history = 300;      // Samples kept for a page that connects (5 minutes at 1 s).
  size_t max_watchers = 16;  // Open event streams; more are refused (503).
};

// Thread-safe. Samples on its own thread from construction until Stop().
class Console {
 public:
  // Reads the counters to sample; called on the console's thread only.
  using CounterSource = std::function<ConsoleCounters()>;

  Console(CounterSource source, ConsoleOptions options = {});
  ~Console();  // Stop().
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  void AddRoutes(Router& router);
  // Ends every event stream and the sampling thread.
  void Stop();

  // The counters of a running server: `engine`'s models, the HTTP server's statistics and the
  // language models `llm` serves (may be null), with this process' CPU time and memory.
  static CounterSource ServerCounters(Engine& engine, std::function<HttpStats()> http_stats,
                                      const llm::GenerationService* llm);

  size_t watchers() const;

 private:
  void Loop();
  void Events(const HttpRequest& request, Responder respond);

  const CounterSource source_;
  const ConsoleOptions options_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::deque<std::string> history_ GUARDED_BY(mu_);  // Each a sample's JSON.
  std::vector<std::shared_ptr<ResponseStream>> watchers_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sluice
