// The Llama decoder against transformers' LlamaForCausalLM on the same tiny weights
// (tools/llm_export.py --test writes them with reference logits and greedy continuations).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>

#include "llm/files/gguf.h"
#include "llm/files/safetensors.h"
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"
#include "llm/llama/weights.h"
#include "llm/llm_config.h"
#include "llm/precision_agreement.h"
#include "llm/step_model.h"
#include "llm/step_model_testing.h"

namespace sluice::llm {
namespace {

std::string ModelDir(const std::string& name) {
  return std::string(SLUICE_TEST_MODELS) + "/" + name;
}

struct Reference {
  std::vector<int32_t> input_ids;
  std::vector<float> logits;  // [tokens, vocab]
  std::vector<int32_t> greedy;
};

std::vector<Reference> ReadReference(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/reference.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  std::vector<Reference> references;
  for (int i = 0;; ++i) {
    const SafetensorsEntry* ids = (*file)->Find("input_ids_" + std::to_string(i));
    if (ids == nullptr) break;
    const SafetensorsEntry* logits = (*file)->Find("logits_" + std::to_string(i));
    const SafetensorsEntry* greedy = (*file)->Find("greedy_" + std::to_string(i));
    EXPECT_EQ(ids->dtype, "I64");
    EXPECT_EQ(logits->dtype, "F32");
    Reference r;
    const auto* id_data = static_cast<const int64_t*>(ids->data);
    r.input_ids.assign(id_data, id_data + ids->bytes / 8);
    const auto* logit_data = static_cast<const float*>(logits->data);
    r.logits.assign(logit_data, logit_data + logits->bytes / 4);
    const auto* greedy_data = static_cast<const int64_t*>(greedy->data);
    r.greedy.assign(greedy_data, greedy_data + greedy->bytes / 8);
    references.push_back(std::move(r));
  }
  EXPECT_GE(references.size(), 3u);
  return references;
}

std::unique_ptr<StepModel> Load(const std::string& name, LlmPrecision precision, int slots = 8,
                                int threads = 1) {
  ModelLoadOptions options;
  options.dir = ModelDir(name);
  options.serve.precision = precision;
  options.serve.slots = slots;
  options.serve.context_length = 256;
  options.serve.threads = threads;
  auto model = LoadLlamaModel(options);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(*model) : nullptr;
}

int Argmax(const float* row, int n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

// Prefills `prompt` in chunks of `chunk` tokens on `slot`, then decodes `steps` greedy tokens.
std::vector<int32_t> Greedy(StepModel& model, int slot, const std::vector<int32_t>& prompt,
                            int steps, size_t chunk) {
  const int vocab = model.architecture().vocab_size;
  std::vector<float> logits;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    SequenceChunk c;
    c.slot = slot;
    c.start = static_cast<int>(begin);
    c.tokens.assign(prompt.begin() + static_cast<long>(begin),
                    prompt.begin() + static_cast<long>(std::min(prompt.size(), begin + chunk)));
    logits.clear();
    EXPECT_TRUE(model.Run({c}, &logits).ok());
  }
  std::vector<int32_t> out;
  int position = static_cast<int>(prompt.size());
  for (int i = 0; i < steps; ++i) {
    const int next = Argmax(logits.data(), vocab);
    out.push_back(next);
    SequenceChunk c{slot, position++, {next}, false, {}};
    logits.clear();
    EXPECT_TRUE(model.Run({c}, &logits).ok());
  }
  return out;
}

class LlamaModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaModelTest, Fp32LogitsEqualTransformers) {
  auto model = Load(GetParam(), LlmPrecision::kFp32);
  ASSERT_NE(model, nullptr);
  const int vocab = model->architecture().vocab_size;
  float worst_of_all = 0;
  for (const Reference& r : ReadReference(ModelDir(GetParam()))) {
    std::vector<float> logits;
    ASSERT_TRUE(model->Run({SequenceChunk{0, 0, r.input_ids, true, {}}}, &logits).ok());
    ASSERT_EQ(logits.size(), r.input_ids.size() * static_cast<size_t>(vocab));
    float worst = 0;
    for (size_t i = 0; i < logits.size(); ++i)
      worst = std::max(worst, std::abs(logits[i] - r.logits[i]));
    EXPECT_LE(worst, 1e-4) << "prompt of " << r.input_ids.size() << " tokens";
    worst_of_all = std::max(worst_of_all, worst);
  }
  std::printf("%s: fp32 logits against transformers, max |difference| %.1e\n",
              std::string(GetParam()).c_str(), worst_of_all);
}

TEST_P(LlamaModelTest, IncrementalDecodingEqualsFullForward) {
  auto model = Load(GetParam(), LlmPrecision::kFp32);
  ASSERT_NE(model, nullptr);
  const int vocab = model->architecture().vocab_size;
  for (const Reference& r : ReadReference(ModelDir(GetParam()))) {
    // Chunks of 5, then each remaining token alone: every row's logits equal the full forward's.
    const size_t n = r.input_ids.size();
    float worst = 0;
    for (size_t begin = 0; begin < n;) {
      const size_t len = begin < n / 2 ? std::min<size_t>(5, n / 2 - begin) : 1;
      SequenceChunk c{3, static_cast<int>(begin), {}, false, {}};
      c.tokens.assign(r.input_ids.begin() + static_cast<long>(begin),
                      r.input_ids.begin() + static_cast<long>(begin + len));
      std::vector<float> logits;
      ASSERT_TRUE(model->Run({c}, &logits).ok());
      const float* expected = r.logits.data() + (begin + len - 1) * static_cast<size_t>(vocab);
      for (int v = 0; v < vocab; ++v)
        worst = std::max(worst, std::abs(logits[static_cast<size_t>(v)] - expected[v]));
      begin += len;
    }
    EXPECT_LE(worst, 1e-4);
  }
}

// With bf16 and int8 weights (Sluice's own products) and two threads, a prompt's rows run as one
// chunk (more than one block of 16 rows, which the threads lay out for the products together) give
// the logits the same tokens give one at a time, to the bit: each row's result is computed the same
// way whatever the rows beside it. (fp32 goes through ATen's products, to within 1e-4: above.)
TEST_P(LlamaModelTest, PromptRowsEqualOneAtATimeWithBf16AndInt8Weights) {
  std::vector<int32_t> prompt;
  for (const Reference& r : ReadReference(ModelDir(GetParam()))) {
    prompt.insert(prompt.end(), r.input_ids.begin(), r.input_ids.end());
  }
  while (prompt.size() < 50) prompt.insert(prompt.end(), prompt.begin(), prompt.end());
  prompt.resize(50);
  for (LlmPrecision precision : {LlmPrecision::kBf16, LlmPrecision::kInt8}) {
    auto model = Load(GetParam(), precision, 8, /*threads=*/2);
    ASSERT_NE(model, nullptr);
    const auto vocab = static_cast<size_t>(model->architecture().vocab_size);
    std::vector<float> whole;
    ASSERT_TRUE(model->Run({SequenceChunk{2, 0, prompt, true, {}}}, &whole).ok());
    ASSERT_EQ(whole.size(), prompt.size() * vocab);
    for (size_t i = 0; i < prompt.size(); ++i) {
      std::vector<float> one;
      ASSERT_TRUE(
          model->Run({SequenceChunk{5, static_cast<int>(i), {prompt[i]}, false, {}}}, &one).ok());
      ASSERT_EQ(one.size(), vocab);
      for (size_t v = 0; v < vocab; ++v) {
        ASSERT_EQ(one[v], whole[i * vocab + v])
            << "token " << i << " logit " << v << " precision " << LlmPrecisionName(precision);
      }
    }
  }
}

TEST_P(LlamaModelTest, GreedyContinuationEqualsTransformers) {
  auto model = Load(GetParam(), LlmPrecision::kFp32);
  ASSERT_NE(model, nullptr);
  for (const Reference& r : ReadReference(ModelDir(GetParam()))) {
    EXPECT_EQ(Greedy(*model, 1, r.input_ids, static_cast<int>(r.greedy.size()), 7), r.greedy);
  }
}

// A request's greedy output is the same alone and decoded in one batch with 7 others, whatever
// slots they take and however their prompts are chunked.
TEST_P(LlamaModelTest, BatchInvariance) {
  for (LlmPrecision precision : {LlmPrecision::kFp32, LlmPrecision::kBf16, LlmPrecision::kInt8}) {
    auto model = Load(GetParam(), precision);
    ASSERT_NE(model, nullptr);
    const int vocab = model->architecture().vocab_size;
    std::vector<std::vector<int32_t>> prompts;
    for (const Reference& r : ReadReference(ModelDir(GetParam()))) prompts.push_back(r.input_ids);
    while (prompts.size() < 8) {  // Variations of different lengths.
      std::vector<int32_t> p = prompts[prompts.size() % 3];
      p.resize(p.size() - prompts.size() % 3);
      p.push_back(static_cast<int32_t>(prompts.size() * 7 % vocab));
      prompts.push_back(p);
    }
    const int steps = 12;
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) alone.push_back(Greedy(*model, 0, p, steps, 4));

    // Together: slot i = 7 - i, each prefilled whole, then all decode as one batch per step.
    const int n = static_cast<int>(prompts.size());
    std::vector<std::vector<int32_t>> together(static_cast<size_t>(n));
    std::vector<int> next(static_cast<size_t>(n)), position(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      std::vector<float> logits;
      ASSERT_TRUE(
          model->Run({SequenceChunk{7 - i, 0, prompts[static_cast<size_t>(i)], false, {}}}, &logits)
              .ok());
      next[static_cast<size_t>(i)] = Argmax(logits.data(), vocab);
      position[static_cast<size_t>(i)] = static_cast<int>(prompts[static_cast<size_t>(i)].size());
    }
    for (int s = 0; s < steps; ++s) {
      std::vector<SequenceChunk> chunks;
      for (int i = 0; i < n; ++i) {
        together[static_cast<size_t>(i)].push_back(next[static_cast<size_t>(i)]);
        chunks.push_back(SequenceChunk{
            7 - i, position[static_cast<size_t>(i)]++, {next[static_cast<size_t>(i)]}, false, {}});
      }
      std::vector<float> logits;
      ASSERT_TRUE(model->Run(chunks, &logits).ok());
      for (int i = 0; i < n; ++i)
        next[static_cast<size_t>(i)] =
            Argmax(logits.data() + static_cast<size_t>(i) * vocab, vocab);
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(together[static_cast<size_t>(i)], alone[static_cast<size_t>(i)])
          << "prompt " << i << " precision " << LlmPrecisionName(precision);
    }
  }
}

// The precision comparison behind `sluice bench --llm --in-process --agreement`: a model against
// itself agrees exactly; int8 against fp32 stays close, and its free-running completions follow
// its own choices (so they can only be identical where every teacher-forced choice agreed).
TEST_P(LlamaModelTest, PrecisionAgreementComparesLogitsAndGreedyChoices) {
  std::vector<std::vector<int32_t>> prompts;
  for (const Reference& r : ReadReference(ModelDir(GetParam()))) prompts.push_back(r.input_ids);
  auto reference = Load(GetParam(), LlmPrecision::kFp32, 1);
  auto same = Load(GetParam(), LlmPrecision::kFp32, 2);
  auto quantised = Load(GetParam(), LlmPrecision::kInt8, 2);
  ASSERT_TRUE(reference && same && quantised);
  auto exact = ComparePrecisions(*reference, *same, prompts, 12);
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_EQ(exact->prompts, static_cast<int>(prompts.size()));
  EXPECT_EQ(exact->positions, exact->prompts * 12);
  EXPECT_EQ(exact->same_next_token, exact->positions);
  EXPECT_NEAR(exact->min_cosine, 1.0, 1e-9);
  EXPECT_EQ(exact->identical_completions, exact->prompts);
  EXPECT_DOUBLE_EQ(exact->mean_common_prefix, 12.0);

  auto int8 = ComparePrecisions(*reference, *quantised, prompts, 12);
  ASSERT_TRUE(int8.ok()) << int8.status().ToString();
  EXPECT_GT(int8->mean_cosine, 0.99);
  EXPECT_LE(int8->min_cosine, int8->mean_cosine);
  EXPECT_LE(int8->identical_completions, int8->prompts);
  EXPECT_LE(int8->mean_common_prefix, 12.0);
  // Too long for the context: a clear error, nothing compared.
  auto too_long = ComparePrecisions(*reference, *same, {std::vector<int32_t>(250, 1)}, 12);
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
}

// The same sequence through its slot's static blocks, through a table of scattered blocks (every
// other one, in reverse, after another sequence left stale rows in them), through consecutive
// blocks across two slots' ranges, through a table whose first blocks another sequence filled (a
// shared prefix, only read), and through those blocks copied: the same logits, bit for bit.
TEST_P(LlamaModelTest, PagedBlocksGiveTheStaticCachesLogitsToTheBit) {
  for (LlmPrecision precision : {LlmPrecision::kFp32, LlmPrecision::kBf16}) {
    auto model = Load(GetParam(), precision, 2, /*threads=*/2);
    ASSERT_NE(model, nullptr);
    ASSERT_EQ(model->kv_block_size(), 16);
    ASSERT_EQ(model->kv_blocks(), 32);  // 2 slots x 256 / 16.
    std::vector<int32_t> prompt, other;
    for (int i = 0; i < 50; ++i) {
      prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 300));
      other.push_back(static_cast<int32_t>((i * 53 + 5) % 300));
    }
    const std::vector<float> reference = testing::PagedRun(*model, 0, {}, prompt, 0, 20);
    testing::PagedRun(*model, 1, {}, other, 0, 40);  // Stale rows in blocks 16-31.
    std::vector<int32_t> scattered;
    for (int b = 31; b >= 1; b -= 2) scattered.push_back(b);
    EXPECT_EQ(testing::PagedRun(*model, 0, scattered, prompt, 0, 20), reference)
        << LlmPrecisionName(precision);
    std::vector<int32_t> consecutive(16);
    std::iota(consecutive.begin(), consecutive.end(), 8);
    EXPECT_EQ(testing::PagedRun(*model, 0, consecutive, prompt, 0, 20), reference);
    // The first three blocks (48 tokens) of `scattered` hold the prompt's start: a newcomer with
    // the same prompt takes them and runs only its last 2 tokens, then decodes.
    std::vector<int32_t> shared = {31, 29, 27};
    for (int b = 0; b < 13; ++b) shared.push_back(2 * b);
    const std::vector<float> tail = testing::PagedRun(*model, 0, shared, prompt, 48, 20);
    const auto vocab = static_cast<size_t>(model->architecture().vocab_size);
    ASSERT_EQ(tail.size(), (2 + 20) * vocab);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), reference.end() - tail.size()));
    // The same three blocks copied into a consecutive run of its own (blocks 8-10 of 8-23).
    ASSERT_TRUE(model->CopyBlocks({{31, 8}, {29, 9}, {27, 10}}).ok());
    EXPECT_EQ(testing::PagedRun(*model, 0, consecutive, prompt, 48, 20), tail);
    EXPECT_FALSE(model->CopyBlocks({{3, 3}}).ok());
    EXPECT_FALSE(model->CopyBlocks({{0, 32}}).ok());
  }
}

// tiny_llm's heads are 16 wide: no whole block of 32 for q8_0's scales.
TEST(LlamaModelLoadTest, Q8CacheNeedsWholeBlocksOfAHead) {
  ModelLoadOptions options;
  options.dir = ModelDir("tiny_llm");
  options.serve.kv_cache_dtype = KvCacheDtype::kQ8_0;
  options.serve.context_length = 256;
  auto model = LoadLlamaModel(options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("kv_cache_dtype q8_0 needs a head size"),
            std::string::npos)
      << model.status().ToString();
}

// tiny_llm_sharded: tiny_llm saved as a sharded checkpoint (model.safetensors.index.json);
// hf_<family>[_sharded]: a random model of each family from transformers' own class, whole and
// sharded, and of two mixtures of experts (tools/converted_models.py).
// Under the sanitizers the families' sharded copies are left out: they load through the same
// shard reader as tiny_llm_sharded, into the same steps as the whole ones.
std::vector<std::string> TinyModelDirs() {
  std::vector<std::string> dirs = {"tiny_llm", "tiny_llm_scaled", "converted/tiny_llm_sharded"};
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"}) {
    dirs.push_back(std::string("converted/hf_") + family);
#if !defined(__SANITIZE_ADDRESS__)
    dirs.push_back(std::string("converted/hf_") + family + "_sharded");
#endif
  }
  // Mixtures of experts (model_type qwen3_moe, mixtral and gpt_oss), whole.
  for (const char* family : {"qwen3moe", "mixtral", "gpt_oss"}) {
    dirs.push_back(std::string("converted/hf_") + family);
  }
  return dirs;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, LlamaModelTest, ::testing::ValuesIn(TinyModelDirs()),
                         [](const auto& info) {
                           const std::string dir = info.param;
                           return dir.substr(dir.rfind('/') + 1);
                         });

// A sharded checkpoint whose index names a shard that is not there, or a tensor its shard lacks:
// an error naming the file.
TEST(LlamaModelLoadTest, AShardedCheckpointsMissingPartIsNamed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sluice_sharded_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(ModelDir("converted/tiny_llm_sharded"), dir);
  ModelLoadOptions options;
  options.dir = dir.string();
  options.serve.context_length = 256;
  ASSERT_TRUE(LoadLlamaModel(options).ok());
  fs::remove(dir / "model-00003-of-00011.safetensors");
  auto missing = LoadLlamaModel(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model-00003-of-00011.safetensors"), std::string::npos)
      << missing.status().ToString();
  fs::remove_all(dir);
}

// gpt-oss as released (converted/hf_gpt_oss_mxfp4: MXFP4 experts as OCP MX blocks and scales in
// safetensors) and the GGUF file llama.cpp's converter writes from it: every expert's gate, up and
// down parts are MXFP4 with the same bytes (repacked alike) and the same biases. (Their logits
// are not compared to each other: llama.cpp truncates YaRN's correction range and transformers'
// gpt-oss does not, so each is checked against its own engine, by GgufModelTest.)
TEST(LlamaModelLoadTest, ReleasedGptOssExpertsAreTheConvertedFilesBlocks) {
  const std::string folder = ModelDir("converted/hf_gpt_oss_mxfp4");
  auto checkpoint = SafetensorsFile::OpenCheckpoint(folder);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  auto hf_arch = ParseArchitecture(folder + "/config.json");
  ASSERT_TRUE(hf_arch.ok()) << hf_arch.status().ToString();
  llama::Weights hf;
  Status loaded = llama::LoadSafetensorsWeights(**checkpoint, *hf_arch, LlmPrecision::kFp32, &hf);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  auto file = GgufFile::Open(ModelDir("converted/gguf_gpt_oss_mxfp4_hf") + "/model.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto gguf_arch = ArchitectureFromGguf(**file);
  ASSERT_TRUE(gguf_arch.ok()) << gguf_arch.status().ToString();
  llama::Weights gguf;
  loaded = llama::LoadGgufWeights(**file, *gguf_arch, LlmPrecision::kFp32, nullptr, &gguf);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  ASSERT_EQ(hf.layers.size(), gguf.layers.size());
  int parts = 0;
  for (size_t l = 0; l < hf.layers.size(); ++l) {
    ASSERT_EQ(hf.layers[l].experts.size(), gguf.layers[l].experts.size());
    for (size_t e = 0; e < hf.layers[l].experts.size(); ++e) {
      const auto& ours = hf.layers[l].experts[e];
      const auto& theirs = gguf.layers[l].experts[e];
      for (auto [a, b] :
           {std::pair{&ours.gate_up, &theirs.gate_up}, std::pair{&ours.down, &theirs.down}}) {
        ASSERT_EQ(a->parts.size(), b->parts.size());
        ASSERT_EQ(a->in, b->in);
        for (size_t p = 0; p < a->parts.size(); ++p) {
          const llama::Linear::Part& x = a->parts[p];
          const llama::Linear::Part& y = b->parts[p];
          ASSERT_EQ(x.type, static_cast<uint32_t>(GgmlType::kMXFP4));
          ASSERT_EQ(x.type, y.type);
          ASSERT_EQ(x.rows, y.rows);
          ASSERT_EQ(x.repacked, y.repacked);
          const auto bytes = static_cast<size_t>(x.rows * QuantRowBytes(x.type, a->in));
          EXPECT_EQ(std::memcmp(x.blocks, y.blocks, bytes), 0)
              << "layer " << l << " expert " << e << " part " << p;
          ++parts;
        }
        EXPECT_TRUE(at::equal(a->bias, b->bias)) << "layer " << l << " expert " << e;
      }
    }
  }
  EXPECT_EQ(parts, 2 * 4 * 3);  // 2 layers, 4 experts: gate, up, down.
}

// A gpt-oss folder quantised otherwise than the released checkpoints (MXFP4 experts, which
// gguf_model_test's ReleasedGptOssTest loads) is refused naming the key and what it holds; and
// transformers' YaRN without truncation is read as such (the folder's logits against
// transformers' are LlamaModelTest's).
TEST(LlamaModelLoadTest, GptOssOtherQuantizationsAreNamed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sluice_gpt_oss_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(ModelDir("converted/hf_gpt_oss"), dir);
  auto arch = ParseArchitecture((dir / "config.json").string());
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  EXPECT_FALSE(arch->rope_yarn_truncate);
  EXPECT_EQ(arch->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(arch->local_layers, (std::vector<bool>{true, false}));
  std::string config;
  {
    std::ifstream in(dir / "config.json");
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t brace = config.rfind('}');
  ASSERT_NE(brace, std::string::npos);
  config.insert(brace, R"(, "quantization_config": {"quant_method": "fp8"})");
  std::ofstream(dir / "config.json") << config;
  ModelLoadOptions options;
  options.dir = dir.string();
  options.serve.context_length = 256;
  auto model = LoadLlamaModel(options);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("'quantization_config' is 'fp8'"), std::string::npos)
      << model.status().ToString();
  EXPECT_NE(model.status().message().find("MXFP4 experts"), std::string::npos);
  fs::remove_all(dir);
}

TEST(LlamaModelLoadTest, ErrorsNameTheProblem) {
  ModelLoadOptions options;
  options.dir = ModelDir("no_such_model");
  auto missing = LoadLlamaModel(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos);

  options.dir = ModelDir("tiny_llm");
  options.serve.context_length = 100000;
  auto too_long = LoadLlamaModel(options);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("max_position_embeddings"), std::string::npos);

  options.serve.context_length = 256;
  options.serve.kv_cache_bytes = 1000;  // Less than one sequence of the context.
  auto small = LoadLlamaModel(options);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("kv_cache_bytes"), std::string::npos);
}

TEST(LlamaModelLoadTest, RejectsBadSteps) {
  auto model = Load("tiny_llm", LlmPrecision::kFp32, 2);
  ASSERT_NE(model, nullptr);
  std::vector<float> logits;
  EXPECT_FALSE(model->Run({SequenceChunk{2, 0, {1}, false, {}}}, &logits).ok());  // No slot 2.
  EXPECT_FALSE(
      model->Run({SequenceChunk{0, 255, {1, 2}, false, {}}}, &logits).ok());  // Past context.
  EXPECT_FALSE(model->Run({SequenceChunk{0, 0, {100000}, false, {}}}, &logits).ok());  // Bad token.
  EXPECT_FALSE(
      model
          ->Run({SequenceChunk{0, 0, {1}, false, {}}, SequenceChunk{0, 1, {1}, false, {}}}, &logits)
          .ok());
  // Tables: too short for the chunk, a block out of the pool, one block written by two chunks.
  EXPECT_FALSE(model->Run({SequenceChunk{0, 16, {1}, false, {3}}}, &logits).ok());
  EXPECT_FALSE(model->Run({SequenceChunk{0, 0, {1}, false, {32}}}, &logits).ok());
  EXPECT_FALSE(
      model
          ->Run({SequenceChunk{0, 0, {1}, false, {5}}, SequenceChunk{1, 3, {1}, false, {5}}},
                &logits)
          .ok());
  EXPECT_TRUE(logits.empty());
  // Two chunks may read the same block, each writing its own.
  EXPECT_TRUE(model
                  ->Run({SequenceChunk{0, 16, {1}, false, {5, 6}},
                         SequenceChunk{1, 16, {1}, false, {5, 7}}},
                        &logits)
                  .ok());
}

}  // namespace
}  // namespace sluice::llm
