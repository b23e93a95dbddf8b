// The `llm:` section of a model's config.yaml: defaults, the step budget and speculative keys,
// and errors that name the key.
#include "llm/llm_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace sluice::llm {
namespace {

class ServeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("llm_config_test_" + std::to_string(::getpid()) + ".yaml"))
                .string();
    arch_.max_position_embeddings = 4096;
  }
  void TearDown() override { std::filesystem::remove(path_); }
  Result<LlmServeConfig> Parse(const std::string& yaml) {
    std::ofstream(path_) << yaml;
    return ParseServeConfig(path_, arch_);
  }
  std::string path_;
  ModelArchitecture arch_;
};

TEST_F(ServeConfigTest, StepBudgetAndSpeculativeKeys) {
  auto config = Parse(
      "llm:\n  max_step_tokens: 48\n  prefill_chunk: 384\n  speculative_tokens: 5\n"
      "  speculative_ngram: 2\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->max_step_tokens, 48);
  EXPECT_EQ(config->prefill_chunk, 384);
  EXPECT_EQ(config->speculative_tokens, 5);
  EXPECT_EQ(config->speculative_ngram, 2);
  auto defaults = Parse("llm:\n  slots: 4\n");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->max_step_tokens, LlmServeConfig{}.max_step_tokens);
  EXPECT_EQ(defaults->speculative_tokens, 0) << "speculative decoding is off by default";
  EXPECT_TRUE(defaults->prefix_caching);
  auto off = Parse("llm:\n  prefix_caching: false\n");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->prefix_caching);
}

// keep_alive as Ollama writes it: a duration or seconds; unset, the server's applies.
TEST_F(ServeConfigTest, KeepAlive) {
  auto unset = Parse("llm:\n  slots: 2\n");
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->keep_alive.has_value());
  for (const auto& [text, ms] : std::vector<std::pair<std::string, int64_t>>{
           {"10m", 600000}, {"90", 90000}, {"-1", -1000}, {"0", 0}, {"1h30m", 5400000}}) {
    auto config = Parse("llm:\n  keep_alive: " + text + "\n");
    ASSERT_TRUE(config.ok()) << text << ": " << config.status().ToString();
    ASSERT_TRUE(config->keep_alive.has_value()) << text;
    EXPECT_EQ(config->keep_alive->count(), ms) << text;
  }
  auto bad = Parse("llm:\n  keep_alive: ten minutes\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("llm.keep_alive"), std::string::npos)
      << bad.status().message();
}

TEST_F(ServeConfigTest, EmbeddingModels) {
  auto defaults = Parse("llm:\n  slots: 2\n");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->pooling, Pooling::kNone);  // A generating model.
  auto config = Parse("llm:\n  embedding: {pooling: mean, normalize: false}\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->pooling, Pooling::kMean);
  EXPECT_FALSE(config->normalize);
  config = Parse("llm:\n  embedding:\n    pooling: last\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->pooling, Pooling::kLast);
  EXPECT_TRUE(config->normalize);
  EXPECT_EQ(PoolingName(Pooling::kCls), "cls");
}

TEST_F(ServeConfigTest, PagedCacheKeys) {
  auto config = Parse("llm:\n  slots: 64\n  kv_block_size: 32\n  kv_cache_bytes: 268435456\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->slots, 64);
  EXPECT_EQ(config->kv_block_size, 32);
  EXPECT_EQ(config->kv_cache_bytes, int64_t{268435456});
  auto defaults = Parse("llm:\n  slots: 4\n");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->kv_block_size, 16);
  EXPECT_EQ(defaults->kv_cache_bytes, 0) << "0: room for slots x context";
  EXPECT_EQ(defaults->kv_cache_dtype, KvCacheDtype::kAuto);
  for (KvCacheDtype dtype :
       {KvCacheDtype::kAuto, KvCacheDtype::kFp32, KvCacheDtype::kBf16, KvCacheDtype::kQ8_0}) {
    auto chosen = Parse("llm:\n  kv_cache_dtype: " + std::string(KvCacheDtypeName(dtype)) + "\n");
    ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
    EXPECT_EQ(chosen->kv_cache_dtype, dtype);
  }
  EXPECT_EQ(defaults->weights_cache, "") << "off unless named";
  auto cached = Parse("llm:\n  weights_cache: /var/cache/sluice\n");
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_EQ(cached->weights_cache, "/var/cache/sluice");
}

// Triton's instance_group picks the device a language model runs on: one GPU (the first where
// none is named), or the CPU (the default).
TEST_F(ServeConfigTest, InstanceGroupPicksTheDevice) {
  auto cpu = Parse("llm:\n  slots: 2\n");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->device, "cpu");
  auto gpu = Parse("instance_group: [{kind: KIND_GPU}]\nllm:\n  precision: bf16\n");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->device, "cuda:0");
  auto int4 = Parse("instance_group: [{kind: KIND_GPU}]\nllm:\n  precision: int4\n");
  ASSERT_TRUE(int4.ok()) << int4.status().ToString();
  EXPECT_EQ(int4->precision, LlmPrecision::kInt4);
  EXPECT_EQ(LlmPrecisionName(int4->precision), "int4");
  EXPECT_NE(Parse("llm:\n  precision: int3\n")
                .status()
                .message()
                .find("'int3' is not fp32, bf16, int8 or int4"),
            std::string::npos);
  // Decode graphs: on by default, off where asked; asked for on the CPU, refused by name.
  EXPECT_TRUE(gpu->cuda_graphs);
  auto eager = Parse("instance_group: [{kind: KIND_GPU}]\nllm:\n  cuda_graphs: false\n");
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  EXPECT_FALSE(eager->cuda_graphs);
  EXPECT_NE(Parse("llm:\n  cuda_graphs: true\n").status().message().find("llm.cuda_graphs"),
            std::string::npos);
  EXPECT_TRUE(Parse("llm:\n  cuda_graphs: false\n").ok());
  EXPECT_NE(Parse("instance_group: [{kind: KIND_GPU}]\nllm:\n  cuda_graphs: often\n")
                .status()
                .message()
                .find("llm.cuda_graphs"),
            std::string::npos);
  auto second = Parse("instance_group:\n  - kind: KIND_GPU\n    gpus: [1]\n");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->device, "cuda:1");
  auto on_cpu = Parse("instance_group: [{kind: KIND_CPU}]\n");
  ASSERT_TRUE(on_cpu.ok());
  EXPECT_EQ(on_cpu->device, "cpu");
  auto error = [&](const std::string& yaml) { return Parse(yaml).status().message(); };
  EXPECT_NE(error("instance_group: [{kind: KIND_GPU, gpus: [0, 1]}]\n")
                .find("'instance_group[0].gpus' must name one GPU ordinal"),
            std::string::npos);
  EXPECT_NE(error("instance_group: [{kind: KIND_GPU, count: 2}]\n")
                .find("'instance_group[0].count' is not a language model's key"),
            std::string::npos);
  EXPECT_NE(error("instance_group: [{kind: KIND_TPU}]\n").find("must be KIND_GPU or KIND_CPU"),
            std::string::npos);
  EXPECT_NE(error("instance_group: [{kind: KIND_CPU, gpus: [0]}]\n")
                .find("'instance_group[0].gpus' applies to KIND_GPU only"),
            std::string::npos);
  EXPECT_NE(error("instances: {count: 2}\n").find("expected 'llm:' or 'instance_group:'"),
            std::string::npos);
}

TEST_F(ServeConfigTest, ErrorsNameTheKey) {
  for (const auto& [yaml, key] : std::vector<std::pair<std::string, std::string>>{
           {"llm:\n  max_step_tokens: 0\n", "llm.max_step_tokens"},
           {"llm:\n  speculative_tokens: 65\n", "llm.speculative_tokens"},
           {"llm:\n  speculative_ngram: 0\n", "llm.speculative_ngram"},
           {"llm:\n  prefix_caching: sometimes\n", "llm.prefix_caching"},
           {"llm:\n  kv_block_size: 0\n", "llm.kv_block_size"},
           {"llm:\n  kv_cache_bytes: -1\n", "llm.kv_cache_bytes"},
           {"llm:\n  kv_cache_dtype: q4_0\n", "llm.kv_cache_dtype"},
           {"llm:\n  weights_cache: ''\n", "llm.weights_cache"},
           {"llm:\n  embedding: last\n", "llm.embedding"},
           {"llm:\n  embedding: {pooling: max}\n", "llm.embedding.pooling"},
           {"llm:\n  embedding: {pooling: last, normalize: maybe}\n", "llm.embedding.normalize"},
           {"llm:\n  embedding: {pooling: last, dims: 3}\n", "llm.embedding.dims"},
           {"llm:\n  step_budget: 4\n", "llm.step_budget"}}) {
    auto config = Parse(yaml);
    ASSERT_FALSE(config.ok()) << yaml;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(key), std::string::npos) << config.status().message();
  }
}

}  // namespace
}  // namespace sluice::llm
