// The GGUF reader on files written here byte by byte: a valid one read back, and each kind of bad
// file refused with an error that names the problem.
#include "llm/files/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llm/llm_config.h"

namespace sluice::llm {
namespace {

// A GGUF file in memory: metadata and tensor descriptions, then aligned data.
class Writer {
 public:
  template <class T>
  void Put(std::vector<uint8_t>& out, T value) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
    out.insert(out.end(), bytes, bytes + sizeof value);
  }
  void PutString(std::vector<uint8_t>& out, const std::string& s) {
    Put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void String(const std::string& key, const std::string& value) {
    PutString(kv_, key);
    Put<uint32_t>(kv_, 8);
    PutString(kv_, value);
    ++kv_count_;
  }
  void U32(const std::string& key, uint32_t value) {
    PutString(kv_, key);
    Put<uint32_t>(kv_, 4);
    Put<uint32_t>(kv_, value);
    ++kv_count_;
  }
  void Bools(const std::string& key, const std::vector<bool>& values) {
    PutString(kv_, key);
    Put<uint32_t>(kv_, 9);  // An array ...
    Put<uint32_t>(kv_, 7);  // ... of bools.
    Put<uint64_t>(kv_, values.size());
    for (bool v : values) Put<uint8_t>(kv_, v ? 1 : 0);
    ++kv_count_;
  }
  void F32(const std::string& key, float value) {
    PutString(kv_, key);
    Put<uint32_t>(kv_, 6);
    Put<float>(kv_, value);
    ++kv_count_;
  }
  // A tensor of `type` with dims innermost first and `bytes` of data.
  void Tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims, size_t bytes) {
    PutString(tensors_, name);
    Put<uint32_t>(tensors_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) Put<uint64_t>(tensors_, d);
    Put<uint32_t>(tensors_, type);
    Put<uint64_t>(tensors_, data_.size());
    data_.resize(data_.size() + (bytes + 31) / 32 * 32, 0x3c);
    ++tensor_count_;
  }
  std::vector<uint8_t> Bytes(uint32_t magic = 0x46554747, uint32_t version = 3) {
    std::vector<uint8_t> out;
    Put<uint32_t>(out, magic);
    Put<uint32_t>(out, version);
    Put<uint64_t>(out, tensor_count_);
    Put<uint64_t>(out, kv_count_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), tensors_.begin(), tensors_.end());
    out.resize((out.size() + 31) / 32 * 32, 0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  std::vector<uint8_t> kv_, tensors_, data_;
  uint64_t kv_count_ = 0, tensor_count_ = 0;
};

std::string TempDir() {
  return (std::filesystem::temp_directory_path() / ("sluice_gguf_test_" + std::to_string(getpid())))
      .string();
}

std::string WriteFile(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string dir = TempDir();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

// A two-tensor llama file's header: the metadata ArchitectureFromGguf needs.
Writer Llama(const std::string& arch = "llama", uint32_t layers = 1) {
  Writer w;
  w.String("general.architecture", arch);
  w.U32(arch + ".embedding_length", 64);
  w.U32(arch + ".feed_forward_length", 128);
  w.U32(arch + ".block_count", layers);
  w.U32(arch + ".attention.head_count", 4);
  w.U32(arch + ".attention.head_count_kv", 2);
  w.F32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.Tensor("token_embd.weight", 8, {64, 10}, 10 * 2 * 34);  // Q8_0: 2 blocks a row.
  w.Tensor("output_norm.weight", 0, {64}, 64 * 4);
  return w;
}

class GgufTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { std::filesystem::remove_all(TempDir()); }
};

std::string ErrorOf(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto file = GgufFile::Open(WriteFile(bytes, name));
  EXPECT_FALSE(file.ok()) << name << " was accepted";
  return file.ok() ? "" : file.status().message();
}

TEST_F(GgufTest, ReadsMetadataTensorsAndArchitecture) {
  auto file = GgufFile::Open(WriteFile(Llama().Bytes(), "good.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ(*(*file)->String("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->Integer("llama.block_count"), 1);
  EXPECT_FALSE((*file)->Integer("general.architecture").ok());  // A string, not an integer.
  EXPECT_NE((*file)->Integer("no.such.key").status().message().find("no.such.key"),
            std::string::npos);
  const GgufTensor* embedding = (*file)->FindTensor("token_embd.weight");
  ASSERT_NE(embedding, nullptr);
  EXPECT_EQ(embedding->shape, (std::vector<int64_t>{10, 64}));  // Outermost first.
  EXPECT_EQ(embedding->bytes, 10u * 2 * 34);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(embedding->data) % 32, 0u);
  auto arch = ArchitectureFromGguf(**file);
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  EXPECT_EQ(arch->vocab_size, 10);
  EXPECT_EQ(arch->head_dim, 16);
  EXPECT_TRUE(arch->rope_interleaved);
  EXPECT_TRUE(arch->tie_word_embeddings);
}

TEST_F(GgufTest, BadFilesAreRefusedByName) {
  std::vector<uint8_t> good = Llama().Bytes();
  EXPECT_NE(ErrorOf(Llama().Bytes(0x46554746), "magic.gguf").find("magic"), std::string::npos);
  EXPECT_NE(ErrorOf(Llama().Bytes(0x46554747, 7), "version.gguf").find("version 7"),
            std::string::npos);
  // Cut inside the data: the last tensor runs past the end.
  std::vector<uint8_t> truncated(good.begin(), good.end() - 40);
  EXPECT_NE(ErrorOf(truncated, "truncated.gguf").find("truncated"), std::string::npos);
  // Cut inside the metadata.
  std::vector<uint8_t> header_only(good.begin(), good.begin() + 60);
  EXPECT_NE(ErrorOf(header_only, "header.gguf").find("past the end"), std::string::npos);
  // A type Sluice does not read (IQ2_XXS = 16) is named.
  Writer iq2 = Llama();
  iq2.Tensor("blk.0.attn_q.weight", 16, {256, 64}, 64 * 66);
  EXPECT_NE(ErrorOf(iq2.Bytes(), "type.gguf").find("IQ2_XXS"), std::string::npos);
  // Rows that are not whole blocks.
  Writer partial = Llama();
  partial.Tensor("blk.0.attn_k.weight", 12, {64, 32}, 4096);  // Q4_K rows of 256.
  EXPECT_NE(ErrorOf(partial.Bytes(), "blocks.gguf").find("whole"), std::string::npos);
  // Two entries for one key.
  Writer twice = Llama();
  twice.U32("llama.block_count", 2);
  EXPECT_NE(ErrorOf(twice.Bytes(), "twice.gguf").find("twice"), std::string::npos);
}

// A model split in three (as gguf-split writes it: the metadata in the first part, the split.*
// keys in each) opens from its first part with every part's tensors; a later part, a missing part
// and a part of another split are refused, naming the file. A folder holding the parts is one
// model, found by its first part.
TEST_F(GgufTest, SplitModelsOpenFromTheirFirstPart) {
  const std::string dir = TempDir() + "/split";
  std::filesystem::create_directories(dir);
  auto part = [](uint32_t number, uint32_t count, const std::string& tensor) {
    Writer w = number == 0 ? Llama() : Writer();
    w.U32("split.no", number);
    w.U32("split.count", count);
    w.U32("split.tensors.count", 5);
    w.Tensor(tensor, 0, {64}, 64 * 4);
    return w.Bytes();
  };
  WriteFile(part(0, 3, "blk.0.attn_norm.weight"), "split/m-00001-of-00003.gguf");
  WriteFile(part(1, 3, "blk.0.ffn_norm.weight"), "split/m-00002-of-00003.gguf");
  WriteFile(part(2, 3, "blk.1.attn_norm.weight"), "split/m-00003-of-00003.gguf");
  auto file = GgufFile::Open(dir + "/m-00001-of-00003.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->tensors().size(), 5u);
  ASSERT_NE((*file)->FindTensor("blk.1.attn_norm.weight"), nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>((*file)->FindTensor("blk.1.attn_norm.weight")->data)[0],
            0x3c);
  EXPECT_EQ((*file)->part_paths().size(), 3u);
  EXPECT_EQ(*(*file)->String("general.architecture"), "llama");
  auto found = FindGgufFile(dir);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, dir + "/m-00001-of-00003.gguf");

  auto later = GgufFile::Open(dir + "/m-00002-of-00003.gguf");
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.status().message().find("open its first part, " + dir + "/m-00001-of-00003.gguf"),
            std::string::npos)
      << later.status().message();
  std::filesystem::remove(dir + "/m-00003-of-00003.gguf");
  auto missing = GgufFile::Open(dir + "/m-00001-of-00003.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("part 3 of 3"), std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("m-00003-of-00003.gguf"), std::string::npos);
  WriteFile(part(1, 3, "blk.1.attn_norm.weight"), "split/m-00003-of-00003.gguf");
  auto foreign = GgufFile::Open(dir + "/m-00001-of-00003.gguf");
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("not part 3 of 3"), std::string::npos)
      << foreign.status().message();
}

// gemma3's sliding-window layers as llama.cpp reads them: a period (default 6, its last layer
// global), or one flag per layer; a list of the wrong length is refused by its key.
TEST_F(GgufTest, Gemma3SlidingWindowLayers) {
  auto read = [](Writer w, const std::string& name) {
    auto file = GgufFile::Open(WriteFile(w.Bytes(), name));
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return file.ok() ? ArchitectureFromGguf(**file) : Result<ModelArchitecture>(file.status());
  };
  Writer none = Llama("gemma3", 7);  // No window: every layer global.
  auto global = read(none, "gemma_none.gguf");
  ASSERT_TRUE(global.ok()) << global.status().ToString();
  EXPECT_TRUE(global->local_layers.empty());
  EXPECT_TRUE(global->scale_embedding && global->post_norms && global->qk_norm);
  EXPECT_EQ(global->activation, GateActivation::kGeluTanh);
  EXPECT_FALSE(global->rope_interleaved);
  EXPECT_DOUBLE_EQ(global->attention_scale, 0.25);  // 1 / sqrt(head size 16).

  Writer period = Llama("gemma3", 7);
  period.U32("gemma3.attention.sliding_window", 512);
  period.F32("gemma3.rope.freq_base_swa", 20000.0f);
  auto six = read(period, "gemma_period.gguf");
  ASSERT_TRUE(six.ok()) << six.status().ToString();
  EXPECT_EQ(six->sliding_window, 512);
  EXPECT_EQ(six->local_layers, (std::vector<bool>{true, true, true, true, true, false, true}));
  EXPECT_DOUBLE_EQ(six->rope_theta_local, 20000.0);

  Writer flags = Llama("gemma3", 3);
  flags.U32("gemma3.attention.sliding_window", 4);
  flags.Bools("gemma3.attention.sliding_window_pattern", {false, true, false});
  auto listed = read(flags, "gemma_flags.gguf");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->local_layers, (std::vector<bool>{false, true, false}));

  Writer short_list = Llama("gemma3", 3);
  short_list.U32("gemma3.attention.sliding_window", 4);
  short_list.Bools("gemma3.attention.sliding_window_pattern", {true, false});
  auto refused = read(short_list, "gemma_short.gguf");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sliding_window_pattern"), std::string::npos);
}

// qwen3moe's experts as llama.cpp's converter writes them; missing or inconsistent counts and
// shared experts are refused by their keys.
TEST_F(GgufTest, MixtureOfExpertsMetadata) {
  auto read = [](Writer w, const std::string& name) {
    auto file = GgufFile::Open(WriteFile(w.Bytes(), name));
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return file.ok() ? ArchitectureFromGguf(**file) : Result<ModelArchitecture>(file.status());
  };
  Writer moe = Llama("qwen3moe");
  moe.U32("qwen3moe.expert_count", 8);
  moe.U32("qwen3moe.expert_used_count", 2);
  moe.U32("qwen3moe.expert_feed_forward_length", 32);
  auto arch = read(moe, "moe.gguf");
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  EXPECT_EQ(arch->experts, 8);
  EXPECT_EQ(arch->experts_used, 2);
  EXPECT_EQ(arch->expert_intermediate_size, 32);
  EXPECT_TRUE(arch->expert_weights_norm && arch->qk_norm);

  Writer old = Llama("qwen3moe");  // No width of its own: feed_forward_length / used, as llama.cpp.
  old.U32("qwen3moe.expert_count", 8);
  old.U32("qwen3moe.expert_used_count", 2);
  auto derived = read(old, "moe_old.gguf");
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  EXPECT_EQ(derived->expert_intermediate_size, 64);

  Writer dense = Llama("llama");
  auto none = read(dense, "dense.gguf");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->experts, 0);

  auto refused = [&](Writer w, const std::string& name, const std::string& key) {
    auto result = read(std::move(w), name);
    ASSERT_FALSE(result.ok()) << name;
    EXPECT_NE(result.status().message().find(key), std::string::npos) << result.status().message();
  };
  Writer missing = Llama("qwen3moe");
  missing.U32("qwen3moe.expert_count", 8);
  refused(missing, "moe_missing.gguf", "qwen3moe.expert_used_count");
  Writer too_many = Llama("qwen3moe");
  too_many.U32("qwen3moe.expert_count", 8);
  too_many.U32("qwen3moe.expert_used_count", 9);
  refused(too_many, "moe_many.gguf", "qwen3moe.expert_used_count");
  Writer shared = moe;
  shared.U32("qwen3moe.expert_shared_count", 1);
  refused(shared, "moe_shared.gguf", "qwen3moe.expert_shared_count");
}

// gpt-oss: its file says the window, not the pattern (even layers windowed, as llama.cpp's graph
// has it), nor its block's constants (sinks, biases, the clamped SwiGLU).
TEST_F(GgufTest, GptOssBlock) {
  Writer w = Llama("gpt-oss", 4);
  w.U32("gpt-oss.expert_count", 4);
  w.U32("gpt-oss.expert_used_count", 2);
  w.U32("gpt-oss.attention.sliding_window", 128);
  auto file = GgufFile::Open(WriteFile(w.Bytes(), "gpt_oss.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto arch = ArchitectureFromGguf(**file);
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  EXPECT_EQ(arch->local_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(arch->sliding_window, 128);
  EXPECT_EQ(arch->rope_theta_local, 0);
  EXPECT_TRUE(arch->attention_sinks && arch->attention_bias && arch->attention_out_bias &&
              arch->expert_biases && arch->expert_weights_norm);
  EXPECT_EQ(arch->activation, GateActivation::kSwigluClamped);
  EXPECT_DOUBLE_EQ(arch->swiglu_alpha, 1.702);
  EXPECT_DOUBLE_EQ(arch->swiglu_limit, 7.0);
  EXPECT_FALSE(arch->rope_interleaved);

  Writer dense = Llama("gpt-oss", 2);  // No experts: not a gpt-oss file.
  auto dense_file = GgufFile::Open(WriteFile(dense.Bytes(), "gpt_oss_dense.gguf"));
  ASSERT_TRUE(dense_file.ok());
  auto refused = ArchitectureFromGguf(**dense_file);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("gpt-oss.expert_count"), std::string::npos)
      << refused.status().message();
}

TEST_F(GgufTest, UnknownArchitectureAndInconsistentShapesAreRefused) {
  auto gemma = GgufFile::Open(WriteFile(Llama("gemma2").Bytes(), "gemma.gguf"));
  ASSERT_TRUE(gemma.ok());
  auto arch = ArchitectureFromGguf(**gemma);
  ASSERT_FALSE(arch.ok());
  EXPECT_NE(arch.status().message().find("'gemma2'"), std::string::npos);

  Writer wrong;  // An embedding of width 32 in a model of width 64.
  wrong.String("general.architecture", "qwen2");
  wrong.U32("qwen2.embedding_length", 64);
  wrong.U32("qwen2.feed_forward_length", 128);
  wrong.U32("qwen2.block_count", 1);
  wrong.U32("qwen2.attention.head_count", 4);
  wrong.F32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  wrong.Tensor("token_embd.weight", 0, {32, 10}, 32 * 10 * 4);
  auto file = GgufFile::Open(WriteFile(wrong.Bytes(), "shape.gguf"));
  ASSERT_TRUE(file.ok());
  auto shape = ArchitectureFromGguf(**file);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("token_embd.weight"), std::string::npos);
}

}  // namespace
}  // namespace sluice::llm
