// The model repository's waits for a language model's load, with a loader that blocks until the
// test lets it go: a waiting request resumes once the load has run, or once load_wait has passed
// while it still runs; one asked after the load ran resumes at once; Stop() resumes the rest.
#include "service/model_repository.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "engine/fake_backends.h"

namespace sluice {
namespace {

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("model_repository_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "m");
    std::ofstream(dir_ / "m" / "config.json") << "{}";
    std::ofstream(dir_ / "m" / "model.safetensors") << "";
  }
  void TearDown() override {
    Release();
    if (repository_) repository_->Stop();
    control_pool_.reset();  // Its load runs to its end while the repository is still there.
    repository_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A repository whose language-model loads block until Release(), then fail.
  void Make(std::chrono::milliseconds load_wait) {
    auto blocking = [this](const std::string&) -> Result<std::shared_ptr<llm::LlmEngine>> {
      ++loads_;
      std::unique_lock lock(mu_);
      released_cv_.wait(lock, [this] { return released_; });
      return Status::InvalidArgument("no weights in this test");
    };
    repository_ =
        std::make_unique<ModelRepository>(engine_, v2_, *control_pool_,
                                          RepositoryOptions{.models = {.repository = dir_},
                                                            .llm_loader = blocking,
                                                            .autoload = true,
                                                            .load_wait = load_wait});
    repository_->Start();
  }
  llm::GenerationService& service() { return repository_->generation_service(); }
  void Release() {
    {
      std::lock_guard lock(mu_);
      released_ = true;
    }
    released_cv_.notify_all();
  }
  // Waits up to `seconds` for `resumed` to reach `count`.
  bool ResumedWithin(const std::atomic<int>& resumed, int count, double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (resumed.load() < count) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  std::filesystem::path dir_;
  Engine engine_{[](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    return Status::Internal("no tensor models in this test");
  }};
  V2Service v2_{engine_};
  std::unique_ptr<ThreadPool> control_pool_ = std::make_unique<ThreadPool>(1, 16);
  std::unique_ptr<ModelRepository> repository_;
  std::atomic<int> loads_{0};
  std::mutex mu_;
  std::condition_variable released_cv_;
  bool released_ = false;
};

TEST_F(ModelRepositoryTest, AWaitEndsWhenTheLoadHasRun) {
  Make(std::chrono::seconds(60));
  std::string model = "m";
  auto found = service().Find(model);  // Starts the load.
  ASSERT_EQ(found.status().code(), StatusCode::kUnavailable) << found.status().message();
  std::atomic<int> resumed{0};
  ASSERT_TRUE(service().WhenLoaded("m", [&] { ++resumed; }));
  ASSERT_TRUE(service().WhenLoaded("m", [&] { ++resumed; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(resumed.load(), 0) << "resumed while the load still ran";
  Release();
  EXPECT_TRUE(ResumedWithin(resumed, 2, 10));
  // The load failed: Find now says why, and a request asking to wait resumes at once.
  found = service().Find(model);
  EXPECT_NE(found.status().message().find("failed to load"), std::string::npos)
      << found.status().message();
  std::atomic<int> again{0};
  EXPECT_TRUE(service().WhenLoaded("m", [&] { ++again; }));
  EXPECT_EQ(again.load(), 1);
  EXPECT_EQ(loads_.load(), 1);
}

TEST_F(ModelRepositoryTest, AWaitEndsWhenItsTimeHasPassedAndStopEndsTheRest) {
  Make(std::chrono::milliseconds(200));
  std::string model = "m";
  ASSERT_EQ(service().Find(model).status().code(), StatusCode::kUnavailable);
  std::atomic<int> resumed{0};
  const auto asked = std::chrono::steady_clock::now();
  ASSERT_TRUE(service().WhenLoaded("m", [&] { ++resumed; }));
  // The watcher looks once a second: the wait ends within about a second of load_wait.
  EXPECT_TRUE(ResumedWithin(resumed, 1, 5));
  EXPECT_GE(std::chrono::steady_clock::now() - asked, std::chrono::milliseconds(200));
  // Still loading: the request is answered that it is.
  EXPECT_NE(service().Find(model).status().message().find("is loading"), std::string::npos);
  // One waiting when the repository stops is resumed by Stop().
  std::atomic<int> stopped{0};
  ASSERT_TRUE(service().WhenLoaded("m", [&] { ++stopped; }));
  Release();  // Let the load end, so Stop() does not wait on it.
  repository_->Stop();
  EXPECT_TRUE(ResumedWithin(stopped, 1, 10));
}

// A tensor model whose device fails for good is reloaded: a load that works serves it again, one
// that fails (a GPU left unusable) leaves it UNAVAILABLE with the reason, the server not ready.
TEST(ModelRepositoryDeviceTest, AModelWhoseDeviceFailedIsReloaded) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("model_repository_device_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "t");
  std::ofstream(dir / "t" / "config.yaml")
      << "max_batch_size: 4\ninstances: {count: 1, device: cpu, threads: 1}\n"
         "inputs: [{name: x, datatype: FP32, shape: [2]}]\n"
         "outputs: [{name: x, datatype: FP32, shape: [2]}]\n";
  std::atomic<int> loads{0};
  Engine engine([&](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    if (++loads == 3) {
      return Status::Unavailable(
          "GPU 0 failed for the rest of this process: unspecified launch "
          "failure");
    }
    return std::shared_ptr<Backend>(std::make_shared<testing::EchoBackend>());
  });
  V2Service v2(engine);
  ThreadPool control_pool(1, 16);
  ModelRepository repository(engine, v2, control_pool,
                             RepositoryOptions{.models = {.repository = dir}});
  ASSERT_TRUE(repository.LoadModel("t").ok());
  // Loses the device; returns the state the index shows once the reload it starts has run.
  auto lose_device = [&](int loads_after) {
    auto request = std::make_unique<InferRequest>();
    request->inputs.push_back(Tensor::Zeros(DataType::kFp32, {1, 2}));
    request->inputs[0].mutable_values<float>()[1] = testing::kDeviceLossMarker;
    std::promise<StatusCode> done;
    request->done = [&](InferResponse&& r) { done.set_value(r.status.code()); };
    EXPECT_TRUE(engine.Submit("t", std::move(request)).ok());
    EXPECT_EQ(done.get_future().get(), StatusCode::kUnavailable);
    for (int i = 0; i < 1000; ++i) {
      auto index = repository.IndexEntries(false);
      if (loads.load() == loads_after && index.size() == 1 && index[0].state != "LOADING") {
        return index[0];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return ModelRepository::IndexEntry{"t", "1", "timed out", ""};
  };
  ModelRepository::IndexEntry reloaded = lose_device(2);
  EXPECT_EQ(reloaded.state, "READY");
  EXPECT_TRUE(v2.IsReady());
  auto request = std::make_unique<InferRequest>();
  request->inputs.push_back(Tensor::Zeros(DataType::kFp32, {1, 2}));
  std::promise<StatusCode> served;
  request->done = [&](InferResponse&& r) { served.set_value(r.status.code()); };
  ASSERT_TRUE(engine.Submit("t", std::move(request)).ok());
  EXPECT_EQ(served.get_future().get(), StatusCode::kOk);

  ModelRepository::IndexEntry failed = lose_device(3);
  EXPECT_EQ(failed.state, "UNAVAILABLE");
  EXPECT_NE(failed.reason.find("unspecified launch failure"), std::string::npos) << failed.reason;
  EXPECT_FALSE(v2.IsReady());
  EXPECT_EQ(v2.FindModel("t", "").status().code(), StatusCode::kUnavailable);
  repository.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice
