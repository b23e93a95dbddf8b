// The v2 service both fronts call: model lookup and its errors, readiness, and a submitted
// request's one answer with its parsed request beside it.
#include "service/v2_service.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>

#include "engine/fake_backends.h"

namespace sluice {
namespace {

ModelConfig EchoConfig(const std::string& name) {
  ModelConfig config;
  config.name = name;
  config.max_batch_size = 4;
  config.instances.count = 1;
  config.instances.threads = 1;
  config.inputs = {{"x", DataType::kFp32, {2}}};
  config.outputs = {{"x", DataType::kFp32, {2}}};
  return config;
}

class V2ServiceTest : public ::testing::Test {
 protected:
  V2ServiceTest()
      : engine_([this](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
          return std::shared_ptr<Backend>(std::make_shared<testing::EchoBackend>(&log_));
        }),
        service_(engine_) {
    EXPECT_TRUE(engine_.AddModel(EchoConfig("echo")).ok());
  }

  testing::EchoLog log_;
  Engine engine_;
  V2Service service_;
};

TEST_F(V2ServiceTest, FindsALoadedModelAtNoVersionOrVersionOne) {
  for (std::string_view version : {"", "1"}) {
    auto found = service_.FindModel("echo", version);
    ASSERT_TRUE(found.ok()) << found.status().message();
    EXPECT_EQ((*found)->config().name, "echo");
  }
}

TEST_F(V2ServiceTest, LookupErrorsNameTheirCause) {
  auto invalid = service_.FindModel("../etc", "");
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.status().message().find("invalid model name"), std::string::npos);

  auto version = service_.FindModel("echo", "2");
  EXPECT_EQ(version.status().code(), StatusCode::kNotFound);
  EXPECT_NE(version.status().message().find("has no version \"2\""), std::string::npos);

  auto unknown = service_.FindModel("missing", "");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("unknown model 'missing'"), std::string::npos);
}

TEST_F(V2ServiceTest, AModelThatFailedToLoadIsUnavailableAndTheServerNotReady) {
  EXPECT_TRUE(service_.IsReady());
  service_.SetLoadError("broken", "model.pt: no such file");
  EXPECT_FALSE(service_.IsReady());
  EXPECT_EQ(service_.LoadError("broken"), "model.pt: no such file");
  auto broken = service_.FindModel("broken", "");
  EXPECT_EQ(broken.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(broken.status().message().find("failed to load: model.pt: no such file"),
            std::string::npos);
  service_.ClearLoadError("broken");
  EXPECT_TRUE(service_.IsReady());
  EXPECT_EQ(service_.FindModel("broken", "").status().code(), StatusCode::kNotFound);
  service_.SetShuttingDown();
  EXPECT_FALSE(service_.IsReady());
}

// Without a repository to reload it, a model whose device failed stays failed: not ready, and
// found only to be refused with the failure.
TEST_F(V2ServiceTest, AModelWhoseDeviceFailedIsNotReadyAndSaysWhy) {
  testing::EchoLog log;
  Engine engine([&](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    return std::shared_ptr<Backend>(std::make_shared<testing::EchoBackend>(&log));
  });
  V2Service service(engine);
  ASSERT_TRUE(engine.AddModel(EchoConfig("gpu")).ok());
  ASSERT_TRUE(service.IsReady());
  auto request = std::make_unique<InferRequest>();
  request->inputs.push_back(Tensor::Zeros(DataType::kFp32, {1, 2}));
  request->inputs[0].mutable_values<float>()[0] = testing::kDeviceLossMarker;
  std::promise<StatusCode> done;
  request->done = [&](InferResponse&& r) { done.set_value(r.status.code()); };
  ASSERT_TRUE(engine.Submit("gpu", std::move(request)).ok());
  EXPECT_EQ(done.get_future().get(), StatusCode::kUnavailable);
  EXPECT_FALSE(service.IsReady());
  auto found = service.FindModel("gpu", "");
  EXPECT_EQ(found.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(found.status().message().find("model 'gpu' is not ready: GPU 0 failed"),
            std::string::npos)
      << found.status().message();
}

TEST_F(V2ServiceTest, ASubmittedRequestIsAnsweredOnceWithItsParsedRequest) {
  auto scheduler = service_.FindModel("echo", "");
  ASSERT_TRUE(scheduler.ok());
  auto parsed = ParseV2InferRequest(
      R"({"id":"r1","inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.5,2.5]}]})", {},
      (*scheduler)->config());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  std::promise<std::pair<std::string, std::vector<float>>> answered;
  int calls = 0;
  auto id = V2Service::Submit(
      *scheduler, std::move(*parsed), {},
      [&](std::shared_ptr<const V2InferRequest> meta, InferResponse&& response) {
        ++calls;
        ASSERT_TRUE(response.status.ok()) << response.status.message();
        ASSERT_EQ(response.outputs.size(), 1u);
        auto values = response.outputs[0].values<float>();
        answered.set_value({meta->id, std::vector<float>(values.begin(), values.end())});
      });
  ASSERT_TRUE(id.ok()) << id.status().message();
  auto [request_id, values] = answered.get_future().get();
  EXPECT_EQ(request_id, "r1");
  EXPECT_EQ(values, (std::vector<float>{1.5f, 2.5f}));
  engine_.Stop();
  EXPECT_EQ(calls, 1);
}

TEST_F(V2ServiceTest, ARequestPastItsDeadlineIsNeverRun) {
  auto scheduler = service_.FindModel("echo", "");
  ASSERT_TRUE(scheduler.ok());
  log_.CloseGate();
  // One request holds the only instance at the gate; the next waits in the queue past its
  // deadline.
  auto first = ParseV2InferRequest(
      R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[0,0]}]})", {},
      (*scheduler)->config());
  ASSERT_TRUE(first.ok());
  std::promise<StatusCode> first_done, second_done;
  ASSERT_TRUE(V2Service::Submit(*scheduler, std::move(*first), {}, [&](auto, InferResponse&& r) {
                first_done.set_value(r.status.code());
              }).ok());
  log_.WaitForBatchesStarted(1);
  auto second = ParseV2InferRequest(
      R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,1]}]})", {},
      (*scheduler)->config());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(
      V2Service::Submit(*scheduler, std::move(*second),
                        {.deadline = Clock::Real().Now() + std::chrono::milliseconds(20)},
                        [&](auto, InferResponse&& r) { second_done.set_value(r.status.code()); })
          .ok());
  EXPECT_EQ(second_done.get_future().get(), StatusCode::kDeadlineExceeded);
  log_.OpenGate();
  EXPECT_EQ(first_done.get_future().get(), StatusCode::kOk);
  EXPECT_EQ(log_.batch_sizes().size(), 1u);
}

}  // namespace
}  // namespace sluice
