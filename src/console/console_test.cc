// The console's samples, its embedded files and its event stream, without sockets.
#include "console/console.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace sluice {
namespace {

using namespace std::chrono_literals;

HttpResponse Get(const Router& router, std::string path, std::string accept_encoding = "",
                 std::string if_none_match = "") {
  HttpRequest request;
  request.method = "GET";
  request.path = std::move(path);
  request.accept_encoding = std::move(accept_encoding);
  request.if_none_match = std::move(if_none_match);
  HttpResponse out;
  int calls = 0;
  router.Dispatch(request, [&](HttpResponse r) {
    out = std::move(r);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  return out;
}

std::string Header(const HttpResponse& response, std::string_view name) {
  for (const auto& [key, value] : response.headers) {
    if (key == name) return value;
  }
  return "";
}

ConsoleCounters Quiet() {
  ConsoleCounters counters;
  counters.at = Clock::Real().Now();
  return counters;
}

TEST(ConsoleTest, IntervalQuantileInterpolatesInTheBucketsOfTheInterval) {
  Histogram h({1, 2, 4});
  for (int i = 0; i < 10; ++i) h.Observe(0.5);
  const HistogramSnapshot earlier = h.Snapshot();
  EXPECT_EQ(IntervalQuantile(earlier, h.Snapshot(), 0.5), 0);  // Nothing in between.
  for (int i = 0; i < 10; ++i) h.Observe(1.5);
  const HistogramSnapshot later = h.Snapshot();
  // Only the ten in (1, 2]: the median is half-way through that bucket, not in the first.
  EXPECT_DOUBLE_EQ(IntervalQuantile(earlier, later, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(IntervalQuantile(earlier, later, 1.0), 2.0);
  // Over everything: the median is the last of the first bucket.
  EXPECT_DOUBLE_EQ(IntervalQuantile(HistogramSnapshot{}, later, 0.5), 1.0);
  for (int i = 0; i < 10; ++i) h.Observe(100);
  EXPECT_EQ(IntervalQuantile(later, h.Snapshot(), 0.99), 4);  // +Inf: the last bound.
}

TEST(ConsoleTest, ASampleIsRatesOverTheIntervalAndGaugesAsTheyAre) {
  ConsoleCounters a = Quiet();
  ConsoleCounters b = a;
  b.at = a.at + 2s;
  a.http.responses_by_status = {{200, 100}, {503, 0}};
  b.http.responses_by_status = {{200, 296}, {503, 4}, {499, 2}};
  b.http.open_connections = 7;
  a.process_cpu_seconds = 1;
  b.process_cpu_seconds = 2;  // One core's worth of 2 s on 2 cores: 25%.
  a.cores = b.cores = 2;
  b.resident_bytes = 1 << 20;
  ModelStatsSnapshot m0, m1;
  m0.instances = m1.instances = 2;
  m1.requests_by_outcome[static_cast<int>(StatusCode::kOk)] = 40;
  m1.requests_by_outcome[static_cast<int>(StatusCode::kUnavailable)] = 6;
  m1.queued_requests = 3;
  m1.busy_seconds = 2;  // 2 instance-seconds of 4: half busy.
  Histogram batches({1, 2, 4, 8});
  m0.batch_size = batches.Snapshot();
  for (int size : {2, 4, 6}) batches.Observe(size);
  m1.batch_size = batches.Snapshot();
  a.models = {{"m", m0}};
  b.models = {{"m", m1}, {"new", ModelStatsSnapshot{}}};
  llm::LlmStats l0, l1;
  l1.generated_tokens = 50;
  l1.prefix_cache_queries = 100;
  l1.prefix_cache_hits = 25;
  l1.kv_blocks = 10;
  l1.kv_blocks_used = 3;
  a.language_models = {{"lm", l0, "Q4_K", "avx2"}};
  b.language_models = {{"lm", l1, "Q4_K", "avx2"}};

  const std::string json = RenderConsoleSample(a, b, 1234);
  simdjson::dom::parser parser;
  simdjson::dom::element sample = parser.parse(json);
  EXPECT_EQ(int64_t(sample["t"]), 1234);
  simdjson::dom::element server = sample["server"];
  EXPECT_EQ(int64_t(server["responses"]), 302);
  EXPECT_DOUBLE_EQ(double(server["requests_per_second"]), 101);
  EXPECT_DOUBLE_EQ(double(server["rejections_per_second"]["503"]), 2);
  EXPECT_DOUBLE_EQ(double(server["rejections_per_second"]["499"]), 1);
  EXPECT_DOUBLE_EQ(double(server["cpu_percent"]), 25);
  EXPECT_EQ(int64_t(server["open_connections"]), 7);
  EXPECT_EQ(int64_t(server["resident_bytes"]), 1 << 20);
  simdjson::dom::array models = sample["models"];
  ASSERT_EQ(models.size(), 2u);
  simdjson::dom::element m = models.at(0);
  EXPECT_EQ(std::string_view(m["name"]), "m");
  EXPECT_DOUBLE_EQ(double(m["requests_per_second"]), 23);
  EXPECT_DOUBLE_EQ(double(m["rejections_per_second"]["503"]), 3);
  EXPECT_EQ(int64_t(m["queued"]), 3);
  EXPECT_DOUBLE_EQ(double(m["batch_size_mean"]), 4);
  EXPECT_DOUBLE_EQ(double(m["busy"]), 0.5);
  // A model first seen in this sample counts from zero.
  EXPECT_DOUBLE_EQ(double(models.at(1)["requests_per_second"]), 0);
  simdjson::dom::element lm = sample["language_models"].at(0);
  EXPECT_DOUBLE_EQ(double(lm["tokens_per_second"]), 25);
  EXPECT_DOUBLE_EQ(double(lm["kv_cache_use"]), 0.3);
  EXPECT_DOUBLE_EQ(double(lm["prefix_cache_hit_ratio"]), 0.25);
  EXPECT_EQ(std::string_view(lm["kernels"]), "avx2");
}

TEST(ConsoleTest, FilesAreEmbeddedAndServedCompressedWhenTheClientTakesIt) {
  Console console([] { return Quiet(); });
  Router router;
  console.AddRoutes(router);
  for (const ConsoleAsset& asset : ConsoleAssets()) {
    EXPECT_GT(asset.body.size(), 0u) << asset.name;
    ASSERT_GE(asset.gzipped.size(), 2u) << asset.name;
    EXPECT_EQ(static_cast<unsigned char>(asset.gzipped[0]), 0x1f) << asset.name;
    EXPECT_EQ(static_cast<unsigned char>(asset.gzipped[1]), 0x8b) << asset.name;
  }
  HttpResponse page = Get(router, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.body.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(Header(page, "Content-Security-Policy").find("script-src 'self'"), std::string::npos);
  EXPECT_EQ(Header(page, "Content-Encoding"), "");

  HttpResponse chart = Get(router, "/console/static/chart.min.js", "gzip, deflate, br");
  EXPECT_EQ(chart.status, 200);
  EXPECT_EQ(Header(chart, "Content-Encoding"), "gzip");
  EXPECT_EQ(static_cast<unsigned char>(chart.body[0]), 0x1f);
  HttpResponse plain = Get(router, "/console/static/chart.min.js");
  EXPECT_NE(plain.body.find("Chart.js v3"), std::string::npos);
  EXPECT_LT(chart.body.size(), plain.body.size());

  const std::string etag = Header(plain, "ETag");
  ASSERT_FALSE(etag.empty());
  EXPECT_EQ(Get(router, "/console/static/chart.min.js", "", etag).status, 304);
  EXPECT_EQ(Get(router, "/console/static/chart.min.js", "", "\"other\"").status, 200);
  EXPECT_EQ(Get(router, "/console/static/nothing.js").status, 404);
  EXPECT_EQ(Get(router, "/console/static/index.html").status, 404);  // Only at /.
  EXPECT_NE(Get(router, "/console/static/LICENSES.txt").body.find("Expat"), std::string::npos);
  EXPECT_TRUE(router.IsPublic("GET", "/"));
  EXPECT_FALSE(router.IsPublic("GET", "/console/events"));
}

TEST(ConsoleTest, AWatcherGetsTheHistoryThenEachSampleAndStopEndsTheStream) {
  std::atomic<int64_t> responses{0};
  Console console(
      [&] {
        ConsoleCounters counters = Quiet();
        counters.http.responses_by_status = {{200, responses.fetch_add(10) + 10}};
        return counters;
      },
      {.sample_period = Millis(10), .history = 3});
  Router router;
  console.AddRoutes(router);
  std::this_thread::sleep_for(100ms);  // More samples than the history keeps.
  HttpResponse events = Get(router, "/console/events");
  ASSERT_EQ(events.status, 200);
  EXPECT_EQ(events.content_type, "text/event-stream");
  ASSERT_NE(events.stream, nullptr);
  bool closed = false;
  std::string first = events.stream->Take(&closed);
  ASSERT_EQ(first.rfind("event: history\ndata: [", 0), 0u) << first;
  simdjson::dom::parser parser;
  const size_t start = first.find('[');
  simdjson::dom::array history =
      parser.parse(first.substr(start, first.find("\n\n") - start)).get_array();
  EXPECT_EQ(history.size(), 3u);  // The newest three, oldest first.
  EXPECT_LT(int64_t(history.at(0)["server"]["responses"]),
            int64_t(history.at(2)["server"]["responses"]));
  std::string later;
  for (int i = 0; i < 200 && later.find("event: sample") == std::string::npos; ++i) {
    std::this_thread::sleep_for(5ms);
    later += events.stream->Take(&closed);
  }
  EXPECT_NE(later.find("event: sample\ndata: {"), std::string::npos);
  EXPECT_EQ(console.watchers(), 1u);
  console.Stop();
  events.stream->Take(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(Get(router, "/console/events").status, 503);  // Stopped: no new watchers.
}

TEST(ConsoleTest, WatchersBeyondTheLimitAreRefusedAndOnesThatLeftAreDropped) {
  Console console([] { return Quiet(); }, {.sample_period = Millis(10), .max_watchers = 1});
  Router router;
  console.AddRoutes(router);
  HttpResponse first = Get(router, "/console/events");
  ASSERT_EQ(first.status, 200);
  HttpResponse second = Get(router, "/console/events");
  EXPECT_EQ(second.status, 503);
  EXPECT_FALSE(Header(second, "Retry-After").empty());
  first.stream->MarkGone();  // The page was closed.
  for (int i = 0; i < 200 && console.watchers() > 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(console.watchers(), 0u);
  EXPECT_EQ(Get(router, "/console/events").status, 200);
}

}  // namespace
}  // namespace sluice
