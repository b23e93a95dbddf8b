// Black-box tests of `sluice serve`: the real binary on an ephemeral loopback port, with the tiny
// test models, spoken to over real HTTP/1.1 sockets.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/http_load.h"
#include "codec/image_testing.h"
#include "server_process.h"

namespace {

using sluice_test::Client;
using sluice_test::ReadFile;
using sluice_test::Response;
using sluice_test::ServerProcess;
using sluice_test::WaitForStats;

std::string IdentityJson(int first, const std::string& id = "") {
  std::string data;
  for (int i = 0; i < 16; ++i) {
    if (i) data += ',';
    data += std::to_string(first + i);
  }
  return std::string("{") + (id.empty() ? "" : "\"id\":\"" + id + "\",") +
         R"("inputs":[{"name":"input","shape":[1,16],"datatype":"FP32","data":[)" + data + "]}]}";
}

std::string ExpectedIdentityData(int first) {
  std::string data;
  for (int i = 0; i < 16; ++i) {
    if (i) data += ',';
    data += std::to_string(first + i);
  }
  return "\"data\":[" + data + "]";
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--max-body-bytes", "200000", "--max-header-bytes", "4096"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_GT(server_->port(), 0) << server_->output(); }
  int port() const { return server_->port(); }

  static ServerProcess* server_;
};
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, HealthAndMetadata) {
  Client c(port());
  Response v2 = c.Request("GET", "/v2");
  EXPECT_EQ(v2.status, 200);
  EXPECT_NE(v2.body.find(R"("extensions":["binary_tensor_data"])"), std::string::npos);
  EXPECT_EQ(c.Request("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(c.Request("GET", "/v2/health/ready").body, R"({"ready":true})");
  Response meta = c.Request("GET", "/v2/models/tiny_cnn");
  EXPECT_EQ(meta.status, 200);
  EXPECT_NE(meta.body.find(R"({"name":"input","datatype":"FP32","shape":[-1,3,16,16]})"),
            std::string::npos)
      << meta.body;
  EXPECT_EQ(c.Request("GET", "/v2/models/tiny_cnn/versions/1").body, meta.body);
  EXPECT_EQ(c.Request("GET", "/v2/models/identity/ready").status, 200);
  EXPECT_EQ(c.Request("GET", "/v2/models/identity/versions/1/ready").status, 200);
  Response unknown = c.Request("GET", "/v2/models/nope");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body, R"({"error":"unknown model 'nope'"})");
  EXPECT_EQ(c.Request("GET", "/v2/models/identity/versions/7").status, 404);
  EXPECT_EQ(c.Request("GET", "/v2/models/..%2Fetc/ready").status, 400);
}

TEST_F(ServerTest, JsonInferReturnsTheModelsOutput) {
  Client c(port());
  Response r = c.Request("POST", "/v2/models/identity/infer", IdentityJson(3, "req-7"),
                         "Content-Type: application/json\r\n");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_NE(r.body.find(R"("model_name":"identity","model_version":"1","id":"req-7")"),
            std::string::npos);
  EXPECT_NE(r.body.find(R"("shape":[1,16],)" + ExpectedIdentityData(3)), std::string::npos)
      << r.body;
  EXPECT_NE(r.headers["server-timing"].find("queue;dur="), std::string::npos);
  EXPECT_NE(r.headers["server-timing"].find("infer;dur="), std::string::npos);
  Response versioned = c.Request("POST", "/v2/models/identity/versions/1/infer", IdentityJson(5));
  EXPECT_NE(versioned.body.find(ExpectedIdentityData(5)), std::string::npos);
}

// tiny_cnn is TorchScript; tiny_cnn_aot the same weights as an AOTInductor package (inferred
// from the file), whose batch of 4 runs on its bucket of 4; both give Python's answer.
TEST_F(ServerTest, BinaryInferMatchesThePythonReference) {
  const std::string dir = std::string(SLUICE_TEST_MODELS) + "/tiny_cnn/reference/";
  const std::string input = ReadFile(dir + "input_input.bin");
  const std::string expected = ReadFile(dir + "output_logits.bin");
  ASSERT_EQ(input.size(), 4u * 3 * 16 * 16 * 4);
  ASSERT_EQ(expected.size(), 4u * 5 * 4);
  std::string header =
      R"({"inputs":[{"name":"input","shape":[4,3,16,16],"datatype":"FP32","parameters":{"binary_data_size":)" +
      std::to_string(input.size()) +
      R"(}}],"outputs":[{"name":"logits","parameters":{"binary_data":true}}]})";
  Client c(port());
  for (const std::string model : {"tiny_cnn", "tiny_cnn_aot"}) {
    Response r = c.Request("POST", "/v2/models/" + model + "/infer", header + input,
                           "Content-Type: application/octet-stream\r\n"
                           "Inference-Header-Content-Length: " +
                               std::to_string(header.size()) + "\r\n");
    ASSERT_EQ(r.status, 200) << model << ": " << r.body;
    ASSERT_TRUE(r.headers.count("inference-header-content-length"));
    size_t json_size = std::stoul(r.headers["inference-header-content-length"]);
    EXPECT_NE(r.body.substr(0, json_size).find(R"("binary_data_size":80)"), std::string::npos);
    ASSERT_EQ(r.body.size(), json_size + expected.size());
    std::vector<float> got(20), want(20);
    std::memcpy(got.data(), r.body.data() + json_size, 80);
    std::memcpy(want.data(), expected.data(), 80);
    for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << model << " " << i;
  }
}

TEST_F(ServerTest, RawBodyInferForASingleInputModel) {
  std::vector<float> values(32);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  std::string body(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  Client c(port());
  Response r = c.Request("POST", "/v2/models/identity/infer", body,
                         "Inference-Header-Content-Length: 0\r\n");
  ASSERT_EQ(r.status, 200) << r.body;
  size_t json_size = std::stoul(r.headers["inference-header-content-length"]);
  ASSERT_EQ(r.body.size(), json_size + body.size());
  EXPECT_EQ(r.body.substr(json_size), body);
  EXPECT_NE(r.body.find(R"("shape":[2,16])"), std::string::npos);
}

TEST_F(ServerTest, BadRequestsGetAClearErrorAndTheServerKeepsServing) {
  Client c(port());
  struct Case {
    std::string method, path, body, headers;
    int status;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"POST", "/v2/models/identity/infer", "{not json", "", 400, "malformed JSON"},
      {"POST", "/v2/models/identity/infer", "", "", 400, "malformed JSON"},
      {"POST", "/v2/models/identity/infer",
       R"({"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1]}]})", "", 400,
       "has no input \\\"x\\\""},
      {"POST", "/v2/models/identity/infer",
       R"({"inputs":[{"name":"input","shape":[1,16],"datatype":"INT64","data":[1]}]})", "", 400,
       "datatype \\\"INT64\\\" does not match the model's FP32"},
      {"POST", "/v2/models/identity/infer",
       R"({"inputs":[{"name":"input","shape":[1,16],"datatype":"FP32","data":[1,2]}]})", "", 400,
       "data holds 2 elements"},
      {"POST", "/v2/models/identity/infer",
       R"({"inputs":[{"name":"input","shape":[1,1000000000000],"datatype":"FP32","data":[1]}]})",
       "", 400, "does not match"},
      {"POST", "/v2/models/identity/infer",
       R"({"inputs":[{"name":"input","shape":[65,16],"datatype":"FP32","parameters":{"binary_data_size":4160}}]})",
       "", 400, "0 binary bytes after the JSON header"},
      {"POST", "/v2/models/identity/infer", "{}", "Inference-Header-Content-Length: 99\r\n", 400,
       "exceeds the body"},
      {"POST", "/v2/models/identity/infer", "{}", "Inference-Header-Content-Length: x\r\n", 400,
       "must be a non-negative integer"},
      {"POST", "/v2/models/nope/infer", "{}", "", 404, "unknown model 'nope'"},
      {"GET", "/v2/models/identity/infer", "", "", 405, "use POST"},
      {"GET", "/nowhere", "", "", 404, "no route for GET /nowhere"},
  };
  for (const Case& k : cases) {
    Response r = c.Request(k.method, k.path, k.body, k.headers);
    EXPECT_EQ(r.status, k.status) << k.path << " " << k.body << "\n" << r.body;
    EXPECT_EQ(r.headers["content-type"], "application/json");
    EXPECT_NE(r.body.find(k.fragment), std::string::npos) << r.body;
    EXPECT_EQ(r.body.rfind("{\"error\":", 0), 0u) << r.body;
  }
  // More samples than max_batch_size (64) is refused by the engine.
  std::string data;
  for (int i = 0; i < 65 * 16; ++i) data += (i ? ",1" : "1");
  Response big = c.Request(
      "POST", "/v2/models/identity/infer",
      R"({"inputs":[{"name":"input","shape":[65,16],"datatype":"FP32","data":[)" + data + "]}]}");
  EXPECT_EQ(big.status, 400);
  EXPECT_NE(big.body.find("max_batch_size"), std::string::npos) << big.body;
  // Still serving on the same connection.
  EXPECT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(1)).status, 200);
}

TEST_F(ServerTest, OversizedBodiesAndHeadersAreRefused) {
  Client body_client(port());
  Response big = body_client.Request("POST", "/v2/models/identity/infer", std::string(300000, ' '));
  EXPECT_EQ(big.status, 413);
  EXPECT_NE(big.body.find("exceeds the limit of 200000 bytes"), std::string::npos) << big.body;
  Client header_client(port());
  Response huge =
      header_client.Request("GET", "/v2", "", "X-Filler: " + std::string(8000, 'a') + "\r\n");
  EXPECT_EQ(huge.status, 431);
  Client garbage(port());
  garbage.SendRaw("THIS IS NOT HTTP\r\n\r\n");
  EXPECT_EQ(garbage.Read().status, 400);
  EXPECT_EQ(Client(port()).Request("GET", "/v2/health/live").status, 200);
}

TEST_F(ServerTest, KeepAliveOverManyRequestsAndPipelining) {
  Client c(port());
  for (int i = 0; i < 200; ++i) {
    Response r = c.Request("POST", "/v2/models/identity/infer", IdentityJson(i));
    ASSERT_EQ(r.status, 200);
    ASSERT_NE(r.body.find(ExpectedIdentityData(i)), std::string::npos);
    ASSERT_FALSE(r.closed);
  }
  // Two requests in one write: two responses, in order.
  std::string a = IdentityJson(100), b = IdentityJson(200);
  c.SendRaw("POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " +
            std::to_string(a.size()) + "\r\n\r\n" + a +
            "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " +
            std::to_string(b.size()) + "\r\n\r\n" + b);
  EXPECT_NE(c.Read().body.find(ExpectedIdentityData(100)), std::string::npos);
  EXPECT_NE(c.Read().body.find(ExpectedIdentityData(200)), std::string::npos);
}

TEST_F(ServerTest, ChunkedRequestBodiesAreReassembledAndLimited) {
  Client c(port());
  const std::string body = IdentityJson(7);
  std::string chunked =
      "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  for (size_t at = 0; at < body.size(); at += 50) {
    std::string part = body.substr(at, 50);
    char size[16];
    std::snprintf(size, sizeof size, "%zx", part.size());
    chunked += std::string(size) + (at == 0 ? ";ext=1" : "") + "\r\n" + part + "\r\n";
  }
  chunked += "0\r\n\r\n";
  ASSERT_TRUE(c.SendRaw(chunked));
  Response r = c.Read();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find(ExpectedIdentityData(7)), std::string::npos) << r.body;
  EXPECT_FALSE(r.closed);

  // Chunks adding up to more than --max-body-bytes (200000): 413 before the rest is read.
  Client big(port());
  std::string head =
      "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const std::string chunk = "10000\r\n" + std::string(0x10000, ' ') + "\r\n";
  big.SendRaw(head + chunk + chunk + chunk + chunk);
  Response refused = big.Read();
  EXPECT_EQ(refused.status, 413);
  EXPECT_TRUE(refused.closed);

  // A chunk size that is not hex: 400, connection closed.
  Client bad(port());
  bad.SendRaw(head + "zz\r\nabc\r\n0\r\n\r\n");
  Response malformed = bad.Read();
  EXPECT_EQ(malformed.status, 400);
  EXPECT_TRUE(malformed.closed);
}

TEST_F(ServerTest, ContentLengthShorterThanTheBodyIsAClearError) {
  // The declared 10 bytes are parsed as the body (400: not JSON); the bytes after them are not
  // HTTP (400, connection closed). Nothing hangs.
  Client c(port());
  const std::string body = IdentityJson(1);
  c.SendRaw("POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n" +
            body);
  Response first = c.Read();
  EXPECT_EQ(first.status, 400);
  EXPECT_NE(first.body.find("\"error\""), std::string::npos) << first.body;
  Response second = c.Read();
  EXPECT_EQ(second.status, 400);
  EXPECT_TRUE(second.closed);
  EXPECT_EQ(Client(port()).Request("GET", "/v2/health/live").status, 200);
}

TEST_F(ServerTest, Http10KeepAliveOnlyWhenAsked) {
  Client keep(port());
  keep.set_http10(true);
  keep.SendRaw("GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  Response first = keep.Read();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.headers["connection"], "keep-alive");
  keep.SendRaw("GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  EXPECT_EQ(keep.Read().status, 200);

  Client once(port());
  once.set_http10(true);
  once.SendRaw("GET /v2/health/live HTTP/1.0\r\n\r\n");
  EXPECT_EQ(once.Read().status, 200);
  EXPECT_TRUE(once.ClosedByServer());
}

TEST_F(ServerTest, ConcurrentClientsEachGetTheirOwnAnswers) {
  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      Client c(port());
      for (int i = 0; i < 40; ++i) {
        int first = t * 1000 + i;
        Response r = c.Request("POST", "/v2/models/identity/infer", IdentityJson(first));
        if (r.status == 200 && r.body.find(ExpectedIdentityData(first)) != std::string::npos) {
          ++good;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(good.load(), 16 * 40);
  Client c(port());
  Response stats = c.Request("GET", "/v2/models/identity/stats");
  EXPECT_EQ(stats.status, 200);
  EXPECT_NE(stats.body.find("\"batch_size\""), std::string::npos);
  // The batcher's learned costs: the warm-up sizes (1 and 64) at least, and what it targets.
  EXPECT_NE(stats.body.find("\"policy\":\"adaptive\""), std::string::npos) << stats.body;
  EXPECT_NE(stats.body.find("{\"batch_size\":64,\"seconds\":"), std::string::npos) << stats.body;
  EXPECT_NE(stats.body.find("\"target_batch_size\":"), std::string::npos);
  EXPECT_NE(stats.body.find("\"drain_samples_per_second\":"), std::string::npos);
  Response metrics = c.Request("GET", "/metrics");
  EXPECT_NE(metrics.body.find("sluice_batch_drain_rate{model=\"identity\"}"), std::string::npos);
  EXPECT_NE(metrics.body.find("sluice_batch_cost_seconds{model=\"identity\",batch_size=\"1\"}"),
            std::string::npos);
  EXPECT_NE(metrics.body.find("sluice_batch_target_size{model=\"identity\"}"), std::string::npos);
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.headers["content-type"], "text/plain; version=0.0.4");
  EXPECT_NE(metrics.body.find("sluice_requests_total{model=\"identity\",outcome=\"ok\"}"),
            std::string::npos);
  EXPECT_NE(metrics.body.find("sluice_batch_size_bucket{model=\"identity\",le=\"64\"}"),
            std::string::npos);
  EXPECT_NE(metrics.body.find("sluice_http_request_seconds_count"), std::string::npos);
}

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
  pclose(pipe);
  return out;
}

TEST_F(ServerTest, LoadGeneratorMeasuresTheServer) {
  const std::string url = "http://127.0.0.1:" + std::to_string(port());
  for (const char* mode : {"--json", "--binary"}) {
    std::string out =
        RunCommand(std::string(SLUICE_BINARY) + " bench --url " + url +
                   " --model identity --concurrency 1,4 --duration 0.5 --warmup 0.2 " + mode +
                   " --no-results 2>&1");
    // One row per level, no errors, and the server's batch sizes scraped from /metrics.
    std::istringstream lines(out);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      std::istringstream row(line);
      std::string conns, rate;
      double rps, sps, p50, p90, p99, mean, errors, batch;
      if (row >> conns >> rate >> rps >> sps >> p50 >> p90 >> p99 >> mean >> errors >> batch &&
          rate == "closed") {
        ++rows;
        EXPECT_GT(rps, 10) << line;
        EXPECT_EQ(errors, 0) << line;
        EXPECT_GE(batch, 1.0) << line;
        EXPECT_LE(p50, p99) << line;
      }
    }
    EXPECT_EQ(rows, 2) << out;
  }
  std::string open_loop = RunCommand(std::string(SLUICE_BINARY) + " bench --url " + url +
                                     " --model identity --rate 200 --duration 0.5 --warmup 0.2"
                                     " --no-results 2>&1");
  EXPECT_NE(open_loop.find("open loop 200 requests/s"), std::string::npos) << open_loop;
  std::string refused = RunCommand(std::string(SLUICE_BINARY) +
                                   " bench --url http://127.0.0.1:1 --model identity 2>&1");
  EXPECT_NE(refused.find("error: "), std::string::npos) << refused;
}

TEST(ServerLifecycleTest, SigtermAnswersEveryRequestInFlightAndExitsZero) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0) << server.output();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 32; ++i) {
    clients.push_back(std::make_unique<Client>(server.port()));
    std::string body = IdentityJson(i);
    ASSERT_TRUE(
        clients.back()->SendRaw("POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                                "Content-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body));
  }
  // The signal lands while requests are queued, running, read but not parsed, or still in the
  // kernel's accept queue: every one of them is answered.
  std::thread stopper([&] { EXPECT_EQ(server.Stop(), 0); });
  int answered = 0;
  for (int i = 0; i < 32; ++i) {
    Response r = clients[static_cast<size_t>(i)]->Read();
    if (r.status == 200 && r.body.find(ExpectedIdentityData(i)) != std::string::npos) ++answered;
  }
  stopper.join();
  EXPECT_EQ(answered, 32);
}

// A repository with one model, "slow": the identity model whose batcher waits 3 s for company,
// so a single request stays queued long enough to watch.
std::string MakeSlowRepository() {
  std::string dir = testing::TempDir() + "/slow-repo-" + std::to_string(getpid());
  std::string model = dir + "/slow";
  std::system(("mkdir -p " + model).c_str());
  std::ofstream(model + "/model.pt", std::ios::binary)
      << ReadFile(std::string(SLUICE_TEST_MODELS) + "/identity/model.pt");
  std::ofstream(model + "/config.yaml")
      << "max_batch_size: 64\n"
         "dynamic_batching: {policy: fixed, max_queue_delay_us: 3000000}\n"
         "instances: {count: 1, threads: 1}\n"
         "inputs: [{name: input, datatype: FP32, shape: [16]}]\n"
         "outputs: [{name: output, datatype: FP32, shape: [16]}]\n";
  return dir;
}

TEST(ServerLifecycleTest, ClientDisconnectCancelsItsQueuedRequest) {
  ServerProcess server({}, MakeSlowRepository());
  ASSERT_GT(server.port(), 0) << server.output();
  {
    Client leaver(server.port());
    std::string body = IdentityJson(1);
    ASSERT_TRUE(
        leaver.SendRaw("POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
    ASSERT_TRUE(WaitForStats(server.port(), "\"queued_requests\":1,"));
  }  // The client closes its socket while the request waits for company.
  // Cancelled and its slot freed long before the 3 s delay could have run it.
  EXPECT_TRUE(WaitForStats(server.port(), "\"queued_requests\":0,"));
  EXPECT_TRUE(WaitForStats(server.port(), "\"cancelled\":1"));
  Client c(server.port());
  Response stats = c.Request("GET", "/v2/models/slow/stats");
  EXPECT_NE(stats.body.find("\"ok\":0"), std::string::npos) << stats.body;
  EXPECT_EQ(server.Stop(), 0);
}

// A repository with "vision": tiny_cnn (3x16x16 input, 5 classes) behind preprocess.image, with
// labels.
std::string MakeVisionRepository() {
  std::string dir = testing::TempDir() + "/vision-repo-" + std::to_string(getpid());
  std::string model = dir + "/vision";
  std::system(("mkdir -p " + model).c_str());
  std::ofstream(model + "/model.pt", std::ios::binary)
      << ReadFile(std::string(SLUICE_TEST_MODELS) + "/tiny_cnn/model.pt");
  std::ofstream(model + "/config.yaml")
      << "max_batch_size: 8\n"
         "instances: {count: 1, threads: 1}\n"
         "inputs: [{name: input, datatype: FP32, shape: [3, 16, 16]}]\n"
         "outputs: [{name: logits, datatype: FP32, shape: [5]}]\n"
         "preprocess: {image: {resize: 16, crop: 16, channels: 3}}\n"
         "postprocess: {topk: 3}\n";
  std::ofstream(model + "/labels.txt") << "zero\none\ntwo\nthree\nfour\n";
  return dir;
}

// A 16x16 RGB PNG of varied pixels.
std::string TestPng(std::vector<float>* as_tensor) {
  std::vector<uint8_t> rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 37) % 251);
  as_tensor->assign(3 * 16 * 16, 0);
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 16; ++x) {
      for (int c = 0; c < 3; ++c) {
        (*as_tensor)[static_cast<size_t>((c * 16 + y) * 16 + x)] =
            static_cast<float>(rgb[static_cast<size_t>((y * 16 + x) * 3 + c)]) / 255.0f;
      }
    }
  }
  return sluice::test_images::EncodePng(rgb, 16, 16);
}

std::string Base64(std::string_view in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The numbers of a v2 JSON answer's first output; empty when there is none.
std::vector<double> Logits(const std::string& body) {
  std::vector<double> values;
  const size_t begin = body.find("\"data\":[");
  if (begin == std::string::npos) return values;
  std::istringstream in(body.substr(begin + 8, body.find(']', begin) - begin - 8));
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stod(item));
  return values;
}

TEST(ServerPredictTest, ImagesAreClassifiedLikeTheTensorPath) {
  ServerProcess server({}, MakeVisionRepository());
  ASSERT_GT(server.port(), 0) << server.output();
  std::vector<float> tensor;
  const std::string png = TestPng(&tensor);
  Client c(server.port());

  // The same pixels as a tensor through KServe v2: the reference logits.
  std::string data;
  for (size_t i = 0; i < tensor.size(); ++i) {
    if (i) data += ',';
    data += std::to_string(tensor[i]);
  }
  Response v2 =
      c.Request("POST", "/v2/models/vision/infer",
                R"({"inputs":[{"name":"input","shape":[1,3,16,16],"datatype":"FP32","data":[)" +
                    data + "]}]}");
  ASSERT_EQ(v2.status, 200) << v2.body;
  const std::vector<double> logits = Logits(v2.body);
  const int best =
      static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const char* names[] = {"zero", "one", "two", "three", "four"};

  Response torchserve = c.Request("POST", "/predictions/vision", png);
  ASSERT_EQ(torchserve.status, 200) << torchserve.body;
  EXPECT_EQ(torchserve.body.find(std::string("{\"") + names[best] + "\":"), 0u) << torchserve.body;
  EXPECT_NE(torchserve.headers["server-timing"].find("decode;dur="), std::string::npos);

  Response litserve = c.Request("POST", "/predict", "{\"image\":\"" + Base64(png) + "\"}");
  ASSERT_EQ(litserve.status, 200) << litserve.body;
  EXPECT_EQ(litserve.body.find("{\"output\":" + std::to_string(best) + ",\"label\":\"" +
                               names[best] + "\""),
            0u)
      << litserve.body;
  EXPECT_NE(litserve.body.find("\"topk\":[{\"index\":" + std::to_string(best)), std::string::npos);

  // A JPEG of the same pixels: lossy, so only the form of the answer is checked.
  std::vector<uint8_t> rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 37) % 251);
  const std::string jpeg = sluice::test_images::EncodeJpeg(rgb, 16, 16, 95);
  ASSERT_FALSE(jpeg.empty());
  Response from_jpeg = c.Request("POST", "/predictions/vision", jpeg);
  ASSERT_EQ(from_jpeg.status, 200) << from_jpeg.body;
  int labels_in_reply = 0;
  for (const char* name : names) {
    labels_in_reply += from_jpeg.body.find(std::string("\"") + name + "\":") != std::string::npos;
  }
  EXPECT_EQ(labels_in_reply, 3) << from_jpeg.body;  // postprocess.topk: 3.

  // Bad images and bodies: clear errors, and the server goes on.
  EXPECT_EQ(c.Request("POST", "/predictions/vision", "").status, 400);
  Response not_image = c.Request("POST", "/predictions/vision", "GIF89a-not-supported");
  EXPECT_EQ(not_image.body, R"({"error":"not a PNG or JPEG image"})");
  EXPECT_EQ(c.Request("POST", "/predictions/vision", png.substr(0, png.size() / 2)).status, 400);
  EXPECT_NE(c.Request("POST", "/predict", R"({"image":"%%%"})").body.find("invalid base64"),
            std::string::npos);
  EXPECT_EQ(c.Request("POST", "/predict", R"({"picture":"x"})").status, 400);
  EXPECT_EQ(c.Request("POST", "/predictions/nope", png).status, 404);
  EXPECT_EQ(c.Request("POST", "/predictions/vision", png).status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerSecurityTest, ApiKeyGuardsEveryRouteButHealth) {
  setenv("SLUICE_API_KEY", "s3cret-key", 1);
  ServerProcess server;
  unsetenv("SLUICE_API_KEY");
  ASSERT_GT(server.port(), 0) << server.output();
  Client c(server.port());
  EXPECT_EQ(c.Request("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(c.Request("GET", "/v2/health/ready").status, 200);
  Response missing = c.Request("GET", "/v2/models/identity");
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.body, R"({"error":"missing or invalid API key"})");
  EXPECT_EQ(c.Request("GET", "/metrics", "", "X-API-Key: s3cret-kez\r\n").status, 401);
  EXPECT_EQ(c.Request("GET", "/metrics", "", "X-API-Key: s3cret-key-longer\r\n").status, 401);
  EXPECT_EQ(c.Request("GET", "/v2/models/identity", "", "X-API-Key: s3cret-key\r\n").status, 200);
  Response bearer = c.Request("POST", "/v2/models/identity/infer", IdentityJson(2),
                              "Authorization: Bearer s3cret-key\r\n");
  EXPECT_EQ(bearer.status, 200);
  EXPECT_NE(bearer.body.find(ExpectedIdentityData(2)), std::string::npos);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerSecurityTest, SlowClientsAreTimedOut) {
  ServerProcess server({"--header-timeout", "0.5", "--body-timeout", "0.5", "--idle-timeout", "1"});
  ASSERT_GT(server.port(), 0) << server.output();
  // A header that never completes: 408, then closed.
  Client slow_header(server.port());
  slow_header.SendRaw("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n");
  Response header_timeout = slow_header.Read();
  EXPECT_EQ(header_timeout.status, 408);
  EXPECT_TRUE(slow_header.ClosedByServer());
  // A body shorter than its Content-Length: 408 as well.
  Client short_body(server.port());
  short_body.SendRaw(
      "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
      "Content-Length: 100\r\n\r\n{\"inputs\":");
  EXPECT_EQ(short_body.Read().status, 408);
  // An idle connection is closed without a word.
  Client idle(server.port());
  EXPECT_TRUE(idle.ClosedByServer(3000));
  // Others are served meanwhile.
  EXPECT_EQ(Client(server.port()).Request("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLifecycleTest, ModelThatFailsToLoadLeavesTheServerUp) {
  std::string dir = testing::TempDir() + "/broken-repo-" + std::to_string(getpid());
  std::system(("mkdir -p " + dir + "/broken " + dir + "/identity").c_str());
  std::ofstream(dir + "/broken/model.pt") << "this is not TorchScript";
  std::ofstream(dir + "/broken/config.yaml")
      << "max_batch_size: 4\ninputs: [{name: x, datatype: FP32, shape: [2]}]\n"
         "outputs: [{name: y, datatype: FP32, shape: [2]}]\n";
  std::ofstream(dir + "/identity/model.pt", std::ios::binary)
      << ReadFile(std::string(SLUICE_TEST_MODELS) + "/identity/model.pt");
  std::ofstream(dir + "/identity/config.yaml")
      << ReadFile(std::string(SLUICE_TEST_MODELS) + "/identity/config.yaml");
  ServerProcess server({}, dir);
  ASSERT_GT(server.port(), 0) << server.output();
  Client c(server.port());
  Response ready = c.Request("GET", "/v2/health/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, R"({"ready":false})");
  Response broken = c.Request("GET", "/v2/models/broken");
  EXPECT_EQ(broken.status, 503);
  EXPECT_NE(broken.body.find("model 'broken' failed to load"), std::string::npos) << broken.body;
  EXPECT_EQ(c.Request("GET", "/v2/models/broken/ready").status, 503);
  EXPECT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(4)).status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLifecycleTest, PrecisionAutoServesTheExportersChoiceAndNamesIt) {
  // tiny_cnn_aot's packages under a config that says precision: auto, chosen int8.
  std::string dir = testing::TempDir() + "/auto-repo-" + std::to_string(getpid());
  const std::string src = std::string(SLUICE_TEST_MODELS) + "/tiny_cnn_aot";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/cnn && ln -s " + src + "/model.pt2 " +
               src + "/model_int8.pt2 " + dir + "/cnn/")
                  .c_str());
  std::ofstream(dir + "/cnn/config.yaml")
      << ReadFile(src + "/config.yaml")
      << "precision: auto\nprecision_auto:\n  chosen: int8\n  note: \"2.0x fp32, top-1 99.5%\"\n";
  ServerProcess server({}, dir);
  ASSERT_GT(server.port(), 0) << server.output();
  EXPECT_NE(server.output().find("precision int8 (auto: 2.0x fp32, top-1 99.5%)"),
            std::string::npos)
      << server.output();
  Client c(server.port());
  Response meta = c.Request("GET", "/v2/models/cnn");
  EXPECT_NE(meta.body.find(R"("parameters":{"precision":"int8","precision_chosen_by":"auto: )"
                           R"(2.0x fp32, top-1 99.5%","backend":"aotinductor",)"
                           R"("model_file":"model_int8.pt2","device":"cpu","instances":1,)"
                           R"("image_input":false})"),
            std::string::npos)
      << meta.body;
  std::string zeros;
  for (int i = 0; i < 3 * 16 * 16; ++i) zeros += i ? ",0" : "0";
  Response infer =
      c.Request("POST", "/v2/models/cnn/infer",
                R"({"inputs":[{"name":"input","shape":[1,3,16,16],"datatype":"FP32","data":[)" +
                    zeros + "]}]}");
  EXPECT_EQ(infer.status, 200) << infer.body;
  EXPECT_EQ(server.Stop(), 0);
  std::system(("rm -rf " + dir).c_str());
}

bool Near(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > tolerance) return false;
  }
  return true;
}

TEST(ServerLifecycleTest, InstancesSharingCoresAnswerConcurrentClientsAndSaySo) {
  // tiny_cnn_aot with two instances on one pool of cores, under eight concurrent clients.
  std::string dir = testing::TempDir() + "/shared-cores-" + std::to_string(getpid());
  const std::string src = std::string(SLUICE_TEST_MODELS) + "/tiny_cnn_aot";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/cnn && ln -s " + src + "/model.pt2 " +
               dir + "/cnn/")
                  .c_str());
  std::ofstream(dir + "/cnn/config.yaml")
      << "max_batch_size: 8\ninstances: {count: 2, threads: 1, share_cores: true}\n"
         "inputs: [{name: input, datatype: FP32, shape: [3, 16, 16]}]\n"
         "outputs: [{name: logits, datatype: FP32, shape: [5]}]\nwarmup: {batch_sizes: [1, 4]}\n";
  ServerProcess server({}, dir);
  ASSERT_GT(server.port(), 0) << server.output();
  const int cores = std::min(2, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_NE(server.output().find(fmt::format("2 instance(s) sharing {} core(s)", cores)),
            std::string::npos)
      << server.output();
  Client c(server.port());
  Response meta = c.Request("GET", "/v2/models/cnn");
  EXPECT_NE(meta.body.find(fmt::format(R"("instances":2,"shared_cores":{},)", cores)),
            std::string::npos)
      << meta.body;
  // Every answer is the one the same input gets alone, whichever instance, share of the cores
  // and batch ran it (within float reordering: the thread count splits the sums differently).
  std::string zeros;
  for (int i = 0; i < 3 * 16 * 16; ++i) zeros += i ? ",0" : "0";
  const std::string body =
      R"({"inputs":[{"name":"input","shape":[1,3,16,16],"datatype":"FP32","data":[)" + zeros +
      "]}]}";
  const std::vector<double> alone = Logits(c.Request("POST", "/v2/models/cnn/infer", body).body);
  ASSERT_EQ(alone.size(), 5u);
  std::atomic<int> same{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      Client client(server.port());
      for (int i = 0; i < 25; ++i) {
        Response r = client.Request("POST", "/v2/models/cnn/infer", body);
        if (r.status == 200 && Near(Logits(r.body), alone, 1e-4)) ++same;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(same.load(), 8 * 25);
  Response stats = c.Request("GET", "/v2/models/cnn/stats");
  EXPECT_NE(stats.body.find("\"instances\":2"), std::string::npos) << stats.body;
  EXPECT_EQ(server.Stop(), 0);
  std::system(("rm -rf " + dir).c_str());
}

TEST_F(ServerTest, ModelFailureFailsOnlyTheBadRequestOfItsBatch) {
  // Four concurrent requests make one batch ("faulty" dispatches at 4); the third holds the
  // marker that makes the TorchScript model raise. The batch fails, is retried request by
  // request, and only the bad one fails.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<Client>(port()));
    std::string value = i == 2 ? "-12345" : std::to_string(i + 1);
    std::string body = R"({"inputs":[{"name":"input","shape":[1,2],"datatype":"FP32","data":[)" +
                       value + ",0.5]}]}";
    ASSERT_TRUE(
        clients.back()->SendRaw("POST /v2/models/faulty/infer HTTP/1.1\r\nHost: x\r\n"
                                "Content-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body));
  }
  for (int i = 0; i < 4; ++i) {
    Response r = clients[static_cast<size_t>(i)]->Read();
    if (i == 2) {
      EXPECT_EQ(r.status, 500);
      EXPECT_NE(r.body.find("marker input"), std::string::npos) << r.body;
    } else {
      EXPECT_EQ(r.status, 200) << r.body;
      EXPECT_NE(r.body.find("\"data\":[" + std::to_string(2 * (i + 1)) + ",1]"), std::string::npos)
          << r.body;
    }
  }
  Client c(port());
  Response stats = c.Request("GET", "/v2/models/faulty/stats");
  EXPECT_NE(stats.body.find("\"failed_batches\":1,"), std::string::npos) << stats.body;
  EXPECT_NE(stats.body.find("\"internal\":1"), std::string::npos) << stats.body;
}

TEST_F(ServerTest, PathTraversalInModelNamesIsRefused) {
  Client c(port());
  for (const char* path : {"/v2/models/../ready", "/v2/models/..%2F..%2Fetc%2Fpasswd/ready",
                           "/v2/models/.hidden", "/predictions/..", "/v2/models/a%00b/infer"}) {
    Response r = c.Request(
        path[1] == 'p' || std::string(path).find("infer") != std::string::npos ? "POST" : "GET",
        path, "{}");
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_NE(r.body.find("invalid model name"), std::string::npos) << r.body;
  }
}

TEST(ServerSecurityTest, ConnectionLimitRefusesTheExcessAndKeepsServing) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 4096);
  setrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < 2200) GTEST_SKIP() << "needs 2200 file descriptors";
  ServerProcess server({"--max-connections", "1500"});
  ASSERT_GT(server.port(), 0) << server.output();
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 2000; ++i) idle.push_back(std::make_unique<Client>(server.port()));
  // The first 1500 hold their slots; the rest are closed by the server at once.
  int closed = 0;
  for (size_t i = 1500; i < idle.size(); ++i) closed += idle[i]->ClosedByServer(2000);
  EXPECT_GE(closed, 450);
  // With 1500 connections open, those within the limit are still served.
  for (size_t i : {size_t{0}, size_t{750}, size_t{1499}}) {
    EXPECT_EQ(idle[i]->Request("GET", "/v2/health/live").status, 200) << i;
  }
  // Freeing slots lets new clients in.
  idle.resize(100);
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    served = Client(server.port()).Request("GET", "/v2/health/live").status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served);
  Client metrics(server.port());
  EXPECT_NE(metrics.Request("GET", "/metrics").body.find("sluice_http_refused_connections_total"),
            std::string::npos);
  idle.clear();
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLifecycleTest, UnusableRepositoryIsAClearError) {
  ServerProcess server({}, "/nonexistent/models");
  EXPECT_EQ(server.port(), 0);
  EXPECT_EQ(WEXITSTATUS(server.Stop()), 2);
}

TEST(ServerSecurityTest, ModelControlIsOffUnlessEnabled) {
  ServerProcess locked;
  ASSERT_GT(locked.port(), 0) << locked.output();
  Client c(locked.port());
  Response load = c.Request("POST", "/v2/repository/models/identity/load");
  EXPECT_EQ(load.status, 403);
  EXPECT_NE(load.body.find("--model-control"), std::string::npos) << load.body;
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/identity/unload").status, 403);
  EXPECT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(1)).status, 200);
  // Listing the repository is allowed either way.
  Response index = c.Request("POST", "/v2/repository/index");
  EXPECT_EQ(index.status, 200);
  EXPECT_NE(index.body.find(R"({"name":"identity","version":"1","state":"READY"})"),
            std::string::npos)
      << index.body;
  EXPECT_EQ(locked.Stop(), 0);
}

TEST(ServerLifecycleTest, ModelsLoadReloadAndUnloadWithModelControl) {
  const std::string dir = testing::TempDir() + "/control-repo-" + std::to_string(getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + " && cp -r " +
               std::string(SLUICE_TEST_MODELS) + "/identity " + dir + "/")
                  .c_str());
  ServerProcess server({"--model-control"}, dir);
  ASSERT_GT(server.port(), 0) << server.output();
  Client c(server.port());
  ASSERT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(1)).status, 200);

  // Unload: the model is gone, the repository still lists it, with why.
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/identity/unload").status, 200);
  EXPECT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(1)).status, 404);
  EXPECT_NE(
      c.Request("POST", "/v2/repository/index")
          .body.find(
              R"({"name":"identity","version":"1","state":"UNAVAILABLE","reason":"not loaded"})"),
      std::string::npos);
  EXPECT_EQ(c.Request("POST", "/v2/repository/index", R"({"ready":true})").body, "[]");
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/identity/unload").status, 404);

  // Load it back; load again (a reload) while it serves.
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/identity/load").status, 200);
  Response r = c.Request("POST", "/v2/models/identity/infer", IdentityJson(4));
  EXPECT_NE(r.body.find(ExpectedIdentityData(4)), std::string::npos) << r.body;
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/identity/load").status, 200);
  EXPECT_EQ(c.Request("POST", "/v2/models/identity/infer", IdentityJson(5)).status, 200);

  // A model added to the repository after start, with a broken config: 400 naming the problem,
  // reported by /v2/models/{m}; one that does not exist: 404; a bad name: 400.
  std::system(("mkdir -p " + dir + "/late").c_str());
  std::ofstream(dir + "/late/config.yaml") << "max_batch_size: 0\n";
  Response late = c.Request("POST", "/v2/repository/models/late/load");
  EXPECT_EQ(late.status, 400);
  EXPECT_NE(late.body.find("max_batch_size"), std::string::npos) << late.body;
  EXPECT_NE(c.Request("GET", "/v2/models/late").body.find("failed to load"), std::string::npos);
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/nope/load").status, 404);
  EXPECT_EQ(c.Request("POST", "/v2/repository/models/..%2Fetc/load").status, 400);
  EXPECT_EQ(server.Stop(), 0);
}

// A repository with "busy": a few milliseconds of arithmetic per sample, one sample per batch,
// a queue bounded at 32 samples and a 1 s default deadline (the latency bound). Nominally the
// queue holds about 0.1 s of work; the bound leaves room for a loaded 2-core machine.
std::string MakeOverloadRepository() {
  std::string dir = testing::TempDir() + "/overload-repo-" + std::to_string(getpid());
  std::string model = dir + "/busy";
  std::system(("mkdir -p " + model).c_str());
  std::ofstream(model + "/model.pt", std::ios::binary)
      << ReadFile(std::string(SLUICE_TEST_MODELS) + "/busy/model.pt");
  std::ofstream(model + "/config.yaml")
      << "max_batch_size: 1\n"
         "dynamic_batching: {max_queue_delay_us: 0, max_queue_size: 32,"
         " default_timeout_us: 1000000}\n"
         "instances: {count: 1, threads: 1}\n"
         "inputs: [{name: input, datatype: FP32, shape: [16]}]\n"
         "outputs: [{name: output, datatype: FP32, shape: [16]}]\n";
  return dir;
}

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM"); 0 when unreadable.
int64_t ProcStatusKib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return 0;
}

// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before reuse, so a
// server's RSS grows with the bytes it has allocated, not the bytes it holds, until the quarantine
// is full: how far it had filled before the overload decided the memory check. The server started
// here gets a small quarantine, so its RSS measures what it keeps.
class SmallAsanQuarantine {
 public:
#if defined(__SANITIZE_ADDRESS__)
  SmallAsanQuarantine() {
    if (const char* options = std::getenv("ASAN_OPTIONS")) saved_ = options;
    setenv("ASAN_OPTIONS", (saved_.value_or("") + ":quarantine_size_mb=4").c_str(), 1);
  }
  ~SmallAsanQuarantine() {
    if (saved_) {
      setenv("ASAN_OPTIONS", saved_->c_str(), 1);
    } else {
      unsetenv("ASAN_OPTIONS");
    }
  }
#else
  SmallAsanQuarantine() = default;
#endif
  SmallAsanQuarantine(const SmallAsanQuarantine&) = delete;
  SmallAsanQuarantine& operator=(const SmallAsanQuarantine&) = delete;

#if defined(__SANITIZE_ADDRESS__)
 private:
  std::optional<std::string> saved_;
#endif
};

// A load of "busy" inferences against `port`.
sluice::HttpLoadOptions BusyLoad(int port) {
  sluice::HttpLoadOptions load;
  load.target.port = static_cast<uint16_t>(port);
  load.payload.path = "/v2/models/busy/infer";
  load.payload.body = R"({"inputs":[{"name":"input","shape":[1,16],"datatype":"FP32","data":[)"
                      "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}";
  return load;
}

// The server's capacity in requests/s: closed loop, enough clients to keep the instance busy.
double MeasureBusyCapacity(int port) {
  sluice::HttpLoadOptions load = BusyLoad(port);
  load.concurrency = 4;
  load.duration = sluice::Seconds(3);
  load.warmup = sluice::Seconds(1);
  auto measured = sluice::RunHttpLoad(load);
  EXPECT_TRUE(measured.ok()) << measured.status().message();
  if (!measured.ok()) return 0;
  EXPECT_EQ(measured->summary.ok_requests, measured->summary.requests);
  return measured->summary.requests_per_second;
}

// Open loop: 256 connections to start with; an arrival that finds them all busy opens another,
// so no request waits on the client's side for a connection. Refusals on one connection are
// spaced (at most one per 250 ms), so a fixed pool fills at four times a fast CPU's capacity and
// the requests then wait in this client's own queue (as they did on a Zen 5 CPU, capacity ~500
// req/s: p99 of accepted 5-20 s, all of it before the send).
void OpenLoop(sluice::HttpLoadOptions& load, double rate, sluice::Seconds duration) {
  load.rate = rate;
  load.concurrency = 256;
  load.max_connections = 4096;
  load.duration = duration;
  load.warmup = sluice::Seconds(0);
}

// Seconds from when an accepted request was due to when this client wrote it (the client's own
// wait), and from then to its answer (the server's and the loopback's).
struct LatencyParts {
  std::vector<double> total, before_send, after_send;
  void Add(const sluice::RequestRecord& record) {
    total.push_back(record.latency_seconds());
    before_send.push_back(sluice::SecondsBetween(record.request_time, record.start_time));
    after_send.push_back(sluice::SecondsBetween(record.start_time, record.response_time));
  }
};

TEST(ServerOverloadTest, FourTimesCapacityForThirtySecondsAnswersEveryRequest) {
  std::optional<SmallAsanQuarantine> quarantine(std::in_place);
  ServerProcess server({"--model", "busy"}, MakeOverloadRepository());
  quarantine.reset();  // The server has its environment.
  ASSERT_GT(server.port(), 0) << server.output();
  const double capacity = MeasureBusyCapacity(server.port());
  ASSERT_GT(capacity, 10);

  // 4x that, open loop (Poisson arrivals), for 30 s, while the server's memory is sampled.
  const int64_t rss_before_kib = ProcStatusKib(server.pid(), "VmRSS");
  std::atomic<bool> loading{true};
  std::atomic<int64_t> peak_rss_kib{rss_before_kib};
  std::thread sampler([&] {
    while (loading.load()) {
      int64_t rss = ProcStatusKib(server.pid(), "VmRSS");
      if (rss > peak_rss_kib.load()) peak_rss_kib.store(rss);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  sluice::HttpLoadOptions load = BusyLoad(server.port());
  OpenLoop(load, 4 * capacity, sluice::Seconds(30));
  auto overload = sluice::RunHttpLoad(load);
  loading = false;
  sampler.join();
  ASSERT_TRUE(overload.ok()) << overload.status().message();

  // Every request sent was answered, with 200 or 503 + Retry-After.
  const auto& run = *overload;
  // A write the kernel refuses never reaches the server; allow one in 10,000 of those, and show
  // them.
  const std::string transport_errors =
      fmt::format("{}", fmt::join(run.first_transport_errors, "; "));
  EXPECT_LE(run.transport_errors, run.sent / 10000) << transport_errors;
  EXPECT_EQ(run.unsent, 0);
  EXPECT_EQ(run.sent, run.answered);
  EXPECT_EQ(static_cast<int64_t>(run.records.size()), run.sent + run.transport_errors);
  EXPECT_EQ(run.unavailable_without_retry_after, 0);
  int64_t ok = 0, rejected = 0, other = 0;
  LatencyParts accepted;
  for (const auto& record : run.records) {
    if (record.outcome == sluice::StatusCode::kOk) {
      ++ok;
      accepted.Add(record);
    } else if (record.outcome == sluice::StatusCode::kUnavailable) {
      ++rejected;
    } else {
      ++other;
    }
  }
  EXPECT_EQ(other, 0);
  // The overload was real: over a quarter refused. The capacity is measured closed loop on 4
  // connections (small batches); the open loop's 256 fill larger ones, and with another test
  // beside it (ctest -j 2) the measured figure falls further: on a Zen 4, 176 req/s measured,
  // 430 req/s served under the overload, 39% refused. A quarter allows the served rate up to 3x
  // the measured one.
  EXPECT_GT(rejected, run.sent / 4);
  // ...and the server kept serving at close to its capacity meanwhile.
  EXPECT_GT(static_cast<double>(ok), 0.5 * capacity * 30);
  // Accepted requests stay under the configured 1 s deadline (none ran late: no 504s).
  const sluice::LatencyStats latency = sluice::ComputeLatencyStats(accepted.total);
  const sluice::LatencyStats client_wait = sluice::ComputeLatencyStats(accepted.before_send);
  const sluice::LatencyStats after_send = sluice::ComputeLatencyStats(accepted.after_send);
  EXPECT_LT(latency.p99, 1.0) << "p99 " << client_wait.p99 * 1e3 << " ms before the send, "
                              << after_send.p99 * 1e3 << " ms after it; " << run.connections
                              << " connections";
  // Memory: queues are bounded, so 30 s of overload leaves no trace.
  const int64_t peak_kib = peak_rss_kib.load();
  EXPECT_LT(peak_kib - rss_before_kib, 64 * 1024);
  std::printf(
      "overload: capacity %.0f req/s, offered %.0f req/s for 30 s; sent %lld, answered %lld "
      "(200: %lld, 503: %lld, lost: %lld); p99 of accepted %.1f ms; server RSS %lld MiB before, "
      "peak %lld MiB, high-water mark %lld MiB; transport errors %lld %s; %d connections, p99 "
      "of accepted before the send %.1f ms, after it %.1f ms\n",
      capacity, load.rate, static_cast<long long>(run.sent), static_cast<long long>(run.answered),
      static_cast<long long>(ok), static_cast<long long>(rejected),
      static_cast<long long>(run.sent - run.answered), latency.p99 * 1e3,
      static_cast<long long>(rss_before_kib / 1024), static_cast<long long>(peak_kib / 1024),
      static_cast<long long>(ProcStatusKib(server.pid(), "VmHWM") / 1024),
      static_cast<long long>(run.transport_errors), transport_errors.c_str(), run.connections,
      client_wait.p99 * 1e3, after_send.p99 * 1e3);
  EXPECT_EQ(server.Stop(), 0);
}

// The niceness of the server and its noisy neighbours in the CPU test: equals, both below this
// test's load generator (niceness 0), whose timestamps are then not delayed by the neighbours.
constexpr int kNeighbourNice = 5;

// Lowers every thread of process `pid` to `nice` (threads it starts later inherit it). Raising a
// niceness needs no privilege.
void Renice(pid_t pid, int nice) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir(tasks.c_str()), closedir);
  if (!dir) return;
  while (const dirent* entry = readdir(dir.get())) {
    if (entry->d_name[0] == '.') continue;
    setpriority(PRIO_PROCESS, static_cast<id_t>(atoi(entry->d_name)), nice);
  }
}

// Busy processes, `per_core` on each core the server may run on, pinned there: the CPU taken away
// as noisy neighbours or a lowered CPU quota would take it. Killed (by PID) when destroyed.
class CpuThieves {
 public:
  CpuThieves(pid_t victim, int per_core) {
    cpu_set_t cores;
    CPU_ZERO(&cores);
    if (sched_getaffinity(victim, sizeof(cores), &cores) != 0) return;
    for (int i = 0; i < per_core * CPU_SETSIZE; ++i) {
      const int cpu = i % CPU_SETSIZE;
      if (!CPU_ISSET(cpu, &cores)) continue;
      const pid_t pid = fork();
      if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof(one), &one);
        setpriority(PRIO_PROCESS, 0, kNeighbourNice);
        std::atomic<uint64_t> spins{0};
        for (;;) spins.fetch_add(1, std::memory_order_relaxed);
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuThieves() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  CpuThieves(const CpuThieves&) = delete;
  CpuThieves& operator=(const CpuThieves&) = delete;
  size_t count() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

// The server's CPU taken away mid-run, under twice its capacity: what was accepted is still
// answered within the 1 s deadline (counted from the request's arrival, and a batch runs only if
// it is expected to end by it), before and after, and the rest is refused with 503 + Retry-After
// (or, for the few the queue's prediction let in as the cores went, 504 unrun); nothing is lost.
// Without the deadline the same run answers at p99 1.2 s before and 1.5 s after the theft.
TEST(ServerOverloadTest, CpuTakenAwayMidRunKeepsAcceptedRequestsWithinTheirDeadline) {
  // Four busy processes a core, as niced as the server: with the cores' time split among them,
  // its capacity falls to a fifth or less, and its queue of 32 holds more than the deadline.
  constexpr int kThievesPerCore = 4;
  // The model's deadline (1 s) and 50 ms to encode and write an answer.
  constexpr double kAnswered = 1.05;
  ServerProcess server({"--model", "busy"}, MakeOverloadRepository());
  ASSERT_GT(server.port(), 0) << server.output();
  Renice(server.pid(), kNeighbourNice);
  const double capacity = MeasureBusyCapacity(server.port());
  ASSERT_GT(capacity, 10);

  sluice::HttpLoadOptions load = BusyLoad(server.port());
  OpenLoop(load, 2 * capacity, sluice::Seconds(16));
  std::optional<sluice::Clock::time_point> stolen_at;
  std::atomic<bool> loading{true};
  size_t thieves = 0;
  std::thread theft([&] {
    const auto due = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (loading.load() && std::chrono::steady_clock::now() < due) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!loading.load()) return;
    CpuThieves taken(server.pid(), kThievesPerCore);
    thieves = taken.count();
    stolen_at = sluice::Clock::Real().Now();
    while (loading.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  auto result = sluice::RunHttpLoad(load);
  loading = false;
  theft.join();
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(stolen_at.has_value());
  ASSERT_GT(thieves, 0u);

  const auto& run = *result;
  EXPECT_LE(run.transport_errors, run.sent / 10000)
      << fmt::format("{}", fmt::join(run.first_transport_errors, "; "));
  EXPECT_EQ(run.unsent, 0);
  EXPECT_EQ(run.sent, run.answered);
  EXPECT_EQ(run.unavailable_without_retry_after, 0);
  // Before and after the theft (by when the request was sent), apart.
  LatencyParts accepted[2];
  int64_t ok[2] = {0, 0}, refused[2] = {0, 0}, expired[2] = {0, 0}, other = 0;
  sluice::Clock::time_point first = run.records.front().start_time, last = first;
  for (const auto& record : run.records) {
    first = std::min(first, record.start_time);
    last = std::max(last, record.start_time);
    const int after = record.start_time >= *stolen_at ? 1 : 0;
    switch (record.outcome) {
      case sluice::StatusCode::kOk:
        ++ok[after];
        accepted[after].Add(record);
        break;
      case sluice::StatusCode::kUnavailable:
        ++refused[after];
        break;
      case sluice::StatusCode::kDeadlineExceeded:
        ++expired[after];
        break;
      default:
        ++other;
    }
  }
  EXPECT_EQ(other, 0);
  const double seconds[2] = {sluice::SecondsBetween(first, *stolen_at),
                             sluice::SecondsBetween(*stolen_at, last)};
  std::string report;
  for (int after : {0, 1}) {
    const auto total = sluice::ComputeLatencyStats(accepted[after].total);
    const auto sent = sluice::ComputeLatencyStats(accepted[after].after_send);
    report += fmt::format(
        "{}: {:.1f} s, 200: {} ({:.0f}/s), 503: {}, 504: {}; accepted p99 {:.1f} ms, max {:.1f} ms "
        "(after the send: p50 {:.1f} ms, p95 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms; {} after "
        "{:.2f} s)\n",
        after ? "with the CPU taken" : "before", seconds[after], ok[after],
        ok[after] / seconds[after], refused[after], expired[after], total.p99 * 1e3,
        total.max * 1e3, sent.p50 * 1e3, sent.p95 * 1e3, sent.p99 * 1e3, sent.max * 1e3,
        std::count_if(accepted[after].after_send.begin(), accepted[after].after_send.end(),
                      [](double s) { return s >= kAnswered; }),
        kAnswered);
  }
  // The slowest accepted answers and when they were sent: a cluster sent together points at a
  // stall of the whole machine, a spread at the server's own timing.
  std::vector<std::pair<double, double>> slowest;
  for (const auto& record : run.records) {
    if (record.outcome != sluice::StatusCode::kOk) continue;
    slowest.emplace_back(sluice::SecondsBetween(record.start_time, record.response_time),
                         sluice::SecondsBetween(*stolen_at, record.start_time));
  }
  std::sort(slowest.rbegin(), slowest.rend());
  report += "slowest accepted (ms, sent at s from the theft):";
  for (size_t i = 0; i < std::min<size_t>(slowest.size(), 6); ++i) {
    report += fmt::format(" {:.1f} at {:+.3f};", slowest[i].first * 1e3, slowest[i].second);
  }
  report += "\n";
  std::printf(
      "cpu theft: capacity %.0f req/s, offered %.0f req/s, %zu busy processes after %.1f "
      "s; %d connections\n%s",
      capacity, load.rate, thieves, seconds[0], run.connections, report.c_str());
  for (int after : {0, 1}) {
    ASSERT_GT(ok[after], 0) << report;
    // Accepted requests are answered within the deadline the model gives them (1 s), counted
    // from when the client sent them: time in the server's front, its queue and its instance.
    // Admission fills the queue up to the deadline, so under the theft most answers come just
    // before it; 50 ms more are allowed for encoding and writing them on the starved cores.
    // p95, not p99: with the cores taken the server answers 9-25 requests a second, and of the
    // 90-250 answers p99 is the slowest one or two, which a single stall of the whole machine
    // (a sanitizer's, a virtual machine's) makes late however the server schedules. Without
    // the deadline, p95 with the CPU taken is 2.0-2.4 s (p50 1.0-1.1 s).
    const auto sent = sluice::ComputeLatencyStats(accepted[after].after_send);
    EXPECT_LT(sent.p95, kAnswered) << report;
    // The rest is refused at once (503), or expires unrun (504): few of those.
    EXPECT_GT(refused[after], 0) << report;
    EXPECT_LE(expired[after], (ok[after] + refused[after]) / 20) << report;
  }
  // The theft was real: the server answered fewer requests a second without its cores.
  EXPECT_LT(ok[1] / seconds[1], 0.9 * ok[0] / seconds[0]) << report;
  EXPECT_EQ(server.Stop(), 0);
}

// A metric's value in /metrics text (the first sample of that name); -1 when absent.
double MetricValue(const std::string& text, const std::string& name) {
  size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

// The attack of many connections each sending most of a large body and then waiting, scaled to
// a small machine: 24 connections x 7 MiB against a 48 MiB budget. Six bodies fit; the others are
// refused with 503 as soon as their header arrives, the server's RSS grows by no more than the
// budget, small requests are served meanwhile, a chunked body is refused at the chunk that would
// not fit, and closing the held connections gives every byte back.
TEST(ServerMemoryTest, ManyLargeBodiesAreBoundedByTheMemoryBudget) {
  constexpr size_t kMiB = 1 << 20;
  constexpr size_t kBudget = 48 * kMiB;
  constexpr size_t kBody = 7 * kMiB;
  ServerProcess server({"--memory-budget", "48MiB", "--max-body-bytes", "16MiB"});
  ASSERT_GT(server.port(), 0) << server.output();
  {
    Client warm(server.port());
    ASSERT_EQ(warm.Request("POST", "/v2/models/identity/infer", IdentityJson(1)).status, 200);
  }
  const int64_t rss_before_kib = ProcStatusKib(server.pid(), "VmRSS");

  const std::string header =
      "POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(kBody) + "\r\n\r\n";
  const std::string most_of_body(kBody - kMiB, ' ');
  std::vector<std::unique_ptr<Client>> attackers;
  for (int i = 0; i < 24; ++i) attackers.push_back(std::make_unique<Client>(server.port()));
  std::vector<std::thread> senders;
  for (auto& attacker : attackers) {
    senders.emplace_back([&, client = attacker.get()] {
      if (client->SendRaw(header)) client->SendRaw(most_of_body);
    });
  }
  for (auto& sender : senders) sender.join();

  int refused = 0, held = 0;
  std::vector<std::unique_ptr<Client>> holders;
  for (auto& attacker : attackers) {
    if (!attacker->Readable(500)) {
      ++held;
      holders.push_back(std::move(attacker));
      continue;
    }
    Response r = attacker->Read();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_TRUE(r.closed);
    EXPECT_EQ(r.headers["retry-after"], "1");
    EXPECT_NE(r.body.find("memory budget is full: this request needs 7340032 more bytes"),
              std::string::npos)
        << r.body;
    ++refused;
  }
  EXPECT_EQ(held, 6);  // 6 x 7 MiB fit in 48 MiB; a seventh would not.
  EXPECT_EQ(refused, 18);
  const int64_t rss_during_kib = ProcStatusKib(server.pid(), "VmRSS");
  EXPECT_LT((rss_during_kib - rss_before_kib) * 1024, static_cast<int64_t>(kBudget + 16 * kMiB))
      << "RSS " << rss_before_kib / 1024 << " MiB before, " << rss_during_kib / 1024 << " during";

  // Other clients are still served, and /metrics shows the budget in use.
  Client other(server.port());
  EXPECT_EQ(other.Request("POST", "/v2/models/identity/infer", IdentityJson(5)).status, 200);
  const std::string metrics = other.Request("GET", "/metrics").body;
  EXPECT_EQ(MetricValue(metrics, "sluice_memory_budget_bytes"), static_cast<double>(kBudget));
  EXPECT_EQ(MetricValue(metrics, "sluice_memory_in_use_bytes"), static_cast<double>(6 * kBody));
  EXPECT_EQ(MetricValue(metrics, "sluice_memory_budget_refusals_total"), 18.0);

  // A client that asks before sending its body is refused before it sends any of it.
  Client asking(server.port());
  ASSERT_TRUE(
      asking.SendRaw("POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Expect: 100-continue\r\nContent-Length: " +
                     std::to_string(kBody) + "\r\n\r\n"));
  EXPECT_EQ(asking.Read().status, 503);

  // A chunked body (no declared length) grows its hold chunk by chunk: 1, 2, 4 MiB fit in the
  // 6 MiB left; the fifth 1 MiB chunk needs 8 MiB and is refused before it is read.
  Client chunked(server.port());
  std::thread chunk_sender([&] {
    if (!chunked.SendRaw("POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n")) {
      return;
    }
    const std::string chunk = fmt::format("{:x}\r\n{}\r\n", kMiB, std::string(kMiB, ' '));
    for (int i = 0; i < 8; ++i) {
      if (!chunked.SendRaw(chunk)) return;
    }
  });
  chunk_sender.join();
  ASSERT_TRUE(chunked.Readable(5000));
  Response chunk_refusal = chunked.Read();
  EXPECT_EQ(chunk_refusal.status, 503);
  EXPECT_NE(chunk_refusal.body.find("this request needs 4194304 more bytes"), std::string::npos)
      << chunk_refusal.body;

  // The holders leave: every byte goes back, and a large body is read again (a 400 from the
  // model's own checks, not a 503).
  holders.clear();
  double in_use = -1;
  for (int attempt = 0; attempt < 100 && in_use != 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    in_use = MetricValue(Client(server.port()).Request("GET", "/metrics").body,
                         "sluice_memory_in_use_bytes");
  }
  EXPECT_EQ(in_use, 0);
  Client large(server.port());
  const Response read_again =
      large.Request("POST", "/v2/models/identity/infer", std::string(kBody, ' '));
  EXPECT_EQ(read_again.status, 400) << read_again.body;
  std::printf(
      "memory budget 48 MiB: server RSS %lld MiB before, %lld MiB with 6 bodies held and "
      "18 refused\n",
      static_cast<long long>(rss_before_kib / 1024), static_cast<long long>(rss_during_kib / 1024));
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerMemoryTest, ABudgetSmallerThanTheBodyLimitIsAClearError) {
  const std::string command = std::string(SLUICE_BINARY) + " serve --model-repository " +
                              SLUICE_TEST_MODELS +
                              " --port 0 --memory-budget 1MiB --max-body-bytes 2MiB 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char line[512];
  while (fgets(line, sizeof(line), pipe)) output += line;
  const int status = pclose(pipe);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("the memory budget (1048576 bytes) is smaller than the largest body "
                        "allowed (2097152 bytes)"),
            std::string::npos)
      << output;
}

// A small image finds the decode pool idle between one client's requests and decodes on the I/O
// thread that read it: the pool is never woken. A large one is handed to the pool.
TEST(ServerPredictTest, SmallImagesDecodeWithoutAHandOffWhileThePoolIsIdle) {
  ServerProcess server({}, MakeVisionRepository());
  ASSERT_GT(server.port(), 0) << server.output();
  std::vector<float> tensor;
  const std::string png = TestPng(&tensor);
  Client c(server.port());
  auto wakeups = [&c] {
    return MetricValue(c.Request("GET", "/metrics").body, "sluice_decode_pool_wakeups_total");
  };
  ASSERT_EQ(wakeups(), 0.0);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(c.Request("POST", "/predictions/vision", png).status, 200);
    ASSERT_EQ(c.Request("POST", "/predict", "{\"image\":\"" + Base64(png) + "\"}").status, 200);
  }
  EXPECT_EQ(c.Request("POST", "/predictions/vision", png.substr(0, 40)).status, 400);
  EXPECT_EQ(wakeups(), 0.0);

  // 96x96 pixels of noise: about 27 KiB that do not compress.
  std::vector<uint8_t> noise(96 * 96 * 3);
  uint32_t state = 12345;
  for (uint8_t& v : noise) v = static_cast<uint8_t>((state = state * 1103515245u + 12345u) >> 24);
  const std::string large = sluice::test_images::EncodePng(noise, 96, 96);
  ASSERT_GT(large.size(), 20000u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(c.Request("POST", "/predictions/vision", large).status, 200);
  }
  EXPECT_GE(wakeups(), 1.0);
  EXPECT_EQ(server.Stop(), 0);
}

// A request alone in its batch is answered from the model instance's thread (the answer is sent
// there, the connection's thread finishes the exchange): answers stay right and in order across
// keep-alive, pipelining, answers larger than what the socket takes at once (the rest is written
// by the connection's thread), HTTP/1.0 and Connection: close.
TEST_F(ServerTest, AnswersOfBatchesOfOneLeaveFromTheInstanceAndTheConnectionCarriesOn) {
  Client metrics(port());
  auto in_place = [&metrics] {
    return MetricValue(metrics.Request("GET", "/metrics").body,
                       "sluice_http_answers_in_place_total");
  };
  const double before = in_place();
  ASSERT_GE(before, 0.0);

  Client c(port());
  for (int i = 0; i < 20; ++i) {
    Response r = c.Request("POST", "/v2/models/identity/infer", IdentityJson(1000 * i));
    ASSERT_EQ(r.status, 200);
    ASSERT_NE(r.body.find(ExpectedIdentityData(1000 * i)), std::string::npos) << r.body;
    ASSERT_FALSE(r.closed);
  }
  EXPECT_EQ(in_place() - before, 20.0);

  // 800 pipelined requests of 64 rows (about 7 KB of JSON each way, 6 MB of answers in all) from
  // a client that reads nothing for a second through a small receive buffer: answers find the
  // socket full (more than the kernel buffers for a loopback connection), and the connection's
  // thread writes what the instance's send left.
  constexpr int kPipelined = 800;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int small = 4096;
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  auto rows_json = [](int first) {
    std::string data;
    for (int v = 0; v < 64 * 16; ++v) {
      if (v > 0) data += ',';
      data += std::to_string(first + v);
    }
    return R"({"inputs":[{"name":"input","shape":[64,16],"datatype":"FP32","data":[)" + data +
           "]}]}";
  };
  std::string requests;
  for (int k = 0; k < kPipelined; ++k) {
    const std::string body = rows_json(1024 * k);
    requests += "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  std::thread sender([fd, &requests] {
    std::string_view rest = requests;
    while (!rest.empty()) {
      const ssize_t n = send(fd, rest.data(), rest.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      rest.remove_prefix(static_cast<size_t>(n));
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::string received;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  int answers = 0;
  size_t at = 0;
  while (answers < kPipelined) {
    char chunk[65536];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    received.append(chunk, static_cast<size_t>(n));
    // Count whole answers: each head, then its Content-Length of body.
    while (true) {
      const size_t head_end = received.find("\r\n\r\n", at);
      if (head_end == std::string::npos) break;
      const size_t length_at = received.find("Content-Length: ", at);
      if (length_at > head_end) {
        ADD_FAILURE() << "an answer without Content-Length: " << received.substr(at, head_end - at);
        answers = kPipelined;
        break;
      }
      const size_t length = std::stoul(received.substr(length_at + 16));
      if (received.size() < head_end + 4 + length) break;
      const std::string body = received.substr(head_end + 4, length);
      const int first = 1024 * answers;
      EXPECT_NE(body.find(R"("shape":[64,16])"), std::string::npos);
      EXPECT_NE(body.find(fmt::format("[{},", first)), std::string::npos) << answers;
      EXPECT_NE(body.find(fmt::format(",{}]", first + 64 * 16 - 1)), std::string::npos) << answers;
      ++answers;
      at = head_end + 4 + length;
    }
  }
  sender.join();
  close(fd);
  EXPECT_EQ(answers, kPipelined);
  EXPECT_EQ(in_place() - before, 20.0 + kPipelined);

  Client once(port());
  once.set_http10(true);
  const std::string body = IdentityJson(7);
  once.SendRaw("POST /v2/models/identity/infer HTTP/1.0\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body);
  Response old = once.Read();
  EXPECT_EQ(old.status, 200);
  EXPECT_NE(old.body.find(ExpectedIdentityData(7)), std::string::npos);
  EXPECT_TRUE(once.ClosedByServer());

  Client closing(port());
  Response last = closing.Request("POST", "/v2/models/identity/infer", IdentityJson(9),
                                  "Connection: close\r\n");
  EXPECT_EQ(last.status, 200);
  EXPECT_TRUE(last.closed);
  EXPECT_TRUE(closing.ClosedByServer());
  EXPECT_EQ(in_place() - before, 22.0 + kPipelined);
  // Every answer was counted once, as sent.
  const std::string text = metrics.Request("GET", "/metrics").body;
  EXPECT_EQ(text.find("sluice_http_responses_total{code=\"499\"}"), std::string::npos);
}

}  // namespace
