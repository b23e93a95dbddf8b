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
#include <mutex>

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
    repository_ = std::make_unique<ModelRepository>(
        engine_, v2_, *control_pool_,
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

}  // namespace
}  // namespace sluice
