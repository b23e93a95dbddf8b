// Tests for the in-process pipeline, engine ceiling, sweep, payloads, utilisation parsing,
// result files and plots, with a fake backend (no torch).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "bench/http_load.h"
#include "bench/in_process.h"
#include "bench/payload.h"
#include "bench/plot.h"
#include "bench/report.h"
#include "bench/results.h"
#include "bench/sweep.h"
#include "bench/utilization.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ModelConfig EchoConfig(int max_batch_size = 8) {
  ModelConfig c;
  c.name = "echo";
  c.max_batch_size = max_batch_size;
  c.inputs = {{"x", DataType::kFp32, {3}}};
  c.outputs = {{"y", DataType::kFp32, {3}}};
  c.instances.threads = 1;
  return c;
}

// Counts calls, checks every batch, and fails the call whose first value is the marker.
struct EchoLog {
  std::mutex mu;
  std::set<std::thread::id> threads;
  int attached = 0;
  int runs = 0;
};

class EchoInstance : public BackendInstance {
 public:
  explicit EchoInstance(EchoLog* log, bool fail_all = false,
                        std::chrono::microseconds run_time = std::chrono::microseconds(0))
      : log_(log), fail_all_(fail_all), run_time_(run_time) {}
  Status AttachToCurrentThread() override {
    std::lock_guard lock(log_->mu);
    ++log_->attached;
    attached_thread_ = std::this_thread::get_id();
    return Status::Ok();
  }
  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    if (run_time_.count() > 0) std::this_thread::sleep_for(run_time_);
    std::lock_guard lock(log_->mu);
    ++log_->runs;
    log_->threads.insert(std::this_thread::get_id());
    if (std::this_thread::get_id() != attached_thread_) return Status::Internal("not attached");
    if (fail_all_) return Status::Internal("model failure");
    return inputs;
  }

 private:
  EchoLog* log_;
  bool fail_all_;
  std::chrono::microseconds run_time_;
  std::thread::id attached_thread_;
};

class EchoBackend : public Backend {
 public:
  explicit EchoBackend(EchoLog* log) : log_(log) {}
  Result<std::unique_ptr<BackendInstance>> CreateInstance(int) override {
    return std::unique_ptr<BackendInstance>(std::make_unique<EchoInstance>(log_));
  }
  const LoadReport& load_report() const override { return report_; }

 private:
  EchoLog* log_;
  LoadReport report_{0.5, 0.25, 0.125, "echo", {}};
};

TEST(PipelineTest, EveryRequestAnsweredOnceByAttachedWorkers) {
  EchoLog log;
  // A run takes a moment, so a request that comes while one instance runs finds the other free
  // (an instant model could be served by whichever instance woke first, every time).
  EchoInstance a(&log, false, std::chrono::microseconds(500));
  EchoInstance b(&log, false, std::chrono::microseconds(500));
  std::vector<BackendInstance*> instances{&a, &b};
  InProcessOptions o;
  o.batch_size = 4;
  o.iterations = 200;
  auto run = RunInProcessPipeline(EchoConfig(), instances, o);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->records.size(), 201u);  // Warm-up + timed.
  EXPECT_EQ(log.runs, 201);
  EXPECT_EQ(log.attached, 2);
  EXPECT_EQ(log.threads.size(), 2u);  // One thread per instance, none the caller's.
  EXPECT_EQ(log.threads.count(std::this_thread::get_id()), 0u);
  std::set<int> workers;
  for (const RequestRecord& r : run->records) {
    EXPECT_EQ(r.outcome, StatusCode::kOk);
    EXPECT_EQ(r.samples, 4);
    EXPECT_LE(r.request_time, r.start_time);
    EXPECT_LE(r.start_time, r.response_time);
    workers.insert(r.worker);
  }
  EXPECT_EQ(workers, (std::set<int>{0, 1}));
  // The warm-up request runs alone: no timed request is sent before its response.
  for (size_t i = 1; i < run->records.size(); ++i) {
    EXPECT_GE(run->records[i].request_time, run->records[0].response_time);
  }
  EXPECT_EQ(run->summary.requests, 200);
  EXPECT_EQ(run->summary.ok_samples, 800);
  EXPECT_GT(run->summary.samples_per_second, 0);
}

TEST(PipelineTest, ModelFailuresAreRecordedNotLost) {
  EchoLog log;
  EchoInstance failing(&log, /*fail_all=*/true);
  std::vector<BackendInstance*> instances{&failing};
  InProcessOptions o;
  o.batch_size = 1;
  o.iterations = 10;
  auto run = RunInProcessPipeline(EchoConfig(), instances, o);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->summary.requests, 10);
  EXPECT_EQ(run->summary.ok_requests, 0);
  EXPECT_EQ(run->summary.errors.at("internal"), 10);
  EXPECT_THAT(FormatReport(LoadReport{}, *run), HasSubstr("errors internal: 10"));
}

TEST(PipelineTest, RejectsBadOptions) {
  EchoLog log;
  EchoInstance a(&log);
  std::vector<BackendInstance*> instances{&a};
  InProcessOptions o;
  o.batch_size = 9;  // Over max_batch_size 8.
  EXPECT_THAT(RunInProcessPipeline(EchoConfig(), instances, o).status().message(),
              HasSubstr("batch size 9 must be between 1 and the model's max_batch_size 8"));
  o.batch_size = 1;
  o.iterations = 0;
  EXPECT_EQ(RunInProcessPipeline(EchoConfig(), instances, o).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RunInProcessPipeline(EchoConfig(), {}, InProcessOptions{}).status().code(),
            StatusCode::kInvalidArgument);
  ModelConfig variable = EchoConfig();
  variable.inputs[0].shape = {-1};
  o.iterations = 1;
  EXPECT_THAT(RunInProcessPipeline(variable, instances, o).status().message(),
              HasSubstr("variable dimension"));
  EXPECT_EQ(log.runs, 0);
}

TEST(BatchedPipelineTest, SingleSampleClientsAreBatchedByTheScheduler) {
  EchoLog log;
  EchoInstance a(&log);
  std::vector<BackendInstance*> instances{&a};
  ModelConfig config = EchoConfig(/*max_batch_size=*/4);
  // Long enough that only full batches go: 8 clients keep two batches of 4 coming.
  config.dynamic_batching.adaptive = false;
  config.dynamic_batching.max_queue_delay = Micros(200'000);
  InProcessOptions o;
  o.batch_size = 1;
  o.iterations = 40;
  o.max_in_flight = 8;
  auto run = RunBatchedPipeline(config, instances, o);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(run->records.size(), 41u);
  EXPECT_EQ(run->summary.ok_requests, 40);
  EXPECT_EQ(run->summary.batches_by_size, (std::map<int, int64_t>{{4, 10}}));
  EXPECT_DOUBLE_EQ(run->summary.mean_batch_size, 4.0);
  EXPECT_EQ(log.runs, 11);  // The warm-up alone, then ten full batches.
  EXPECT_EQ(log.threads.count(std::this_thread::get_id()), 0u);
  for (size_t i = 1; i < run->records.size(); ++i) {
    EXPECT_GE(run->records[i].request_time, run->records[0].response_time);
  }
  std::string report = FormatReport(LoadReport{}, *run);
  EXPECT_NE(report.find("Batches: 10, mean size 4.00 samples; by size: 4: 10 (100.0%)"),
            std::string::npos)
      << report;
}

// An echo whose every batch takes 2 ms, like a small model.
class SlowEchoInstance : public EchoInstance {
 public:
  using EchoInstance::EchoInstance;
  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return EchoInstance::Run(inputs);
  }
};

TEST(BatchedPipelineTest, RefusedRequestsAreRecordedAndTheirSlotsReused) {
  EchoLog log;
  SlowEchoInstance a(&log);
  std::vector<BackendInstance*> instances{&a};
  ModelConfig config = EchoConfig(/*max_batch_size=*/2);
  config.dynamic_batching.max_queue_size = 2;
  config.dynamic_batching.adaptive = false;
  config.dynamic_batching.max_queue_delay = Micros(20'000);
  InProcessOptions o;
  o.batch_size = 1;
  o.iterations = 30;
  o.max_in_flight = 6;  // More clients than queue slots: some are told to come back later.
  auto run = RunBatchedPipeline(config, instances, o);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->summary.requests, 30);
  EXPECT_GT(run->summary.errors["unavailable"], 0);
  EXPECT_EQ(run->summary.ok_requests + run->summary.errors["unavailable"], 30);
}

TEST(HttpLoadTest, ParsesUrlsAndScrapesHistograms) {
  auto target = ParseHttpUrl("http://127.0.0.1:8000/v2");
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(target->host, "127.0.0.1");
  EXPECT_EQ(target->port, 8000);
  EXPECT_EQ(ParseHttpUrl("http://localhost")->port, 80);
  EXPECT_FALSE(ParseHttpUrl("https://x:1").ok());
  EXPECT_FALSE(ParseHttpUrl("http://x:99999").ok());
  EXPECT_FALSE(ParseHttpUrl("http://:80").ok());
  const std::string metrics =
      "sluice_batch_size_sum{model=\"a\"} 10\nsluice_batch_size_count{model=\"a\"} 4\n"
      "sluice_batch_size_sum{model=\"b\"} 99\n";
  EXPECT_EQ(ScrapeHistogram(metrics, "sluice_batch_size", "a"), std::make_pair(10.0, 4.0));
  EXPECT_EQ(ScrapeHistogram(metrics, "sluice_batch_size", "c"), std::make_pair(0.0, 0.0));
}

// A keep-alive HTTP server on a loopback port that answers every request at once: one thread
// accepts, one thread a connection. Stops when destroyed.
class InstantHttpServer {
 public:
  InstantHttpServer() : acceptor_(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    accepter_ = std::thread([this] { Accept(); });
  }
  ~InstantHttpServer() {
    stopping_ = true;
    boost::asio::ip::tcp::socket wake(ioc_);
    boost::system::error_code ignored;
    wake.connect(acceptor_.local_endpoint(), ignored);
    accepter_.join();
    for (auto& t : connections_) t.join();
  }
  uint16_t port() const { return port_; }

 private:
  void Accept() {
    while (true) {
      boost::asio::ip::tcp::socket socket(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stopping_) return;
      if (ec) continue;
      connections_.emplace_back([s = std::move(socket)]() mutable { Serve(s); });
    }
  }
  static void Serve(boost::asio::ip::tcp::socket& socket) {
    namespace http = boost::beast::http;
    boost::beast::flat_buffer buffer;
    while (true) {
      http::request<http::string_body> request;
      boost::system::error_code ec;
      http::read(socket, buffer, request, ec);
      if (ec) return;
      http::response<http::string_body> response(http::status::ok, 11);
      response.body() = "{}";
      response.keep_alive(true);
      response.prepare_payload();
      http::write(socket, response, ec);
      if (ec) return;
    }
  }

  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accepter_;
  std::vector<std::thread> connections_;  // Joined when their client closes.
};

// The generator's thread runs late while the CPU is taken (here by spinning threads): a Poisson
// arrival due before the end is handled after it, when a connection's answer has come in. That
// arrival is still sent, on a connection still open, and nothing counts as lost (a connection
// closed at the end was once handed such an arrival: "write: Bad file descriptor").
TEST(HttpLoadTest, OpenLoopSendsEveryArrivalWhenItsThreadRunsLate) {
  InstantHttpServer server;
  std::atomic<bool> spin{true};
  std::vector<std::thread> hogs;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < 4 * cores; ++i) {
    hogs.emplace_back([&spin] {
      volatile uint64_t x = 0;
      while (spin.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  int64_t sent = 0;
  for (int level = 0; level < 30; ++level) {
    HttpLoadOptions o;
    o.target.port = server.port();
    o.payload.path = "/v2/models/m/infer";
    o.payload.body = "{}";
    o.concurrency = 2;
    o.max_connections = 16;
    o.rate = 4000;
    o.warmup = Seconds(0);
    o.duration = Seconds(0.1);
    o.seed = static_cast<uint64_t>(level) + 1;
    auto run = RunHttpLoad(o);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_EQ(run->transport_errors, 0)
        << "level " << level << ": "
        << fmt::format("{}", fmt::join(run->first_transport_errors, "; "));
    EXPECT_EQ(run->unsent, 0) << "level " << level;
    EXPECT_EQ(run->answered, run->sent) << "level " << level;
    EXPECT_EQ(static_cast<int64_t>(run->records.size()), run->sent) << "level " << level;
    sent += run->sent;
  }
  spin = false;
  for (auto& t : hogs) t.join();
  EXPECT_GT(sent, 30 * 100);  // About 400 arrivals a level.
}

TEST(CeilingTest, RunsTheSameNumberOfRequestsWithoutAQueue) {
  EchoLog log;
  EchoInstance a(&log), b(&log);
  std::vector<BackendInstance*> instances{&a, &b};
  InProcessOptions o;
  o.batch_size = 2;
  o.iterations = 50;
  auto run = RunEngineCeiling(EchoConfig(), instances, o);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->records.size(), 51u);
  EXPECT_EQ(log.runs, 51);
  EXPECT_EQ(run->summary.ok_samples, 100);
  for (size_t i = 1; i < run->records.size(); ++i) {
    EXPECT_LE(run->records[i - 1].request_time, run->records[i].request_time);  // Sorted.
    EXPECT_GE(run->records[i].request_time, run->records[0].response_time);     // Warm-up alone.
  }
}

TEST(PayloadTest, MatchesSignatureAndSeed) {
  ModelConfig c = EchoConfig();
  c.inputs.push_back({"ids", DataType::kInt64, {2, 2}});
  auto a = MakeRandomInputs(c, 3, 7);
  auto b = MakeRandomInputs(c, 3, 7);
  auto other = MakeRandomInputs(c, 3, 8);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].shape(), (Shape{3, 3}));
  EXPECT_EQ((*a)[1].shape(), (Shape{3, 2, 2}));
  EXPECT_EQ((*a)[1].dtype(), DataType::kInt64);
  auto values = [](const Tensor& t) {
    auto s = t.values<float>();
    return std::vector<float>(s.begin(), s.end());
  };
  EXPECT_EQ(values((*a)[0]), values((*b)[0]));
  EXPECT_NE(values((*a)[0]), values((*other)[0]));
  for (int64_t v : (*a)[1].values<int64_t>()) {
    EXPECT_GE(v, 0);
    EXPECT_LE(v, 9);
  }
}

TEST(PayloadTest, HalfAndBfloat16Encodings) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);  // Smallest subnormal.
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3F80);  // Halfway: rounds to even.
}

TEST(UtilizationTest, ParsesProcStat) {
  auto t = ParseProcStat("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->busy, 100u + 5 + 50 + 3 + 2 + 10);
  EXPECT_EQ(t->total, t->busy + 800 + 20);
  EXPECT_FALSE(ParseProcStat("intr 1 2 3").has_value());
  EXPECT_FALSE(ParseProcStat("cpu 1 2 x 4 5 6 7 8").has_value());
}

TEST(UtilizationTest, ParsesProcessTicksPastSpacesInTheName) {
  std::string line = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 4";
  EXPECT_EQ(ParseProcessCpuTicks(line), 325u);
  EXPECT_FALSE(ParseProcessCpuTicks("1234 no parens").has_value());
}

TEST(UtilizationTest, AveragesOnlyTheWindow) {
  Clock::time_point t0{};
  std::vector<UtilizationSample> samples;
  for (int i = 0; i < 5; ++i) {
    UtilizationSample s;
    s.time = t0 + Millis(100 * i);
    s.machine_cpu_percent = 10.0 * i;
    s.process_cpu_percent = 5.0 * i;
    if (i == 3) s.gpu = GpuReading{60, 1000};
    samples.push_back(s);
  }
  UtilizationAverages avg = AverageSamples(samples, t0 + Millis(100), t0 + Millis(300));
  EXPECT_EQ(avg.samples, 3);
  EXPECT_DOUBLE_EQ(avg.machine_cpu_percent, 20.0);
  EXPECT_DOUBLE_EQ(avg.process_cpu_percent, 10.0);
  EXPECT_DOUBLE_EQ(*avg.gpu_percent, 60.0);
  EXPECT_FALSE(AverageSamples(samples, t0, t0 + Millis(200)).gpu_percent.has_value());
}

TEST(UtilizationTest, SamplerRecordsSamplesAndNvmlIsOptional) {
  UtilizationSampler sampler(Millis(10));
  sampler.Start();
  std::this_thread::sleep_for(Millis(60));
  sampler.Stop();
  auto samples = sampler.samples();
  ASSERT_GE(samples.size(), 2u);
  for (const auto& s : samples) {
    EXPECT_GE(s.machine_cpu_percent, 0);
    EXPECT_LE(s.machine_cpu_percent, 100.0001);
  }
  NvmlProbe probe;  // No GPU on CI machines: must report unavailable rather than fail.
  if (!probe.available()) {
    EXPECT_FALSE(probe.Read().has_value());
  }
}

TEST(PlotTest, NiceTicks) {
  EXPECT_EQ(NiceTicks(0, 100, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  std::vector<double> t = NiceTicks(0, 0.9, 4);  // Step 0.5: 0.2 would give 5 steps.
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(t[1], 0.5);
  EXPECT_DOUBLE_EQ(t[2], 1.0);
  EXPECT_EQ(NiceTicks(0, 101, 5), (std::vector<double>{0, 50, 100, 150}));  // Covers the data.
  EXPECT_EQ(NiceTicks(0, 7, 7), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(PlotTest, SvgHasSeriesLegendAndEscapedText) {
  PlotSpec spec;
  spec.title = "resnet18 <fp32 & bf16>";
  spec.x_label = "batch size";
  spec.y_label = "samples/s";
  spec.log2_x = true;
  spec.series = {{"fp32", {{1, 10}, {8, 40}, {64, 90}}}, {"bf16", {{1, 20}, {8, 80}, {64, 300}}}};
  std::string svg = RenderLinePlotSvg(spec);
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("resnet18 &lt;fp32 &amp; bf16&gt;"));
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++polylines;
  }
  EXPECT_EQ(polylines, 2u);
  EXPECT_THAT(svg, HasSubstr(">bf16</text>"));
  EXPECT_THAT(svg, HasSubstr(">64</text>"));  // Log axis ticks at the data's x values.
  EXPECT_THAT(svg, HasSubstr("</svg>"));
}

class ResultFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() /
            ("sluice_bench_test_" + std::to_string(::getpid()));
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  static std::string Read(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // An in-process run of `iterations` echo requests of 2 samples, its result files written to a
  // new run folder; empty on failure.
  std::filesystem::path WriteEchoRun(int iterations) {
    EchoLog log;
    EchoInstance a(&log);
    std::vector<BackendInstance*> instances{&a};
    InProcessOptions o;
    o.batch_size = 2;
    o.iterations = iterations;
    auto run = RunInProcessPipeline(EchoConfig(), instances, o);
    auto dir = CreateRunDirectory(base_, "bench-echo");
    if (!run.ok() || !dir.ok() ||
        !WriteBenchResults(*dir, RunInfo{"sluice bench", "echo"}, EchoConfig(), o, LoadReport{},
                           *run)
             .ok()) {
      return {};
    }
    return *dir;
  }
  std::filesystem::path base_;
};

TEST_F(ResultFilesTest, RunDirectoriesAreUnique) {
  auto a = CreateRunDirectory(base_, "bench-x");
  auto b = CreateRunDirectory(base_, "bench-x");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(std::filesystem::is_directory(*a));
  EXPECT_THAT(a->filename().string(), HasSubstr("-bench-x"));
}

TEST_F(ResultFilesTest, BenchWritesRunSamplesAndSummary) {
  const std::filesystem::path dir = WriteEchoRun(5);
  ASSERT_FALSE(dir.empty());
  std::string run_json = Read(dir / "run.json");
  EXPECT_THAT(run_json, HasSubstr("\"command\":\"sluice bench\""));
  EXPECT_THAT(run_json, HasSubstr("\"cpu_model\":"));
  EXPECT_THAT(run_json, HasSubstr("\"cores\":"));
  EXPECT_THAT(run_json, HasSubstr("\"runtime\":\"echo\""));
  EXPECT_THAT(run_json, HasSubstr("\"git_commit\":"));
  EXPECT_THAT(run_json, HasSubstr("\"batch_size\":2"));
  std::string csv = Read(dir / "samples.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);  // Header + 6 requests.
  EXPECT_THAT(csv, HasSubstr("\n0,0.000000000,"));         // Times from the first request.
  std::string summary = Read(dir / "summary.json");
  EXPECT_THAT(summary, HasSubstr("\"requests\":5"));
  EXPECT_THAT(summary, HasSubstr("\"p99\":"));
  EXPECT_THAT(summary, HasSubstr("\"gpu_percent\":null"));
}

TEST_F(ResultFilesTest, TheReportIsReadBackFromTheResultFiles) {
  const std::filesystem::path dir = WriteEchoRun(20);
  ASSERT_FALSE(dir.empty());
  const ModelConfig config = EchoConfig();
  auto report = ReadRunForReport(dir);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->kind, "in-process bench");
  EXPECT_EQ(report->model, config.name);
  ASSERT_FALSE(report->tables.empty());
  ASSERT_EQ(report->tables[0].rows.size(), 1u);
  EXPECT_EQ(report->tables[0].rows[0][0], "20");  // Requests, warm-up excluded.
  EXPECT_GE(report->plots.size(), 2u);            // Latency over the run, and its histogram.
  std::string html = RenderReportHtml({*report}, "t");
  EXPECT_THAT(html, HasSubstr("Content-Security-Policy"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, HasSubstr("sluice bench"));  // The command, from run.json.
  ASSERT_TRUE(WriteRunReport(dir).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "report.html"));

  // A folder of runs is expanded; one with none, or a missing run.json, is a clear error.
  auto found = FindRunDirectories({base_});
  ASSERT_TRUE(found.ok());
  EXPECT_NE(std::find(found->begin(), found->end(), dir), found->end());
  auto empty = CreateRunDirectory(base_ / "empty", "x");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(FindRunDirectories({base_ / "empty"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRunForReport(*empty).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteTextFile(*empty / "run.json", "{not json").ok());
  EXPECT_EQ(ReadRunForReport(*empty).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ResultFilesTest, SweepRunsTheGridAndWritesPlots) {
  EchoLog log;
  std::vector<ModelConfig> loaded;
  BackendLoader loader = [&](const ModelConfig& c) -> Result<std::shared_ptr<Backend>> {
    loaded.push_back(c);
    return std::shared_ptr<Backend>(std::make_unique<EchoBackend>(&log));
  };
  SweepOptions options;
  options.batch_sizes = {1, 4, 8};
  options.backends = {{BackendKind::kTorchScript, false},
                      {BackendKind::kTorchScript, true},
                      {BackendKind::kAotInductor, false}};
  options.precisions = {Precision::kFp32, Precision::kInt8};
  options.iterations = 3;
  std::vector<std::string> progress;
  auto cells = RunSweep(EchoConfig(), options, loader, [&](int i, int n, const std::string& what) {
    progress.push_back(fmt::format("{}/{} {}", i + 1, n, what));
  });
  ASSERT_TRUE(cells.ok()) << cells.status().ToString();
  // 3 batch sizes x (3 backends in fp32 + aotinductor alone in int8: TorchScript has none).
  ASSERT_EQ(cells->size(), 12u);
  ASSERT_EQ(loaded.size(), 4u);  // One load per (backend, precision).
  EXPECT_EQ(loaded[0].backend, BackendKind::kTorchScript);
  EXPECT_EQ(loaded[0].model_file, "model.pt");
  EXPECT_FALSE(loaded[0].optimize.freeze);
  EXPECT_TRUE(loaded[1].optimize.freeze);
  EXPECT_EQ(loaded[2].backend, BackendKind::kAotInductor);
  EXPECT_EQ(loaded[2].model_file, "model.pt2");
  EXPECT_EQ(loaded[3].precision, Precision::kInt8);
  EXPECT_EQ(loaded[3].model_file, "model_int8.pt2");
  EXPECT_EQ(loaded[0].warmup_batch_sizes, (std::vector<int>{1, 4, 8}));
  EXPECT_EQ(log.runs, 12 * 4);
  EXPECT_EQ((*cells)[5].batch_size, 8);
  EXPECT_EQ(BackendVariantName((*cells)[5].backend), "torchscript+freeze");
  EXPECT_THAT(progress.back(), HasSubstr("12/12 batch 8 aotinductor int8"));

  auto dir = CreateRunDirectory(base_, "sweep-echo");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(
      WriteSweepResults(*dir, RunInfo{"sluice sweep", "echo"}, EchoConfig(), options, *cells).ok());
  std::string csv = Read(*dir / "summary.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 13);
  EXPECT_THAT(csv, HasSubstr("\n8,torchscript+freeze,fp32,3,0,"));
  EXPECT_THAT(csv, HasSubstr("\n8,aotinductor,int8,3,0,"));
  EXPECT_THAT(Read(*dir / "throughput_vs_batch_size.svg"), HasSubstr("torchscript fp32"));
  EXPECT_THAT(Read(*dir / "throughput_vs_batch_size.svg"), HasSubstr("aotinductor int8"));
  EXPECT_THAT(Read(*dir / "latency_vs_batch_size.svg"), HasSubstr("average latency (ms)"));
  EXPECT_THAT(Read(*dir / "summary.json"), HasSubstr("\"precision\":\"int8\""));
  EXPECT_THAT(Read(*dir / "run.json"), HasSubstr("\"backends\":[\"torchscript\""));
  EXPECT_THAT(FormatSweepTable(*cells), HasSubstr("samples/s"));
}

TEST(SweepTest, RejectsBatchSizesOverTheModelsMaximum) {
  EchoLog log;
  SweepOptions options;
  options.batch_sizes = {1, 16};
  BackendLoader loader = [&](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    return std::shared_ptr<Backend>(std::make_unique<EchoBackend>(&log));
  };
  EXPECT_THAT(RunSweep(EchoConfig(8), options, loader).status().message(),
              HasSubstr("batch size 16 must be between 1 and the model's max_batch_size 8"));
  BackendLoader failing = [](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    return Status::InvalidArgument("cannot load");
  };
  options.batch_sizes = {1};
  EXPECT_THAT(RunSweep(EchoConfig(8), options, failing).status().message(),
              HasSubstr("cannot load"));
}

}  // namespace
}  // namespace sluice
