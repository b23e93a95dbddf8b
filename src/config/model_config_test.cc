// Tests for config.yaml parsing, normalisation and validation: one test per rule.
#include "config/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/sweep_config.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

constexpr const char* kValid = R"(
name: m
max_batch_size: 8
dynamic_batching:
  max_queue_delay_us: 500
  preferred_batch_sizes: [4, 8]
  max_queue_size: 64
  default_timeout_us: 100000
instances:
  count: 2
  device: cpu
  threads: 1
  idle_spin_us: 50
precision: bf16
optimize:
  freeze: true
  channels_last: true
inputs:
  - name: input
    datatype: FP32
    shape: [3, -1, 16]
outputs:
  - name: logits
    datatype: FP32
    shape: [5]
preprocess:
  image:
    resize: 20
    crop: 16
    channels: 3
    mean: [0.5, 0.5, 0.5]
    std: [0.25]
postprocess:
  topk: 3
warmup:
  batch_sizes: [1, 8]
  iterations: 3
)";

// Parses, normalises and validates `yaml` for a 4-core machine; returns the error message or "".
std::string ErrorOf(const std::string& yaml) {
  auto parsed = ParseModelConfig(yaml, "models/m/config.yaml");
  if (!parsed.ok()) return parsed.status().message();
  ModelConfig c = *parsed;
  if (c.name.empty()) c.name = "m";
  NormalizeModelConfig(c, 4);
  Status s = ValidateModelConfig(c, 4, "models/m/config.yaml");
  return s.ok() ? "" : s.message();
}

// kValid with `from` replaced by `to` (which must occur).
std::string Edit(const std::string& from, const std::string& to) {
  std::string text = kValid;
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ModelConfigTest, ParsesEveryField) {
  auto parsed = ParseModelConfig(kValid, "config.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const ModelConfig& c = *parsed;
  EXPECT_EQ(c.max_batch_size, 8);
  EXPECT_EQ(c.dynamic_batching.max_queue_delay, Micros(500));
  EXPECT_EQ(c.dynamic_batching.preferred_batch_sizes, (std::vector<int>{4, 8}));
  EXPECT_EQ(c.dynamic_batching.max_queue_size, 64);
  EXPECT_EQ(c.dynamic_batching.default_timeout, Micros(100000));
  EXPECT_EQ(c.instances.count, 2);
  EXPECT_EQ(c.instances.threads, 1);
  EXPECT_EQ(c.instances.idle_spin, Micros(50));
  EXPECT_EQ(c.precision, Precision::kBf16);
  EXPECT_TRUE(c.optimize.freeze);
  EXPECT_TRUE(c.optimize.channels_last);
  ASSERT_EQ(c.inputs.size(), 1u);
  EXPECT_EQ(c.inputs[0].shape, (Shape{3, -1, 16}));
  EXPECT_EQ(c.outputs[0].name, "logits");
  ASSERT_TRUE(c.preprocess_image.has_value());
  EXPECT_EQ(c.preprocess_image->crop, 16);
  EXPECT_EQ(c.postprocess_topk, 3);
  EXPECT_EQ(c.warmup_iterations, 3);
  EXPECT_EQ(ErrorOf(kValid), "");
}

TEST(ModelConfigTest, NormalizeDerivesThreadsAndWarmupSizes) {
  auto parsed = ParseModelConfig(
      "max_batch_size: 16\ninstances: {count: 2}\ninputs: [{name: x, shape: [4]}]\n"
      "outputs: [{name: y, shape: [4]}]\n",
      "c.yaml");
  ASSERT_TRUE(parsed.ok());
  ModelConfig c = *parsed;
  NormalizeModelConfig(c, 4);
  EXPECT_EQ(c.instances.threads, 2);  // 4 cores / 2 instances.
  EXPECT_EQ(c.warmup_batch_sizes, (std::vector<int>{1, 16}));
  EXPECT_EQ(c.inputs[0].datatype, DataType::kFp32);  // The default datatype.
  NormalizeModelConfig(c, 1);
  EXPECT_EQ(c.instances.threads, 2);  // Already set: left alone.
}

TEST(ModelConfigTest, ErrorsNameTheFileAndTheKey) {
  EXPECT_THAT(ErrorOf(Edit("threads: 1", "threads: -2")),
              HasSubstr("models/m/config.yaml: instances.threads: must be >= 1 (got -2)"));
  EXPECT_THAT(ErrorOf(Edit("idle_spin_us: 50", "idle_spin_us: -1")),
              HasSubstr("instances.idle_spin_us: must be >= 0 and at most 1000000 (got -1)"));
}

TEST(ModelConfigTest, RejectsUnknownKeysAtEveryLevel) {
  EXPECT_THAT(ErrorOf(Edit("max_batch_size: 8", "max_batch_size: 8\nmax_batch: 3")),
              HasSubstr(": max_batch: unknown key"));
  EXPECT_THAT(ErrorOf(Edit("  count: 2", "  count: 2\n  zones: 1")),
              HasSubstr("instances.zones: unknown key"));
  EXPECT_THAT(ErrorOf(Edit("    datatype: FP32\n    shape: [3",
                           "    datatype: FP32\n    dims: 1\n    shape: [3")),
              HasSubstr("inputs[0].dims: unknown key"));
  EXPECT_THAT(ErrorOf(Edit("    crop: 16", "    crop: 16\n    flip: true")),
              HasSubstr("preprocess.image.flip: unknown key"));
}

TEST(ModelConfigTest, RejectsWrongTypes) {
  EXPECT_THAT(ErrorOf(Edit("max_batch_size: 8", "max_batch_size: eight")),
              HasSubstr("max_batch_size: cannot read 'eight' as an integer"));
  EXPECT_THAT(ErrorOf(Edit("freeze: true", "freeze: maybe")),
              HasSubstr("optimize.freeze: cannot read 'maybe' as a boolean"));
  EXPECT_THAT(ErrorOf(Edit("preferred_batch_sizes: [4, 8]", "preferred_batch_sizes: 4")),
              HasSubstr("dynamic_batching.preferred_batch_sizes: must be a list"));
  EXPECT_THAT(ErrorOf(Edit("instances:\n  count: 2", "instances: 2\nx:\n  count: 2")),
              HasSubstr("instances: must be a mapping"));
}

TEST(ModelConfigTest, RejectsInvalidYaml) {
  EXPECT_THAT(ErrorOf("max_batch_size: [1, 2\n"), HasSubstr("invalid YAML"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("file is empty"));
}

TEST(ModelConfigTest, MaxBatchSizeMustBePositive) {
  EXPECT_THAT(ErrorOf(Edit("max_batch_size: 8", "max_batch_size: 0")),
              HasSubstr("max_batch_size: must be >= 1 (got 0)"));
}

TEST(ModelConfigTest, QueueDelayAndTimeoutMustNotBeNegative) {
  EXPECT_THAT(ErrorOf(Edit("max_queue_delay_us: 500", "max_queue_delay_us: -1")),
              HasSubstr("dynamic_batching.max_queue_delay_us: must be >= 0"));
  EXPECT_THAT(ErrorOf(Edit("default_timeout_us: 100000", "default_timeout_us: -5")),
              HasSubstr("dynamic_batching.default_timeout_us: must be >= 0"));
}

TEST(ModelConfigTest, BatchingPolicyIsAdaptiveUnlessFixed) {
  auto adaptive = ParseModelConfig(kValid, "config.yaml");
  ASSERT_TRUE(adaptive.ok());
  EXPECT_TRUE(adaptive->dynamic_batching.adaptive);
  auto fixed = ParseModelConfig(Edit("max_queue_size: 64", "max_queue_size: 64\n  policy: fixed"),
                                "config.yaml");
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_FALSE(fixed->dynamic_batching.adaptive);
  EXPECT_THAT(ErrorOf(Edit("max_queue_size: 64", "max_queue_size: 64\n  policy: eager")),
              HasSubstr("dynamic_batching.policy: must be adaptive or fixed (got 'eager')"));
}

TEST(ModelConfigTest, SloIsAPositiveP99InMilliseconds) {
  auto none = ParseModelConfig(kValid, "config.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->dynamic_batching.slo_p99.count(), 0);
  auto slo = ParseModelConfig(std::string(kValid) + "slo: {p99_ms: 12.5}\n", "config.yaml");
  ASSERT_TRUE(slo.ok()) << slo.status().ToString();
  EXPECT_EQ(slo->dynamic_batching.slo_p99.count(), 12500);
  auto zero = ParseModelConfig(std::string(kValid) + "slo: {p99_ms: 0}\n", "config.yaml");
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("slo.p99_ms: must be > 0"));
  auto unknown = ParseModelConfig(std::string(kValid) + "slo: {p50_ms: 3}\n", "config.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("p50_ms"));
}

TEST(ModelConfigTest, QueueSizeMustBePositive) {
  EXPECT_THAT(ErrorOf(Edit("max_queue_size: 64", "max_queue_size: 0")),
              HasSubstr("dynamic_batching.max_queue_size: must be >= 1"));
}

TEST(ModelConfigTest, PreferredSizesWithinMaxAndIncreasing) {
  EXPECT_THAT(ErrorOf(Edit("[4, 8]", "[4, 16]")),
              HasSubstr("preferred_batch_sizes[1]: must be between 1 and max_batch_size 8"));
  EXPECT_THAT(ErrorOf(Edit("[4, 8]", "[8, 4]")),
              HasSubstr("preferred_batch_sizes[1]: sizes must be strictly increasing"));
  EXPECT_THAT(ErrorOf(Edit("[4, 8]", "[0]")), HasSubstr("preferred_batch_sizes[0]"));
}

TEST(ModelConfigTest, InstancesTimesThreadsMustFitTheCores) {
  EXPECT_THAT(ErrorOf(Edit("threads: 1", "threads: 3")),
              HasSubstr("instances: count 2 x threads 3 exceeds the machine's 4 cores"));
  EXPECT_THAT(ErrorOf(Edit("count: 2", "count: 0")), HasSubstr("instances.count: must be >= 1"));
}

TEST(ModelConfigTest, DeviceMustBeCpuOrCuda) {
  EXPECT_THAT(ErrorOf(Edit("device: cpu", "device: tpu")),
              HasSubstr("instances.device: must be cpu, cuda or cuda:N (got 'tpu')"));
  EXPECT_EQ(ErrorOf(Edit("device: cpu", "device: cuda:1")), "");
  EXPECT_THAT(ErrorOf(Edit("device: cpu", "device: 'cuda:'")), HasSubstr("instances.device"));
}

constexpr const char* kCpuInstances = R"(instances:
  count: 2
  device: cpu
  threads: 1
  idle_spin_us: 50
)";

// Parses and normalises `yaml` (which must be valid) for a 4-core machine.
ModelConfig Normalized(const std::string& yaml) {
  auto parsed = ParseModelConfig(yaml, "models/m/config.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  ModelConfig c = parsed.ok() ? *parsed : ModelConfig{};
  c.name = "m";
  NormalizeModelConfig(c, 4);
  return c;
}

TEST(ModelConfigTest, SharedCoresAreTheInstancesCoresOnCpuOnly) {
  auto parsed = ParseModelConfig(
      "instances: {count: 2, share_cores: true}\ninputs: [{name: x, shape: [4]}]\n"
      "outputs: [{name: y, shape: [4]}]\n",
      "c.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ModelConfig c = *parsed;
  NormalizeModelConfig(c, 4);
  EXPECT_TRUE(c.instances.share_cores);
  EXPECT_EQ(c.instances.threads, 2);
  EXPECT_EQ(c.instances.pool_cores, 4);  // A run alone may use all four.
  // More instances than cores: one thread each, and the pool is the cores (the rest wait).
  auto many = ParseModelConfig(
      "instances: {count: 6, share_cores: true}\ninputs: [{name: x, shape: [4]}]\n"
      "outputs: [{name: y, shape: [4]}]\n",
      "c.yaml");
  ASSERT_TRUE(many.ok());
  many->name = "m";
  NormalizeModelConfig(*many, 4);
  EXPECT_EQ(many->instances.threads, 1);
  EXPECT_EQ(many->instances.pool_cores, 4);
  EXPECT_EQ(ValidateModelConfig(*many, 4, "c.yaml").message(), "");
  EXPECT_EQ(ErrorOf(Edit("count: 2", "count: 6\n  share_cores: true")), "");
  EXPECT_THAT(ErrorOf(Edit("threads: 1", "threads: 3\n  share_cores: true")),
              HasSubstr("count 2 x threads 3 exceeds the machine's 4 cores"));
  EXPECT_FALSE(Normalized(kValid).instances.share_cores);  // Off unless asked for.
  EXPECT_EQ(ErrorOf(Edit("idle_spin_us: 50", "idle_spin_us: 50\n  share_cores: true")), "");
  EXPECT_THAT(ErrorOf(Edit("device: cpu", "device: cuda\n  share_cores: true")),
              HasSubstr("instances.share_cores: applies to CPU instances only"));
  ModelConfigOverrides o;
  o.share_cores = true;
  c = Normalized(kValid);
  ApplyOverrides(o, c);
  EXPECT_TRUE(c.instances.share_cores);
}

TEST(ModelConfigTest, InstanceGroupInTritonsTermsMakesGpuInstances) {
  const std::string yaml = Edit(kCpuInstances,
                                "instance_group:\n  - kind: KIND_GPU\n    count: 3\n"
                                "    gpus: [0, 2]\n");
  EXPECT_EQ(ErrorOf(yaml), "");
  ModelConfig c = Normalized(yaml);
  EXPECT_TRUE(c.instances.on_gpu());
  EXPECT_EQ(c.instances.device, "cuda");
  EXPECT_EQ(c.instances.gpus, (std::vector<int>{0, 2}));
  EXPECT_EQ(c.instances.count, 3);
  EXPECT_EQ(c.instances.copy_slots, 2);
  // 3 instances on each of 2 GPUs, each fed by 2 workers (one batch copied in while one computes).
  EXPECT_EQ(c.instances.workers(), 12);
  EXPECT_EQ(c.instances.gpu_source_key, "instance_group[0].kind");
  // Variable input dims: no CUDA graphs unless asked (and then refused).
  EXPECT_FALSE(c.optimize.cuda_graphs.value_or(true));
  // The GPU lifts the CPU's cores rule and allows fp16.
  std::string fp16 = yaml;
  fp16.replace(fp16.find("precision: bf16"), 15, "precision: fp16");
  EXPECT_EQ(ErrorOf(fp16), "");
  std::string many = yaml;
  many.replace(many.find("count: 3"), 8, "count: 16");
  EXPECT_EQ(ErrorOf(many), "");
}

TEST(ModelConfigTest, InstanceGroupDefaultsAndKinds) {
  ModelConfig gpu = Normalized(Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU}]\n"));
  // No GPUs named: every visible one, which the load resolves (Triton's default).
  EXPECT_TRUE(gpu.instances.gpus.empty());
  ModelConfig device_form = Normalized(Edit("device: cpu", "device: cuda"));
  EXPECT_EQ(device_form.instances.gpus, (std::vector<int>{0}));
  EXPECT_EQ(gpu.instances.count, 1);
  EXPECT_EQ(gpu.instances.threads, 1);
  ModelConfig cpu =
      Normalized(Edit(kCpuInstances, "instance_group: [{kind: KIND_CPU, count: 2}]\n"));
  EXPECT_FALSE(cpu.instances.on_gpu());
  EXPECT_EQ(cpu.instances.workers(), 2);
  ModelConfig old_form = Normalized(Edit("device: cpu", "device: cuda:1"));
  EXPECT_EQ(old_form.instances.gpus, (std::vector<int>{1}));
  EXPECT_EQ(old_form.instances.gpu_source_key, "instances.device");
  // Fixed input shapes: CUDA graphs by default.
  std::string fixed = Edit(kCpuInstances, "instance_group: [{kind: gpu}]\n");
  fixed.replace(fixed.find("shape: [3, -1, 16]"), 18, "shape: [3, 16, 16]");
  EXPECT_TRUE(Normalized(fixed).optimize.cuda_graphs.value_or(false));
  fixed.replace(fixed.find("channels_last: true"), 19, "channels_last: true\n  cuda_graphs: false");
  EXPECT_FALSE(Normalized(fixed).optimize.cuda_graphs.value_or(true));
}

TEST(ModelConfigTest, InstanceGroupErrorsNameTheirKey) {
  EXPECT_THAT(ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_TPU}]\n")),
              HasSubstr("instance_group[0].kind: must be KIND_GPU or KIND_CPU (got 'KIND_TPU')"));
  EXPECT_THAT(
      ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU}, {kind: KIND_CPU}]\n")),
      HasSubstr("instance_group: must be a list of one group"));
  EXPECT_THAT(ErrorOf(std::string(kValid) + "instance_group: [{kind: KIND_GPU}]\n"),
              HasSubstr("instance_group: give either instances or instance_group, not both"));
  EXPECT_THAT(ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU, gpus: [0, 0]}]\n")),
              HasSubstr("instance_group[0].gpus[1]: must be a GPU ordinal >= 0, listed once"));
  EXPECT_THAT(ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_CPU, gpus: [0]}]\n")),
              HasSubstr("instance_group[0].gpus: applies to kind KIND_GPU only"));
  EXPECT_THAT(ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU, copy_slots: 9}]\n")),
              HasSubstr("instances.copy_slots: must be between 1 and 8 (got 9)"));
  EXPECT_THAT(ErrorOf(Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU, zone: a}]\n")),
              HasSubstr("instance_group[0]"));
}

TEST(ModelConfigTest, GpuOnlySettingsAreRefusedOnCpuAndCheckedOnGpu) {
  EXPECT_THAT(ErrorOf(Edit("channels_last: true", "channels_last: true\n  cuda_graphs: true")),
              HasSubstr("optimize.cuda_graphs: needs GPU instances"));
  const std::string gpu = Edit(kCpuInstances, "instance_group: [{kind: KIND_GPU}]\n");
  // Variable input dims cannot be captured.
  EXPECT_THAT(ErrorOf(Edit("channels_last: true", "channels_last: true\n  cuda_graphs: true")
                          .replace(std::string(kValid).find(kCpuInstances),
                                   std::string(kCpuInstances).size(),
                                   "instance_group: [{kind: KIND_GPU}]\n")),
              HasSubstr("optimize.cuda_graphs: needs fixed input shapes; inputs[0]"));
  // AOTInductor packages: no graphs by default, refused when asked for.
  std::string package =
      Edit(kCpuInstances, "instance_group: [{kind: gpu}]\nbackend: aotinductor\n");
  package.replace(package.find("shape: [3, -1, 16]"), 18, "shape: [3, 16, 16]");
  EXPECT_FALSE(Normalized(package).optimize.cuda_graphs.value_or(true));
  package.replace(package.find("channels_last: true"), 19,
                  "channels_last: true\n  cuda_graphs: true");
  EXPECT_THAT(ErrorOf(package),
              HasSubstr("optimize.cuda_graphs: AOTInductor packages cannot be captured"));
  // int8 packages are CPU code.
  EXPECT_THAT(ErrorOf(std::string(gpu).replace(gpu.find("precision: bf16"), 15,
                                               "precision: int8\nbackend: aotinductor")),
              HasSubstr("precision: int8 packages are x86 CPU code"));
  // UINT8 images: [H, W, C], GPU only.
  const std::string uint8 = "    datatype: UINT8\n    shape: [16, 16, 3]";
  const std::string fp32 = "    datatype: FP32\n    shape: [3, -1, 16]";
  std::string on_gpu = gpu;
  on_gpu.replace(on_gpu.find(fp32), fp32.size(), uint8);
  EXPECT_EQ(ErrorOf(on_gpu), "");
  EXPECT_THAT(ErrorOf(Edit(fp32, uint8)),
              HasSubstr("inputs[0].datatype: UINT8 images are normalised on GPU instances only"));
  std::string chw = gpu;
  chw.replace(chw.find(fp32), fp32.size(), "    datatype: UINT8\n    shape: [3, 16, 16]");
  EXPECT_THAT(ErrorOf(chw), HasSubstr("inputs[0].shape: UINT8 images are [height, width, 3]"));
}

TEST(ModelConfigTest, PrecisionMustBeKnownAndFp16NeedsCuda) {
  EXPECT_THAT(ErrorOf(Edit("precision: bf16", "precision: int4")),
              HasSubstr("precision: must be auto, fp32, bf16, fp16 or int8 (got 'int4')"));
  EXPECT_THAT(ErrorOf(Edit("precision: bf16", "precision: fp16")),
              HasSubstr("precision: fp16 needs a CUDA device"));
}

TEST(ModelConfigTest, PrecisionAutoTakesTheExportersChoice) {
  auto parsed = ParseModelConfig(Edit("precision: bf16",
                                      "precision: auto\nprecision_auto:\n  chosen: int8\n"
                                      "  note: top-1 agreement 99.5%, 2.3x fp32"),
                                 "c");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->precision, Precision::kInt8);
  EXPECT_EQ(parsed->precision_auto_note, "top-1 agreement 99.5%, 2.3x fp32");
  parsed = ParseModelConfig(
      Edit("precision: bf16", "precision: auto\nprecision_auto:\n  chosen: fp32"), "c");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->precision, Precision::kFp32);
  EXPECT_EQ(parsed->precision_auto_note, "chosen at export");  // Never empty under auto.

  EXPECT_THAT(ErrorOf(Edit("precision: bf16", "precision: auto")),
              HasSubstr("precision: auto needs precision_auto.chosen"));
  EXPECT_THAT(ErrorOf(Edit("precision: bf16", "precision: auto\nprecision_auto:\n  chosen: int4")),
              HasSubstr("precision_auto.chosen: must be fp32, bf16, fp16 or int8 (got 'int4')"));
  EXPECT_THAT(ErrorOf(Edit("precision: bf16",
                           "precision: auto\nprecision_auto:\n  chosen: int8\n  speed: 2")),
              HasSubstr("precision_auto"));
  EXPECT_THAT(ErrorOf(Edit("precision: bf16", "precision: bf16\nprecision_auto:\n  chosen: int8")),
              HasSubstr("precision_auto: applies only to precision: auto (the file pins 'bf16')"));
}

TEST(ModelConfigTest, TensorSpecsNeedNamesUniqueAndValidShapes) {
  EXPECT_EQ(ErrorOf(Edit("  - name: logits\n", "  - name: input\n")), "");  // Outputs apart.
  EXPECT_THAT(ErrorOf(Edit("    shape: [3, -1, 16]", "    shape: [3, 0, 16]")),
              HasSubstr("inputs[0].shape[1]: must be >= 1 or -1"));
  EXPECT_THAT(ErrorOf(Edit("    shape: [3, -1, 16]", "    shape: [3, -2, 16]")),
              HasSubstr("inputs[0].shape[1]"));
  EXPECT_THAT(
      ErrorOf(Edit("    datatype: FP32\n    shape: [5]", "    datatype: STRING\n    shape: [5]")),
      HasSubstr("outputs[0].datatype: unsupported datatype 'STRING'"));
  EXPECT_THAT(ErrorOf(Edit("    shape: [5]", "    shape: [5]\n    name2: x")),
              HasSubstr("outputs[0].name2: unknown key"));
  EXPECT_THAT(ErrorOf(Edit("  - name: logits\n    datatype: FP32\n    shape: [5]\n", "  []\n")),
              HasSubstr("outputs: at least one is required"));
  std::string two_inputs =
      Edit("    shape: [3, -1, 16]\n", "    shape: [3, -1, 16]\n  - name: input\n    shape: [2]\n");
  EXPECT_THAT(ErrorOf(two_inputs), HasSubstr("inputs[1].name: duplicate name 'input'"));
  EXPECT_THAT(ErrorOf(Edit("    datatype: FP32\n    shape: [5]", "    datatype: FP32")),
              HasSubstr("outputs[0].shape: is required"));
}

TEST(ModelConfigTest, ImagePreprocessRules) {
  EXPECT_THAT(ErrorOf(Edit("crop: 16", "crop: 24")),
              HasSubstr("preprocess.image.crop: crop 24 is larger than resize 20"));
  EXPECT_THAT(ErrorOf(Edit("channels: 3", "channels: 2")),
              HasSubstr("preprocess.image.channels: must be 1 or 3"));
  EXPECT_THAT(ErrorOf(Edit("mean: [0.5, 0.5, 0.5]", "mean: [0.5, 0.5]")),
              HasSubstr("preprocess.image.mean: needs 1 or 3 values (got 2)"));
  EXPECT_THAT(ErrorOf(Edit("std: [0.25]", "std: [0]")),
              HasSubstr("preprocess.image.std: values must be > 0"));
}

TEST(ModelConfigTest, TopkAndWarmupRules) {
  EXPECT_THAT(ErrorOf(Edit("topk: 3", "topk: -1")), HasSubstr("postprocess.topk: must be >= 0"));
  EXPECT_THAT(ErrorOf(Edit("batch_sizes: [1, 8]", "batch_sizes: [1, 9]")),
              HasSubstr("warmup.batch_sizes[1]: must be between 1 and max_batch_size 8"));
  EXPECT_THAT(ErrorOf(Edit("iterations: 3", "iterations: 0")),
              HasSubstr("warmup.iterations: must be >= 1"));
}

TEST(ModelConfigTest, ModelNamesAreRestricted) {
  EXPECT_TRUE(IsValidModelName("resnet18"));
  EXPECT_TRUE(IsValidModelName("fashion_mnist-v1.2"));
  EXPECT_FALSE(IsValidModelName(""));
  EXPECT_FALSE(IsValidModelName(".."));
  EXPECT_FALSE(IsValidModelName("../etc"));
  EXPECT_FALSE(IsValidModelName("a/b"));
  EXPECT_FALSE(IsValidModelName("caf\xc3\xa9"));
  EXPECT_THAT(ErrorOf(Edit("name: m", "name: ../m")),
              HasSubstr("name: '../m' is not a valid model name"));
  EXPECT_THAT(ErrorOf(Edit("name: m", "name: m\nmodel_file: ../other.pt")),
              HasSubstr("model_file: must be a file name inside the model directory"));
}

class LoadModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sluice_config_test_" + std::to_string(::getpid())) / "m";
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_.parent_path()); }
  void Write(const std::string& text) { std::ofstream(dir_ / "config.yaml") << text; }
  std::filesystem::path dir_;
};

TEST_F(LoadModelConfigTest, LoadsNormalisesAndAppliesOverrides) {
  Write(std::string(kValid));
  auto c = LoadModelConfig(dir_, {}, 4);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->directory, dir_);
  EXPECT_EQ(c->model_path(), dir_ / "model.pt");

  // A pinned precision replaces the exporter's automatic choice, and its note goes.
  Write(Edit("precision: bf16", "precision: auto\nprecision_auto:\n  chosen: fp32\n  note: n"));
  c = LoadModelConfig(dir_, {}, 4);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->precision, Precision::kFp32);
  EXPECT_EQ(c->precision_auto_note, "n");
  ModelConfigOverrides pin;
  pin.precision = Precision::kBf16;
  c = LoadModelConfig(dir_, pin, 4);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->precision, Precision::kBf16);
  EXPECT_EQ(c->precision_auto_note, "");
  Write(std::string(kValid));

  ModelConfigOverrides o;
  o.instance_count = 1;
  o.threads = 4;
  o.precision = Precision::kFp32;
  o.freeze = false;
  auto over = LoadModelConfig(dir_, o, 4);
  ASSERT_TRUE(over.ok()) << over.status().ToString();
  EXPECT_EQ(over->instances.count, 1);
  EXPECT_EQ(over->instances.threads, 4);
  EXPECT_EQ(over->precision, Precision::kFp32);
  EXPECT_FALSE(over->optimize.freeze);
  o.threads = 8;  // 1 x 8 > 4 cores: overrides are validated like the file.
  EXPECT_THAT(LoadModelConfig(dir_, o, 4).status().message(),
              HasSubstr("exceeds the machine's 4 cores"));
}

TEST_F(LoadModelConfigTest, BackendIsSaidOrInferredFromTheFilesPresent) {
  Write(std::string(kValid));  // precision: bf16, no backend key.
  auto c = LoadModelConfig(dir_, {}, 4);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->backend, BackendKind::kTorchScript);  // No package: model.pt.
  std::ofstream(dir_ / "model_bf16.pt2") << "package";
  c = LoadModelConfig(dir_, {}, 4);
  EXPECT_EQ(c->backend, BackendKind::kAotInductor);  // The package of the precision.
  EXPECT_EQ(c->model_path(), dir_ / "model_bf16.pt2");
  ModelConfigOverrides o;
  o.precision = Precision::kFp32;  // No model.pt2: back to TorchScript.
  EXPECT_EQ(LoadModelConfig(dir_, o, 4)->model_file, "model.pt");
  o.precision = Precision::kInt8;
  o.backend = BackendKind::kAotInductor;
  EXPECT_EQ(LoadModelConfig(dir_, o, 4)->model_file, "model_int8.pt2");

  Write(Edit("name: m", "name: m\nbackend: torchscript"));
  EXPECT_EQ(LoadModelConfig(dir_, {}, 4)->model_file, "model.pt");  // Said beats inferred.
  Write(Edit("name: m", "name: m\nmodel_file: custom.pt2"));
  EXPECT_EQ(LoadModelConfig(dir_, {}, 4)->backend, BackendKind::kAotInductor);
  Write(Edit("name: m", "name: m\nbackend: onnx"));
  EXPECT_THAT(LoadModelConfig(dir_, {}, 4).status().message(),
              HasSubstr("backend: must be torchscript or aotinductor (got 'onnx')"));
  Write(Edit("precision: bf16", "precision: int8\nbackend: torchscript"));
  EXPECT_THAT(LoadModelConfig(dir_, {}, 4).status().message(),
              HasSubstr("precision: int8 needs the aotinductor backend"));
}

TEST(BackendVariantTest, NamesRoundTrip) {
  for (const char* name : {"torchscript", "torchscript+freeze", "aotinductor"}) {
    auto v = ParseBackendVariant(name);
    ASSERT_TRUE(v.has_value()) << name;
    EXPECT_EQ(BackendVariantName(*v), name);
  }
  EXPECT_FALSE(ParseBackendVariant("aotinductor+freeze").has_value());
  EXPECT_EQ(DefaultModelFile(BackendKind::kAotInductor, Precision::kBf16), "model_bf16.pt2");
}

TEST_F(LoadModelConfigTest, NameMustMatchTheDirectory) {
  Write(Edit("name: m", "name: other"));
  EXPECT_THAT(LoadModelConfig(dir_, {}, 4).status().message(),
              HasSubstr("name: 'other' differs from the directory name 'm'"));
  Write(Edit("name: m\n", ""));
  auto c = LoadModelConfig(dir_, {}, 4);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "m");  // Taken from the directory.
}

TEST_F(LoadModelConfigTest, MissingFileIsNotFound) {
  auto c = LoadModelConfig(dir_ / "nope", {}, 4);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("config.yaml: cannot open"));
}

TEST(SweepConfigTest, ParsesGridAndRejectsUnknownKeys) {
  auto c = ParseSweepConfig(
      "model: resnet18\nbatch_sizes: [1, 8]\ncompile: [false, true]\nprecisions: [fp32, bf16]\n"
      "iterations: 7\nworkers: 2\n",
      "sweep.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c->model, "resnet18");
  EXPECT_EQ(*c->batch_sizes, (std::vector<int>{1, 8}));
  EXPECT_EQ(*c->compile, (std::vector<bool>{false, true}));
  auto b = ParseSweepConfig("backends: [torchscript+freeze, aotinductor]\n", "sweep.yaml");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->backends->size(), 2u);
  EXPECT_EQ((*b->backends)[1].kind, BackendKind::kAotInductor);
  EXPECT_THAT(ParseSweepConfig("backends: [tensorrt]\n", "sweep.yaml").status().message(),
              HasSubstr("backends[0]: must be torchscript, torchscript+freeze or aotinductor"));
  EXPECT_EQ(*c->precisions, (std::vector<Precision>{Precision::kFp32, Precision::kBf16}));
  EXPECT_EQ(*c->iterations, 7);
  EXPECT_EQ(*c->workers, 2);
  EXPECT_FALSE(c->threads.has_value());
  EXPECT_THAT(ParseSweepConfig("batch_size: [1]\n", "sweep.yaml").status().message(),
              HasSubstr("sweep.yaml: batch_size: unknown key"));
  EXPECT_THAT(ParseSweepConfig("precisions: [fp8]\n", "sweep.yaml").status().message(),
              HasSubstr("precisions[0]: must be fp32, bf16, fp16 or int8 (got 'fp8')"));
}

}  // namespace
}  // namespace sluice
