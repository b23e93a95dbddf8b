// The TorchScript backend against reference outputs written by Python (tools/export_models.py).
//
// Reference files are raw little-endian tensors indexed by reference.yaml; the backend must
// reproduce them within 1e-4 (max abs error) in fp32.
#include "backends/torchscript/torchscript_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/reference_test_util.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kTestModels = SLUICE_TEST_MODELS;
const std::filesystem::path kDefaultModels = std::filesystem::path(SLUICE_SOURCE_DIR) / "models";

using testing::MaxAbsError;
using testing::ReadReference;
using testing::Reference;

// The TorchScript model (model.pt), whatever else the directory holds.
ModelConfig Config(const std::filesystem::path& dir, ModelConfigOverrides o = {}) {
  o.backend = BackendKind::kTorchScript;
  auto c = LoadModelConfig(dir, o, 4);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

// Loads `config`, runs the reference inputs and returns the worst output error.
double ReferenceError(const ModelConfig& config) {
  auto backend = LoadTorchScriptBackend(config);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  if (!backend.ok()) return INFINITY;
  auto instance = (*backend)->CreateInstance(0);
  EXPECT_TRUE(instance.ok());
  EXPECT_TRUE((*instance)->AttachToCurrentThread().ok());
  Reference ref = ReadReference(config.directory);
  auto out = (*instance)->Run(ref.inputs);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return INFINITY;
  EXPECT_EQ(out->size(), ref.outputs.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(out->size(), ref.outputs.size()); ++i) {
    worst = std::max(worst, MaxAbsError((*out)[i], ref.outputs[i]));
  }
  return worst;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, Fp32ReproducesPythonWithin1e4) {
  EXPECT_LE(ReferenceError(Config(kTestModels / GetParam())), 1e-4);
}

TEST_P(ReferenceTest, FrozenAndOptimisedReproducesPythonWithin1e4) {
  ModelConfigOverrides o;
  o.freeze = true;
  o.channels_last = true;
  EXPECT_LE(ReferenceError(Config(kTestModels / GetParam(), o)), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(TestModels, ReferenceTest,
                         ::testing::Values("tiny_cnn", "multi_io", "identity"));

TEST(TorchScriptBackendTest, Bf16StaysCloseToFp32) {
  ModelConfigOverrides o;
  o.precision = Precision::kBf16;
  double error = ReferenceError(Config(kTestModels / "tiny_cnn", o));
  EXPECT_GT(error, 0);     // bf16 really ran (8-bit mantissa cannot match exactly).
  EXPECT_LT(error, 0.05);  // ... and still computes the same function.
}

TEST(TorchScriptBackendTest, DefaultModelsReproducePythonWhenExported) {
  for (const char* name : {"resnet18", "fashion_mnist"}) {
    std::filesystem::path dir = kDefaultModels / name;
    if (!std::filesystem::exists(dir / "model.pt")) {
      GTEST_SKIP() << "default models not exported (make models): " << dir;
    }
    ModelConfigOverrides o;
    o.precision = Precision::kFp32;
    o.freeze = false;
    o.channels_last = false;
    o.warmup_batch_sizes = std::vector<int>{1};
    EXPECT_LE(ReferenceError(Config(dir, o)), 1e-4) << name;
  }
}

TEST(TorchScriptBackendTest, ReportsLoadTimesAndRuntime) {
  auto backend = LoadTorchScriptBackend(Config(kTestModels / "tiny_cnn"));
  ASSERT_TRUE(backend.ok());
  const LoadReport& r = (*backend)->load_report();
  EXPECT_GT(r.load_seconds, 0);
  EXPECT_GT(r.warmup_seconds, 0);
  EXPECT_THAT(r.runtime, HasSubstr("libtorch 2."));
  EXPECT_THAT(r.runtime, HasSubstr("TorchScript"));
}

TEST(TorchScriptBackendTest, BadInputsAreErrorsNotExceptions) {
  auto backend = LoadTorchScriptBackend(Config(kTestModels / "tiny_cnn"));
  ASSERT_TRUE(backend.ok());
  auto instance = (*backend)->CreateInstance(0);
  ASSERT_TRUE(instance.ok());
  ASSERT_TRUE((*instance)->AttachToCurrentThread().ok());
  BackendInstance& run = **instance;

  auto wrong_count = run.Run({});
  EXPECT_EQ(wrong_count.status().code(), StatusCode::kInvalidArgument);
  auto wrong_dtype = run.Run({Tensor::Zeros(DataType::kInt32, {1, 3, 16, 16})});
  EXPECT_THAT(wrong_dtype.status().message(), HasSubstr("input 'input' must be FP32, got INT32"));
  auto wrong_rank = run.Run({Tensor::Zeros(DataType::kFp32, {3, 16, 16})});
  EXPECT_THAT(wrong_rank.status().message(), HasSubstr("must have 4 dims"));
  // Right rank, wrong channel count: libtorch throws; the backend turns it into a Status.
  auto in_model = run.Run({Tensor::Zeros(DataType::kFp32, {1, 2, 16, 16})});
  EXPECT_EQ(in_model.status().code(), StatusCode::kInternal);
  EXPECT_THAT(in_model.status().message(), HasSubstr("forward failed"));
  // The instance still works afterwards.
  EXPECT_TRUE(run.Run({Tensor::Zeros(DataType::kFp32, {2, 3, 16, 16})}).ok());
}

TEST(TorchScriptBackendTest, OutputsOutliveTheCallAndHaveTheBatchFirst) {
  auto backend = LoadTorchScriptBackend(Config(kTestModels / "multi_io"));
  ASSERT_TRUE(backend.ok());
  auto instance = (*backend)->CreateInstance(0);
  ASSERT_TRUE(instance.ok());
  Tensor a = Tensor::Zeros(DataType::kFp32, {2, 4});
  Tensor b = Tensor::Zeros(DataType::kFp32, {2, 4});
  for (int i = 0; i < 8; ++i) {
    a.mutable_values<float>()[i] = static_cast<float>(i);
    b.mutable_values<float>()[i] = 2;
  }
  std::vector<Tensor> out;
  {
    auto result = (*instance)->Run({a, b});
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    out = *result;
  }
  backend->reset();  // The outputs keep their own storage alive.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(out[0].values<float>()[7], 9);  // 7 + 2.
  EXPECT_EQ(out[1].values<float>()[3], 6);  // 3 * 2.
}

TEST(TorchScriptBackendTest, InstancesRunConcurrentlyOnTheirOwnThreads) {
  ModelConfigOverrides o;
  o.instance_count = 2;
  o.threads = 1;
  ModelConfig config = Config(kTestModels / "tiny_cnn", o);
  auto backend = LoadTorchScriptBackend(config);
  ASSERT_TRUE(backend.ok());
  Reference ref = ReadReference(config.directory);
  std::vector<double> errors(2, INFINITY);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto instance = (*backend)->CreateInstance(i);
      if (!instance.ok() || !(*instance)->AttachToCurrentThread().ok()) return;
      double worst = 0;
      for (int k = 0; k < 20; ++k) {
        auto out = (*instance)->Run(ref.inputs);
        if (!out.ok()) return;
        worst = std::max(worst, MaxAbsError((*out)[0], ref.outputs[0]));
      }
      errors[i] = worst;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(errors[0], 1e-4);
  EXPECT_LE(errors[1], 1e-4);
  EXPECT_EQ((*backend)->CreateInstance(2).status().code(), StatusCode::kInvalidArgument);
}

TEST(TorchScriptBackendTest, MissingOrCorruptModelFileIsAClearError) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_ts_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "broken");
  std::filesystem::copy_file(kTestModels / "tiny_cnn" / "config.yaml",
                             dir / "broken" / "config.yaml");
  ModelConfig config = Config(dir / "broken");
  auto missing = LoadTorchScriptBackend(config);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("model 'broken': loading"));
  std::ofstream(dir / "broken" / "model.pt") << "not a zip archive";
  auto corrupt = LoadTorchScriptBackend(config);
  EXPECT_EQ(corrupt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("model.pt"));
  std::filesystem::remove_all(dir);
}

TEST(TorchScriptBackendTest, CudaDeviceIsRefusedOnACpuBuild) {
  ModelConfig config = Config(kTestModels / "tiny_cnn");
  config.instances.device = "cuda";
  EXPECT_THAT(LoadTorchScriptBackend(config).status().message(), HasSubstr("CPU only"));
}

}  // namespace
}  // namespace sluice
