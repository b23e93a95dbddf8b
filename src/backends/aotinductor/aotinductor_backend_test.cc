// The AOTInductor backend against reference outputs written by Python (tools/export_models.py):
// tiny_cnn_aot holds tiny_cnn's weights as model.pt2 (fp32), model_bf16.pt2 and model_int8.pt2.
//
// fp32 must reproduce the eager model within 1e-4 (max abs error). bf16 and int8 must reproduce
// the same package run by Python (reference_<precision>.yaml) within kPackageTolerance, and stay
// near the fp32 function (kBf16VsFp32, kInt8VsFp32); the tolerances are justified beside them.
#include "backends/aotinductor/aotinductor_backend.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/load_backend.h"
#include "backends/reference_test_util.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kTestModels = SLUICE_TEST_MODELS;
const std::filesystem::path kModel = kTestModels / "tiny_cnn_aot";
const std::filesystem::path kDefaultModels = std::filesystem::path(SLUICE_SOURCE_DIR) / "models";

// The same compiled kernels run in Python and here; what can differ is the order of reductions
// (OpenMP splits them by the thread count). In bf16 a reordered sum can round differently at one
// ulp of bf16 (2^-8 relative) in each of the few layers, so 2% of the largest output magnitude;
// int8 activations are requantised between layers, where such a difference can move a value by
// one quantisation step, also about 1-2% of the range.
constexpr double kPackageTolerance = 0.02;
// Against the fp32 model: bf16 carries 8 mantissa bits, so outputs of this 2-layer model stay
// within a few percent; int8 (per-tensor activations calibrated on 64 random inputs) within 10%.
constexpr double kBf16VsFp32 = 0.05;
constexpr double kInt8VsFp32 = 0.10;

using testing::MaxAbs;
using testing::MaxAbsError;
using testing::ReadReference;
using testing::Reference;

ModelConfig Config(const std::filesystem::path& dir, ModelConfigOverrides o = {}) {
  auto c = LoadModelConfig(dir, o, 4);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

ModelConfig ConfigAt(Precision precision) {
  ModelConfigOverrides o;
  o.precision = precision;
  return Config(kModel, o);
}

// Runs the reference inputs of `ref` through `config`'s backend; the first output.
Tensor RunReference(const ModelConfig& config, const Reference& ref) {
  auto backend = LoadAotInductorBackend(config);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  if (!backend.ok()) return Tensor();
  auto instance = (*backend)->CreateInstance(0);
  EXPECT_TRUE(instance.ok());
  EXPECT_TRUE((*instance)->AttachToCurrentThread().ok());
  auto out = (*instance)->Run(ref.inputs);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return Tensor();
  EXPECT_EQ(out->size(), ref.outputs.size());
  return (*out)[0];
}

TEST(AotInductorBackendTest, ConfigInfersThePackageOfItsPrecision) {
  ModelConfig fp32 = ConfigAt(Precision::kFp32);
  EXPECT_EQ(fp32.backend, BackendKind::kAotInductor);
  EXPECT_EQ(fp32.model_file, "model.pt2");
  EXPECT_EQ(ConfigAt(Precision::kBf16).model_file, "model_bf16.pt2");
  EXPECT_EQ(ConfigAt(Precision::kInt8).model_file, "model_int8.pt2");
  ModelConfigOverrides o;
  o.backend = BackendKind::kTorchScript;
  EXPECT_EQ(Config(kModel, o).model_file, "model.pt");
  // tiny_cnn has model.pt only: TorchScript, and int8 is refused at load time.
  EXPECT_EQ(Config(kTestModels / "tiny_cnn").backend, BackendKind::kTorchScript);
  o = {};
  o.precision = Precision::kInt8;
  auto int8_ts = LoadModelConfig(kTestModels / "tiny_cnn", o, 4);
  EXPECT_THAT(int8_ts.status().message(), HasSubstr("int8 needs the aotinductor backend"));
}

TEST(AotInductorBackendTest, Fp32ReproducesTheEagerModelWithin1e4) {
  Reference ref = ReadReference(kModel);
  Tensor out = RunReference(ConfigAt(Precision::kFp32), ref);
  EXPECT_LE(MaxAbsError(out, ref.outputs[0]), 1e-4);
}

// tiny_residual_aot's fp32 package calls sluice::conv3x3 (Winograd) for its residual block
// through AOTInductor's proxy executor; its reference is the eager model's (direct convolutions).
TEST(AotInductorBackendTest, WinogradConvolutionsReproduceTheEagerModel) {
  const std::filesystem::path dir = kTestModels / "tiny_residual_aot";
  Reference ref = ReadReference(dir);
  Tensor out = RunReference(Config(dir), ref);
  EXPECT_LE(MaxAbsError(out, ref.outputs[0]), 1e-4 * std::max(1.0, MaxAbs(ref.outputs[0])));
}

TEST(AotInductorBackendTest, Bf16ReproducesItsPackageInPythonAndStaysNearFp32) {
  Reference ref = ReadReference(kModel, "_bf16");
  Tensor out = RunReference(ConfigAt(Precision::kBf16), ref);
  double scale = MaxAbs(ref.outputs[0]);
  EXPECT_LE(MaxAbsError(out, ref.outputs[0]), kPackageTolerance * scale);
  Tensor fp32 = ReadReference(kModel).outputs[0];
  double vs_fp32 = MaxAbsError(out, fp32);
  // bf16 really ran: reordered fp32 arithmetic alone differs by ~1e-6 of the scale.
  EXPECT_GT(vs_fp32, 1e-3 * MaxAbs(fp32));
  EXPECT_LE(vs_fp32, kBf16VsFp32 * MaxAbs(fp32));
}

TEST(AotInductorBackendTest, Int8ReproducesItsPackageInPythonAndStaysNearFp32) {
  Reference ref = ReadReference(kModel, "_int8");
  Tensor out = RunReference(ConfigAt(Precision::kInt8), ref);
  EXPECT_LE(MaxAbsError(out, ref.outputs[0]), kPackageTolerance * MaxAbs(ref.outputs[0]));
  Tensor fp32 = ReadReference(kModel).outputs[0];
  double vs_fp32 = MaxAbsError(out, fp32);
  // Quantised arithmetic really ran (an export that quantised nothing would match fp32 to ~1e-6).
  EXPECT_GT(vs_fp32, 1e-3 * MaxAbs(fp32));
  EXPECT_LE(vs_fp32, kInt8VsFp32 * MaxAbs(fp32));
}

// fp32 has one model with a dynamic batch; int8 one static model per bucket (1, 2, 4, 8), which
// the backend pads batches up to: every size must give each sample's own answer.
TEST(AotInductorBackendTest, EveryBatchSizeOfTheExportedRangeRuns) {
  for (auto [precision, suffix] :
       {std::pair{Precision::kFp32, ""}, std::pair{Precision::kInt8, "_int8"}}) {
    ModelConfig config = ConfigAt(precision);
    auto backend = LoadAotInductorBackend(config);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    auto instance = (*backend)->CreateInstance(0);
    ASSERT_TRUE(instance.ok());
    Reference ref = ReadReference(kModel, suffix);
    const Tensor& x = ref.inputs[0];  // 4 samples.
    const double tolerance =
        precision == Precision::kFp32 ? 1e-4 : kPackageTolerance * MaxAbs(ref.outputs[0]);
    for (int64_t batch = 1; batch <= config.max_batch_size; ++batch) {
      // `batch` samples: the reference's, repeated.
      Tensor in = Tensor::Zeros(DataType::kFp32, {batch, 3, 16, 16});
      const size_t per_sample = 3 * 16 * 16;
      for (int64_t i = 0; i < batch; ++i) {
        std::copy_n(x.values<float>().data() + (i % 4) * per_sample, per_sample,
                    in.mutable_values<float>().data() + i * per_sample);
      }
      auto out = (*instance)->Run({in});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      ASSERT_EQ((*out)[0].shape(), (Shape{batch, 5})) << PrecisionName(precision);
      for (int64_t i = 0; i < batch; ++i) {
        for (int k = 0; k < 5; ++k) {
          EXPECT_NEAR((*out)[0].values<float>()[i * 5 + k],
                      ref.outputs[0].values<float>()[(i % 4) * 5 + k], tolerance)
              << PrecisionName(precision) << " batch " << batch;
        }
      }
    }
  }
}

TEST(AotInductorBackendTest, BadInputsAreErrorsNotCrashes) {
  auto backend = LoadAotInductorBackend(ConfigAt(Precision::kFp32));
  ASSERT_TRUE(backend.ok());
  auto instance = (*backend)->CreateInstance(0);
  ASSERT_TRUE(instance.ok());
  BackendInstance& run = **instance;
  EXPECT_EQ(run.Run({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(run.Run({Tensor::Zeros(DataType::kInt32, {1, 3, 16, 16})}).status().message(),
              HasSubstr("input 'input' must be FP32, got INT32"));
  EXPECT_THAT(run.Run({Tensor::Zeros(DataType::kFp32, {3, 16, 16})}).status().message(),
              HasSubstr("must have 4 dims"));
  // The compiled code does not check shapes: the backend does, before it runs.
  auto channels = run.Run({Tensor::Zeros(DataType::kFp32, {1, 2, 16, 16})});
  EXPECT_EQ(channels.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(channels.status().message(), HasSubstr("has shape [1, 2, 16, 16]"));
  auto too_big = run.Run({Tensor::Zeros(DataType::kFp32, {9, 3, 16, 16})});
  EXPECT_THAT(too_big.status().message(), HasSubstr("batch up to 8"));
  EXPECT_TRUE(run.Run({Tensor::Zeros(DataType::kFp32, {2, 3, 16, 16})}).ok());
}

TEST(AotInductorBackendTest, InstancesShareOnePackageAndRunAtOnce) {
  ModelConfigOverrides o;
  o.instance_count = 2;
  o.threads = 1;
  ModelConfig config = Config(kModel, o);
  auto backend = LoadAotInductorBackend(config);
  ASSERT_TRUE(backend.ok());
  Reference ref = ReadReference(kModel);
  std::vector<double> errors(2, INFINITY);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto instance = (*backend)->CreateInstance(i);
      if (!instance.ok() || !(*instance)->AttachToCurrentThread().ok()) return;
      double worst = 0;
      for (int k = 0; k < 50; ++k) {
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

TEST(AotInductorBackendTest, SharedCoresGiveARunAloneThePoolAndRunsAtOnceAShare) {
  ModelConfigOverrides o;
  o.instance_count = 2;
  o.threads = 1;
  o.share_cores = true;
  ModelConfig config = Config(kModel, o);
  ASSERT_EQ(config.instances.pool_cores, 2);
  auto backend = LoadAotInductorBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  Reference ref = ReadReference(kModel);
  std::vector<double> errors(2, INFINITY);
  std::atomic<bool> budget_outside_pool{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto instance = (*backend)->CreateInstance(i);
      if (!instance.ok() || !(*instance)->AttachToCurrentThread().ok()) return;
      if (at::get_num_threads() != 1) budget_outside_pool = true;  // Attached: its own thread.
      double worst = 0;
      for (int k = 0; k < 50; ++k) {
        auto out = (*instance)->Run(ref.inputs);
        if (!out.ok()) return;
        const int used = at::get_num_threads();  // What this run had: its share of the pool.
        if (used < 1 || used > 2) budget_outside_pool = true;
        worst = std::max(worst, MaxAbsError((*out)[0], ref.outputs[0]));
      }
      errors[i] = worst;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(budget_outside_pool.load());
  EXPECT_LE(errors[0], 1e-4);  // Runs that change their thread count still answer right.
  EXPECT_LE(errors[1], 1e-4);
  // Alone, a run takes the whole pool.
  std::thread alone([&] {
    auto instance = (*backend)->CreateInstance(0);
    ASSERT_TRUE(instance.ok());
    ASSERT_TRUE((*instance)->AttachToCurrentThread().ok());
    ASSERT_TRUE((*instance)->Run(ref.inputs).ok());
    EXPECT_EQ(at::get_num_threads(), 2);
  });
  alone.join();
}

TEST(AotInductorBackendTest, ReportsLoadTimesAndRuntime) {
  auto backend = LoadBackend(ConfigAt(Precision::kFp32));
  ASSERT_TRUE(backend.ok());
  const LoadReport& r = (*backend)->load_report();
  EXPECT_GT(r.load_seconds, 0);
  EXPECT_GT(r.warmup_seconds, 0);
  EXPECT_THAT(r.runtime, HasSubstr("libtorch 2."));
  EXPECT_THAT(r.runtime, HasSubstr("AOTInductor"));
}

TEST(AotInductorBackendTest, ABatchRangeBeyondTheExportIsRefused) {
  ModelConfigOverrides o;
  o.max_batch_size = 16;  // Exported for 1..8.
  auto backend = LoadAotInductorBackend(Config(kModel, o));
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(backend.status().message(), HasSubstr("exceeds the batch range 1..8"));
}

TEST(AotInductorBackendTest, MissingOrCorruptPackageIsAClearError) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_aoti_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "broken");
  std::filesystem::copy_file(kModel / "config.yaml", dir / "broken" / "config.yaml");
  ModelConfigOverrides o;
  o.backend = BackendKind::kAotInductor;
  ModelConfig config = Config(dir / "broken", o);
  auto missing = LoadAotInductorBackend(config);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("no AOTInductor package"));
  std::ofstream(dir / "broken" / "model.pt2") << "not a zip archive";
  auto corrupt = LoadAotInductorBackend(config);
  EXPECT_EQ(corrupt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("model.pt2"));
  // A bf16 package where the config asks for fp32 is named as such.
  std::filesystem::copy_file(kModel / "model_bf16.pt2", dir / "broken" / "model.pt2",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_THAT(LoadAotInductorBackend(config).status().message(),
              HasSubstr("holds a bf16 model, the config asks for fp32"));
  std::filesystem::remove_all(dir);
}

TEST(AotInductorBackendTest, CudaDeviceIsRefusedOnACpuBuild) {
  ModelConfig config = ConfigAt(Precision::kFp32);
  config.instances.device = "cuda";
  EXPECT_THAT(LoadAotInductorBackend(config).status().message(), HasSubstr("CPU only"));
}

TEST(AotInductorBackendTest, DefaultModelsReproducePythonWhenExported) {
  for (const char* name : {"resnet18", "fashion_mnist"}) {
    std::filesystem::path dir = kDefaultModels / name;
    if (!std::filesystem::exists(dir / "model.pt2")) {
      GTEST_SKIP() << "default models not exported (make models): " << dir;
    }
    ModelConfigOverrides o;
    o.precision = Precision::kFp32;
    o.backend = BackendKind::kAotInductor;
    o.warmup_batch_sizes = std::vector<int>{1};
    Reference ref = ReadReference(dir);
    EXPECT_LE(MaxAbsError(RunReference(Config(dir, o), ref), ref.outputs[0]), 1e-4) << name;
    for (auto [precision, suffix] :
         {std::pair{Precision::kBf16, "_bf16"}, std::pair{Precision::kInt8, "_int8"}}) {
      o.precision = precision;
      Reference low = ReadReference(dir, suffix);
      EXPECT_LE(MaxAbsError(RunReference(Config(dir, o), low), low.outputs[0]),
                kPackageTolerance * MaxAbs(low.outputs[0]))
          << name << suffix;
    }
  }
}

}  // namespace
}  // namespace sluice
