// Black-box tests of the KServe v2 gRPC service: the real binary (`sluice serve --grpc-port 0`)
// with the tiny test models, spoken to by a client generated from the same proto.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "bench/grpc_load.h"
#include "grpc_predict_v2.grpc.pb.h"
#include "server_process.h"

namespace {

using inference::GRPCInferenceService;
using sluice_test::Client;
using sluice_test::ReadFile;
using sluice_test::Response;
using sluice_test::ServerProcess;
using sluice_test::WaitForStats;

std::unique_ptr<GRPCInferenceService::Stub> Connect(int port, int max_message_bytes = -1) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(max_message_bytes);
  return GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
      fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials(), args));
}

// A context whose call gives up after `seconds` (no test waits forever on a broken server).
std::unique_ptr<grpc::ClientContext> Context(double seconds = 10) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return context;
}

void AddRawInput(inference::ModelInferRequest& request, const std::string& name,
                 const std::vector<int64_t>& shape, const std::vector<float>& values) {
  auto* input = request.add_inputs();
  input->set_name(name);
  input->set_datatype("FP32");
  for (int64_t d : shape) input->add_shape(d);
  request.add_raw_input_contents()->assign(reinterpret_cast<const char*>(values.data()),
                                           values.size() * sizeof(float));
}

void AddTypedInput(inference::ModelInferRequest& request, const std::string& name,
                   const std::vector<int64_t>& shape, const std::vector<float>& values) {
  auto* input = request.add_inputs();
  input->set_name(name);
  input->set_datatype("FP32");
  for (int64_t d : shape) input->add_shape(d);
  for (float v : values) input->mutable_contents()->add_fp32_contents(v);
}

// Output `i`'s values, from raw or typed contents.
std::vector<float> OutputValues(const inference::ModelInferResponse& response, int i) {
  if (response.raw_output_contents_size() > 0) {
    const std::string& raw = response.raw_output_contents(i);
    std::vector<float> values(raw.size() / sizeof(float));
    std::memcpy(values.data(), raw.data(), raw.size());
    return values;
  }
  const auto& c = response.outputs(i).contents().fp32_contents();
  return std::vector<float>(c.begin(), c.end());
}

std::vector<float> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// The values of a REST binary-data answer's only output.
std::vector<float> RestBinaryOutput(const Response& r) {
  const size_t json = std::stoul(r.headers.at("inference-header-content-length"));
  std::vector<float> values((r.body.size() - json) / sizeof(float));
  std::memcpy(values.data(), r.body.data() + json, values.size() * sizeof(float));
  return values;
}

// A repository of the identity model under other configs: "slow" waits 3 s for company and
// queues one sample at most; "big" takes any length, one request a batch.
std::string MakeGrpcRepository() {
  const std::string dir = testing::TempDir() + "/grpc-repo-" + std::to_string(getpid());
  const std::string identity = ReadFile(std::string(SLUICE_TEST_MODELS) + "/identity/model.pt");
  for (const char* name : {"slow", "big"}) {
    std::system(("mkdir -p " + dir + "/" + name).c_str());
    std::ofstream(dir + "/" + name + "/model.pt", std::ios::binary) << identity;
  }
  std::ofstream(dir + "/slow/config.yaml")
      << "max_batch_size: 64\n"
         "dynamic_batching: {policy: fixed, max_queue_delay_us: 3000000, max_queue_size: 1}\n"
         "instances: {count: 1, threads: 1}\n"
         "inputs: [{name: input, datatype: FP32, shape: [16]}]\n"
         "outputs: [{name: output, datatype: FP32, shape: [16]}]\n";
  std::ofstream(dir + "/big/config.yaml")
      << "max_batch_size: 1\n"
         "instances: {count: 1, threads: 1}\n"
         "inputs: [{name: input, datatype: FP32, shape: [-1]}]\n"
         "outputs: [{name: output, datatype: FP32, shape: [-1]}]\n";
  return dir;
}

class GrpcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"--grpc-port", "0"}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_GT(server_->grpc_port(), 0) << server_->output();
    stub_ = Connect(server_->grpc_port());
  }

  static ServerProcess* server_;
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
};
ServerProcess* GrpcTest::server_ = nullptr;

TEST_F(GrpcTest, HealthAndMetadataRpcs) {
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub_->ServerLive(Context().get(), {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub_->ServerReady(Context().get(), {}, &ready).ok());
  EXPECT_TRUE(ready.ready());

  inference::ModelReadyRequest model_ready;
  model_ready.set_name("identity");
  inference::ModelReadyResponse model_ready_response;
  ASSERT_TRUE(stub_->ModelReady(Context().get(), model_ready, &model_ready_response).ok());
  EXPECT_TRUE(model_ready_response.ready());
  model_ready.set_version("2");
  grpc::Status no_version = stub_->ModelReady(Context().get(), model_ready, &model_ready_response);
  EXPECT_EQ(no_version.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(no_version.error_message(), "model 'identity' has no version \"2\"");

  inference::ServerMetadataResponse server;
  ASSERT_TRUE(stub_->ServerMetadata(Context().get(), {}, &server).ok());
  EXPECT_EQ(server.name(), "sluice");
  EXPECT_FALSE(server.version().empty());

  inference::ModelMetadataRequest metadata_request;
  metadata_request.set_name("multi_io");
  inference::ModelMetadataResponse metadata;
  ASSERT_TRUE(stub_->ModelMetadata(Context().get(), metadata_request, &metadata).ok());
  EXPECT_EQ(metadata.name(), "multi_io");
  EXPECT_EQ(metadata.platform(), "pytorch_libtorch");
  ASSERT_EQ(metadata.inputs_size(), 2);
  EXPECT_EQ(metadata.inputs(1).name(), "b");
  EXPECT_EQ(metadata.inputs(1).datatype(), "FP32");
  EXPECT_EQ(
      std::vector<int64_t>(metadata.inputs(1).shape().begin(), metadata.inputs(1).shape().end()),
      (std::vector<int64_t>{-1, 4}));
  ASSERT_EQ(metadata.outputs_size(), 2);
  EXPECT_EQ(metadata.outputs(1).name(), "product");

  metadata_request.set_name("nope");
  grpc::Status unknown = stub_->ModelMetadata(Context().get(), metadata_request, &metadata);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_message(), "unknown model 'nope'");
}

TEST_F(GrpcTest, RawAndTypedContentsGiveTheRestPathsNumbers) {
  // tiny_cnn: a real convolutional model, 3x16x16 in, 5 logits out, batch of 3.
  const std::vector<float> x = RandomValues(3 * 3 * 16 * 16, 11);
  inference::ModelInferRequest raw;
  raw.set_model_name("tiny_cnn");
  raw.set_id("raw-1");
  AddRawInput(raw, "input", {3, 3, 16, 16}, x);
  inference::ModelInferResponse raw_response;
  grpc::Status status = stub_->ModelInfer(Context().get(), raw, &raw_response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(raw_response.id(), "raw-1");
  EXPECT_EQ(raw_response.model_name(), "tiny_cnn");
  ASSERT_EQ(raw_response.outputs_size(), 1);
  EXPECT_EQ(raw_response.outputs(0).name(), "logits");
  EXPECT_EQ(std::vector<int64_t>(raw_response.outputs(0).shape().begin(),
                                 raw_response.outputs(0).shape().end()),
            (std::vector<int64_t>{3, 5}));
  ASSERT_EQ(raw_response.raw_output_contents_size(), 1);  // Raw in, raw out.

  inference::ModelInferRequest typed;
  typed.set_model_name("tiny_cnn");
  AddTypedInput(typed, "input", {3, 3, 16, 16}, x);
  inference::ModelInferResponse typed_response;
  status = stub_->ModelInfer(Context().get(), typed, &typed_response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(typed_response.raw_output_contents_size(), 0);  // Typed in, typed out.
  EXPECT_EQ(typed_response.outputs(0).contents().fp32_contents_size(), 15);

  // The REST binary-data path with the same bytes.
  std::string header =
      R"({"inputs":[{"name":"input","shape":[3,3,16,16],"datatype":"FP32","parameters":{"binary_data_size":)" +
      std::to_string(x.size() * sizeof(float)) + R"(}}],"parameters":{"binary_data_output":true}})";
  std::string body = header;
  body.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  Client c(server_->port());
  Response rest = c.Request("POST", "/v2/models/tiny_cnn/infer", body,
                            "Inference-Header-Content-Length: " + std::to_string(header.size()) +
                                "\r\nContent-Type: application/octet-stream\r\n");
  ASSERT_EQ(rest.status, 200) << rest.body;
  const std::vector<float> expected = RestBinaryOutput(rest);
  ASSERT_EQ(expected.size(), 15u);
  EXPECT_EQ(OutputValues(raw_response, 0), expected);
  EXPECT_EQ(OutputValues(typed_response, 0), expected);
}

TEST_F(GrpcTest, SeveralInputsAndARequestedOutput) {
  inference::ModelInferRequest request;
  request.set_model_name("multi_io");
  request.set_model_version("1");
  // Inputs in the other order than the model declares them.
  AddRawInput(request, "b", {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  AddRawInput(request, "a", {2, 4}, {10, 20, 30, 40, 50, 60, 70, 80});
  request.add_outputs()->set_name("product");
  inference::ModelInferResponse response;
  grpc::Status status = stub_->ModelInfer(Context().get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "product");
  EXPECT_EQ(OutputValues(response, 0), (std::vector<float>{10, 40, 90, 160, 250, 360, 490, 640}));
}

TEST_F(GrpcTest, ErrorsGetTheCodesOfTheRestMapping) {
  inference::ModelInferResponse response;
  inference::ModelInferRequest unknown;
  unknown.set_model_name("nope");
  AddRawInput(unknown, "input", {1, 16}, std::vector<float>(16, 1));
  grpc::Status s = stub_->ModelInfer(Context().get(), unknown, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  inference::ModelInferRequest bad_dtype;
  bad_dtype.set_model_name("identity");
  AddRawInput(bad_dtype, "input", {1, 16}, std::vector<float>(16, 1));
  bad_dtype.mutable_inputs(0)->set_datatype("INT32");
  s = stub_->ModelInfer(Context().get(), bad_dtype, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "input 'input': datatype \"INT32\" does not match the model's FP32");

  inference::ModelInferRequest short_raw;
  short_raw.set_model_name("identity");
  AddRawInput(short_raw, "input", {2, 16}, std::vector<float>(16, 1));
  s = stub_->ModelInfer(Context().get(), short_raw, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "input 'input': raw_input_contents holds 64 bytes, shape [2, 16] of FP32 needs 128");

  inference::ModelInferRequest too_many;
  too_many.set_model_name("identity");
  AddRawInput(too_many, "input", {65, 16}, std::vector<float>(65 * 16, 1));
  s = stub_->ModelInfer(Context().get(), too_many, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The faulty model raises on its marker value: INTERNAL, and the server keeps serving.
  inference::ModelInferRequest marker;
  marker.set_model_name("faulty");
  AddRawInput(marker, "input", {1, 2}, {-12345, 0.5});
  s = stub_->ModelInfer(Context(5).get(), marker, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(s.error_message().find("marker input"), std::string::npos) << s.error_message();

  inference::ModelInferRequest fine;
  fine.set_model_name("identity");
  AddRawInput(fine, "input", {1, 16}, std::vector<float>(16, 3));
  inference::ModelInferResponse ok;
  s = stub_->ModelInfer(Context().get(), fine, &ok);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(OutputValues(ok, 0), std::vector<float>(16, 3));
}

TEST_F(GrpcTest, MetricsCountCallsByMethodAndCode) {
  inference::ModelMetadataRequest request;
  request.set_name("no_such_model");
  inference::ModelMetadataResponse metadata;
  EXPECT_EQ(stub_->ModelMetadata(Context().get(), request, &metadata).error_code(),
            grpc::StatusCode::NOT_FOUND);
  Client c(server_->port());
  Response metrics = c.Request("GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(
      metrics.body.find("sluice_grpc_requests_total{method=\"ModelMetadata\",code=\"NOT_FOUND\"}"),
      std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("sluice_grpc_request_seconds_count{method=\"ModelMetadata\"}"),
            std::string::npos);
}

TEST(GrpcServiceTest, OverloadDeadlineAndCancellation) {
  ServerProcess server({"--grpc-port", "0"}, MakeGrpcRepository());
  ASSERT_GT(server.grpc_port(), 0) << server.output();
  auto stub = Connect(server.grpc_port());
  inference::ModelInferRequest request;
  request.set_model_name("slow");
  AddRawInput(request, "input", {1, 16}, std::vector<float>(16, 1));

  // A call whose deadline passes while its request waits for company: DEADLINE_EXCEEDED, and the
  // request never runs.
  inference::ModelInferResponse response;
  auto short_deadline = Context(0.3);
  EXPECT_EQ(stub->ModelInfer(short_deadline.get(), request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitForStats(server.port(), "\"queued_requests\":0,"));
  EXPECT_TRUE(WaitForStats(server.port(), "\"deadline_exceeded\":1"));

  // One request fills the queue; the next is refused at once with UNAVAILABLE and a retry-after.
  auto cancelled = Context(10);
  inference::ModelInferResponse cancelled_response;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> cancelled_status;
  stub->async()->ModelInfer(cancelled.get(), &request, &cancelled_response, [&](grpc::Status s) {
    std::lock_guard lock(mu);
    cancelled_status = s;
    cv.notify_all();
  });
  ASSERT_TRUE(WaitForStats(server.port(), "\"queued_requests\":1,"));
  auto refused_context = Context();
  grpc::Status refused = stub->ModelInfer(refused_context.get(), request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  const auto& trailers = refused_context->GetServerTrailingMetadata();
  ASSERT_EQ(trailers.count("retry-after"), 1u);
  EXPECT_GE(std::stoi(std::string(trailers.find("retry-after")->second.data(),
                                  trailers.find("retry-after")->second.size())),
            1);

  // Cancelling the queued call frees its slot long before the 3 s delay could have run it.
  cancelled->TryCancel();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(5), [&] { return cancelled_status.has_value(); }));
  }
  EXPECT_EQ(cancelled_status->error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForStats(server.port(), "\"queued_requests\":0,"));
  EXPECT_TRUE(WaitForStats(server.port(), "\"cancelled\":1"));
  Client c(server.port());
  Response stats = c.Request("GET", "/v2/models/slow/stats");
  EXPECT_NE(stats.body.find("\"ok\":0"), std::string::npos) << stats.body;
  EXPECT_EQ(server.Stop(), 0);
}

TEST(GrpcServiceTest, MessagesUpToTheLimitPassAndLargerOnesAreRefused) {
  constexpr int kLimit = 4 << 20;
  ServerProcess server({"--grpc-port", "0", "--grpc-max-message-bytes", std::to_string(kLimit)},
                       MakeGrpcRepository());
  ASSERT_GT(server.grpc_port(), 0) << server.output();
  auto stub = Connect(server.grpc_port());
  // 4 MiB less 1 KiB of floats: the message (with its few dozen bytes of framing) fits, and so
  // does the answer.
  const size_t near = (kLimit - 1024) / sizeof(float);
  std::vector<float> values = RandomValues(near, 5);
  inference::ModelInferRequest request;
  request.set_model_name("big");
  AddRawInput(request, "input", {1, static_cast<int64_t>(near)}, values);
  inference::ModelInferResponse response;
  grpc::Status status = stub->ModelInfer(Context(30).get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(OutputValues(response, 0), values);

  // One byte over the limit: refused by the transport, before any of it is decoded.
  const size_t over = kLimit / sizeof(float) + 1;
  inference::ModelInferRequest large;
  large.set_model_name("big");
  AddRawInput(large, "input", {1, static_cast<int64_t>(over)}, std::vector<float>(over, 1));
  status = stub->ModelInfer(Context(30).get(), large, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();

  // The server still serves.
  status = stub->ModelInfer(Context(30).get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  stub.reset();  // The client hangs up first, so the server's shutdown need not wait for it.
  EXPECT_EQ(server.Stop(), 0);
}

TEST(GrpcServiceTest, ApiKeyIsMetadataAndHealthNeedsNone) {
  setenv("SLUICE_API_KEY", "s3cret-key", 1);
  ServerProcess server({"--grpc-port", "0"});
  unsetenv("SLUICE_API_KEY");
  ASSERT_GT(server.grpc_port(), 0) << server.output();
  {  // Every client object goes before the server stops, so its shutdown waits for none.
    auto stub = Connect(server.grpc_port());
    inference::ServerLiveResponse live;
    EXPECT_TRUE(stub->ServerLive(Context().get(), {}, &live).ok());
    inference::ServerReadyResponse ready;
    EXPECT_TRUE(stub->ServerReady(Context().get(), {}, &ready).ok());

    inference::ModelInferRequest request;
    request.set_model_name("identity");
    AddRawInput(request, "input", {1, 16}, std::vector<float>(16, 2));
    inference::ModelInferResponse response;
    grpc::Status missing = stub->ModelInfer(Context().get(), request, &response);
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(missing.error_message(), "missing or invalid API key");
    auto wrong = Context();
    wrong->AddMetadata("x-api-key", "s3cret-kez");
    EXPECT_EQ(stub->ModelInfer(wrong.get(), request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    inference::ModelMetadataRequest metadata_request;
    metadata_request.set_name("identity");
    inference::ModelMetadataResponse metadata;
    EXPECT_EQ(stub->ModelMetadata(Context().get(), metadata_request, &metadata).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);

    auto key = Context();
    key->AddMetadata("x-api-key", "s3cret-key");
    EXPECT_TRUE(stub->ModelInfer(key.get(), request, &response).ok());
    auto bearer = Context();
    bearer->AddMetadata("authorization", "Bearer s3cret-key");
    grpc::Status ok = stub->ModelInfer(bearer.get(), request, &response);
    ASSERT_TRUE(ok.ok()) << ok.error_message();
    EXPECT_EQ(OutputValues(response, 0), std::vector<float>(16, 2));
  }
  EXPECT_EQ(server.Stop(), 0);
}

// KServe's model control messages (model_name alone, this proto's): the loads and unloads the
// REST routes run; tritonclient's messages are checked in llm_repository_test.py.
TEST(GrpcServiceTest, ModelControlWithKServesMessages) {
  ServerProcess server({"--grpc-port", "0", "--model-control"});
  ASSERT_GT(server.grpc_port(), 0) << server.output();
  {
    auto stub = Connect(server.grpc_port());
    auto ready = [&] {
      inference::ModelReadyRequest request;
      request.set_name("identity");
      inference::ModelReadyResponse response;
      return stub->ModelReady(Context().get(), request, &response).ok() && response.ready();
    };
    ASSERT_TRUE(ready());
    inference::RepositoryModelUnloadRequest unload;
    unload.set_model_name("identity");
    inference::RepositoryModelUnloadResponse unloaded;
    grpc::Status status = stub->RepositoryModelUnload(Context().get(), unload, &unloaded);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(ready());
    EXPECT_EQ(stub->RepositoryModelUnload(Context().get(), unload, &unloaded).error_code(),
              grpc::StatusCode::NOT_FOUND);
    inference::RepositoryModelLoadRequest load;
    load.set_model_name("identity");
    inference::RepositoryModelLoadResponse loaded;
    status = stub->RepositoryModelLoad(Context().get(), load, &loaded);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(ready());
    load.set_model_name("no_such_model");
    EXPECT_EQ(stub->RepositoryModelLoad(Context().get(), load, &loaded).error_code(),
              grpc::StatusCode::NOT_FOUND);
    load.set_model_name("../identity");
    EXPECT_EQ(stub->RepositoryModelLoad(Context().get(), load, &loaded).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(server.Stop(), 0);
}

TEST(GrpcServiceTest, SigtermFinishesCallsInFlight) {
  ServerProcess server({"--grpc-port", "0"}, MakeGrpcRepository());
  ASSERT_GT(server.grpc_port(), 0) << server.output();
  auto stub = Connect(server.grpc_port());
  inference::ModelInferRequest request;
  request.set_model_name("slow");
  AddRawInput(request, "input", {1, 16}, std::vector<float>(16, 4));
  inference::ModelInferResponse response;
  auto context = Context(20);
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> result;
  stub->async()->ModelInfer(context.get(), &request, &response, [&](grpc::Status s) {
    std::lock_guard lock(mu);
    result = s;
    cv.notify_all();
  });
  ASSERT_TRUE(WaitForStats(server.port(), "\"queued_requests\":1,"));
  // The server answers the call before it exits.
  EXPECT_EQ(server.Stop(), 0);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return result.has_value(); }));
  ASSERT_TRUE(result->ok()) << result->error_message();
  EXPECT_EQ(OutputValues(response, 0), std::vector<float>(16, 4));
}

}  // namespace

namespace {

TEST_F(GrpcTest, BenchDrivesTheGrpcServiceWithBothLoopsAndBothClients) {
  for (const char* client : {"h2", "grpc++"}) {
    SCOPED_TRACE(client);
    const std::string results =
        testing::TempDir() + "/grpc-bench-" + std::to_string(getpid()) + "-" + client;
    const std::string command = fmt::format(
        "{} bench --grpc --grpc-client {} --url grpc://127.0.0.1:{} --metrics-url "
        "http://127.0.0.1:{} --model identity --binary --concurrency 1,4 --rate 100 --duration 1 "
        "--warmup 0.2 --results-dir {} 2>&1",
        SLUICE_BINARY, client, server_->grpc_port(), server_->port(), results);
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
    ASSERT_EQ(pclose(pipe), 0) << output;
    EXPECT_NE(output.find("gRPC benchmark of identity"), std::string::npos) << output;
    EXPECT_NE(output.find(fmt::format("client {}", client)), std::string::npos) << output;
    // One table row per level: closed loops at 1 and 4 calls in flight, the open loop at 100/s;
    // none with errors.
    std::istringstream lines(output);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string conns, rate;
      double rps = 0, samples = 0, p50 = 0, p90 = 0, p99 = 0, mean = 0, batch = 0;
      int errors = -1;
      if (!(fields >> conns >> rate >> rps >> samples >> p50 >> p90 >> p99 >> mean >> errors >>
            batch)) {
        continue;
      }
      ++rows;
      EXPECT_GT(rps, 0) << line;
      EXPECT_EQ(errors, 0) << line;
      EXPECT_GE(batch, 1) << line;  // The server's /metrics saw the calls.
      if (rate == "closed") {
        EXPECT_GT(rps, 50) << line;
      } else {
        EXPECT_NEAR(rps, 100, 40) << line;
      }
    }
    EXPECT_EQ(rows, 3) << output;
    EXPECT_NE(output.find("Results: " + results), std::string::npos) << output;
  }
}

sluice::GrpcLoadOptions BenchLoad(int port, const char* model, sluice::GrpcClient client) {
  sluice::GrpcLoadOptions load;
  load.target = fmt::format("127.0.0.1:{}", port);
  load.model = model;
  load.client = client;
  load.concurrency = 4;
  load.warmup = sluice::Seconds(0);
  return load;
}

int64_t CountOutcomes(const sluice::HttpLoadRun& run, sluice::StatusCode code) {
  return std::count_if(run.records.begin(), run.records.end(),
                       [code](const auto& r) { return r.outcome == code; });
}

TEST(GrpcServiceTest, BenchClientsCountRefusalsAndLostConnections) {
  for (const auto client : {sluice::GrpcClient::kH2, sluice::GrpcClient::kGrpcCpp}) {
    SCOPED_TRACE(client == sluice::GrpcClient::kH2 ? "h2" : "grpc++");
    {
      // "slow" queues one call (for 3 s) and refuses the rest with UNAVAILABLE + retry-after:
      // every call is answered, the refusals counted as such, none as lost.
      ServerProcess server({"--grpc-port", "0"}, MakeGrpcRepository());
      ASSERT_GT(server.grpc_port(), 0) << server.output();
      auto load = BenchLoad(server.grpc_port(), "slow", client);
      load.duration = sluice::Seconds(0.5);
      auto run = sluice::RunGrpcLoad(load);
      ASSERT_TRUE(run.ok()) << run.status().message();
      EXPECT_EQ(run->transport_errors, 0)
          << fmt::format("{}", fmt::join(run->first_transport_errors, "; "));
      EXPECT_EQ(run->sent, run->answered);
      EXPECT_EQ(run->unavailable_without_retry_after, 0);
      EXPECT_EQ(static_cast<int64_t>(run->records.size()), run->sent);
      EXPECT_EQ(CountOutcomes(*run, sluice::StatusCode::kOk), 1);
      EXPECT_EQ(CountOutcomes(*run, sluice::StatusCode::kUnavailable), run->sent - 1);
      EXPECT_EQ(server.Stop(), 0);
    }
    {
      // The server dies mid-run: the calls it held are lost, counted as transport errors, and the
      // run still ends on time.
      ServerProcess server({"--grpc-port", "0"});
      ASSERT_GT(server.grpc_port(), 0) << server.output();
      auto load = BenchLoad(server.grpc_port(), "identity", client);
      load.duration = sluice::Seconds(1.5);
      std::thread killer([pid = server.pid()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        kill(pid, SIGKILL);
      });
      const auto start = std::chrono::steady_clock::now();
      auto run = sluice::RunGrpcLoad(load);
      killer.join();
      ASSERT_TRUE(run.ok()) << run.status().message();
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
      EXPECT_GT(run->transport_errors, 0);
      EXPECT_GT(CountOutcomes(*run, sluice::StatusCode::kOk), 0);
      EXPECT_GT(CountOutcomes(*run, sluice::StatusCode::kUnavailable), 0);
      EXPECT_LT(run->answered, run->sent);
      server.Stop();
    }
  }
}

}  // namespace
