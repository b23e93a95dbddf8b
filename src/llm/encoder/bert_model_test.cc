// BERT, RoBERTa, DistilBERT, XLM-RoBERTa and nomic-bert encoders against sentence-transformers
// (tools/encoder_models.py wrote the models and its vectors and scores; llama.cpp's embeddings of
// the nomic-bert file agree with them to cosine 1.0000000): embedding models with mean pooling +
// Normalize and with CLS pooling, as sentence-transformers saves them and as llama.cpp's
// converter writes them; cross-encoders' scores as transformers computes them (BERT's GGUF file
// without the pooler its converter drops; RoBERTa's and XLM-RoBERTa's head, bge-reranker's, whole
// in both; DistilBERT's, ReLU after pre_classifier, from its folder).
// Inputs go through the generation service, batched together as a client's list is.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "llm/encoder/encoder_config.h"
#include "llm/generation_service.h"
#include "llm/load_llm.h"

namespace sluice::llm {
namespace {

std::string Dir(const std::string& name) {
  return std::string(SLUICE_TEST_MODELS) + "/encoders/" + name;
}

std::shared_ptr<LlmEngine> Load(const std::string& name, const std::string& precision = "fp32") {
  LlmLoadOverrides overrides;
  overrides.precision = precision;
  overrides.threads = 2;
  auto engine = LoadLlmEngine(Dir(name), overrides);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? *engine : nullptr;
}

Result<Embeddings> Embed(const std::shared_ptr<LlmEngine>& engine,
                         const std::vector<EmbeddingInput>& inputs) {
  GenerationService service({{"m", engine}});
  std::promise<Result<Embeddings>> promise;
  auto run = service.Embed(
      engine, inputs, [&](Result<Embeddings> result) { promise.set_value(std::move(result)); });
  return promise.get_future().get();
}

struct Reference {
  std::vector<std::string> texts;
  std::vector<std::vector<double>> vectors;
};

Reference ReadReference(const std::string& name) {
  simdjson::dom::parser parser;
  simdjson::dom::element root = parser.load(Dir(name) + "/reference.json");
  Reference reference;
  for (auto text : root["texts"].get_array()) {
    reference.texts.emplace_back(std::string_view(text));
  }
  for (auto row : root["embeddings"].get_array()) {
    std::vector<double> vector;
    for (auto v : row.get_array()) vector.push_back(double(v));
    reference.vectors.push_back(std::move(vector));
  }
  return reference;
}

double Cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += b[i] * b[i];
  }
  return dot / std::sqrt(na * nb);
}

struct EmbedderCase {
  std::string model;
  bool normalized;  // Unit vectors: sentence-transformers' Normalize, or llama.cpp's default.
  bool same_scale;  // The reference's own vectors (not renormalised).
};

void PrintTo(const EmbedderCase& c, std::ostream* os) { *os << c.model; }

class EmbedderTest : public ::testing::TestWithParam<EmbedderCase> {};

TEST_P(EmbedderTest, VectorsEqualSentenceTransformers) {
  const EmbedderCase& c = GetParam();
  auto engine = Load(c.model);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->model().whole_sequences());
  const Reference reference = ReadReference(c.model);
  std::vector<EmbeddingInput> inputs;
  for (const std::string& text : reference.texts) inputs.push_back({text, {}, false});
  auto result = Embed(engine, inputs);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_EQ(result->vectors.size(), reference.vectors.size());
  for (size_t i = 0; i < reference.vectors.size(); ++i) {
    const std::vector<float>& got = result->vectors[i];
    ASSERT_EQ(got.size(), reference.vectors[i].size());
    EXPECT_GE(Cosine(got, reference.vectors[i]), 0.99999) << reference.texts[i];
    double norm = 0, max_error = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      norm += static_cast<double>(got[j]) * got[j];
      max_error = std::max(max_error, std::abs(got[j] - reference.vectors[i][j]));
    }
    if (c.normalized) {
      EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5) << reference.texts[i];
    }
    if (c.same_scale) {
      EXPECT_LT(max_error, 1e-5) << reference.texts[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Encoders, EmbedderTest,
                         ::testing::Values(EmbedderCase{"hf_bert_mean", true, true},
                                           EmbedderCase{"hf_bert_cls", false, true},
                                           EmbedderCase{"gguf_bert_mean_f32", true, true},
                                           EmbedderCase{"gguf_bert_cls_f32", true, false},
                                           EmbedderCase{"hf_xlmr_mean", true, true},
                                           EmbedderCase{"gguf_xlmr_mean_f32", true, true},
                                           EmbedderCase{"hf_xlmr_model_only", true, true},
                                           EmbedderCase{"hf_roberta_mean", true, true},
                                           EmbedderCase{"gguf_roberta_mean_f32", true, true},
                                           EmbedderCase{"hf_distilbert_mean", true, true},
                                           EmbedderCase{"gguf_distilbert_mean_f32", true, true},
                                           EmbedderCase{"hf_nomic_mean", true, true},
                                           EmbedderCase{"hf_nomic_hub", true, true},
                                           EmbedderCase{"gguf_nomic_mean_f32", true, true}));

// Each text alone gives what it gives in a batch: sequences do not attend to each other.
TEST(EncoderTest, BatchedEqualsAlone) {
  auto engine = Load("hf_bert_mean");
  ASSERT_NE(engine, nullptr);
  const Reference reference = ReadReference("hf_bert_mean");
  std::vector<EmbeddingInput> inputs;
  for (const std::string& text : reference.texts) inputs.push_back({text, {}, false});
  auto batched = Embed(engine, inputs);
  ASSERT_TRUE(batched.ok());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto alone = Embed(engine, {inputs[i]});
    ASSERT_TRUE(alone.ok());
    for (size_t j = 0; j < alone->vectors[0].size(); ++j) {
      EXPECT_NEAR(alone->vectors[0][j], batched->vectors[i][j], 1e-5);
    }
  }
}

// bf16 weights (the default precision) stay within cosine 0.999 of the fp32 reference.
TEST(EncoderTest, Bf16WeightsStayClose) {
  auto engine = Load("hf_bert_mean", "bf16");
  ASSERT_NE(engine, nullptr);
  const Reference reference = ReadReference("hf_bert_mean");
  std::vector<EmbeddingInput> inputs;
  for (const std::string& text : reference.texts) inputs.push_back({text, {}, false});
  auto result = Embed(engine, inputs);
  ASSERT_TRUE(result.ok());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_GE(Cosine(result->vectors[i], reference.vectors[i]), 0.999) << reference.texts[i];
  }
}

// An input longer than the model's positions is refused by name, not truncated.
TEST(EncoderTest, TooLongInputIsRefused) {
  auto engine = Load("hf_bert_mean");
  ASSERT_NE(engine, nullptr);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "word ";
  auto result = Embed(engine, {{"short", {}, false}, {text, {}, false}});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("input 1"), std::string::npos)
      << result.status().message();
  EXPECT_NE(result.status().message().find("maximum context length is 128"), std::string::npos)
      << result.status().message();
}

// A cross-encoder: the query and each document as one pair (BERT's [CLS] q [SEP] d [SEP], the
// document's tokens of type 1; RoBERTa's <s> q </s></s> d </s>); its score is transformers' logit
// (BERT's GGUF file's, without the pooler).
class RerankerTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(RerankerTest, ScoresEqualTransformers) {
  auto engine = Load(GetParam().first);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->model().classifies());
  simdjson::dom::parser parser;
  simdjson::dom::element root = parser.load(Dir(GetParam().first) + "/reference.json");
  const std::string query{std::string_view(root["query"])};
  std::vector<EmbeddingInput> inputs;
  for (auto document : root["documents"].get_array()) {
    EmbeddingInput input;
    for (const int32_t id : engine->tokenizer().EncodePair(query, std::string_view(document))) {
      input.tokens.push_back(id);
    }
    input.is_tokens = true;
    inputs.push_back(std::move(input));
  }
  auto result = Embed(engine, inputs);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  size_t i = 0;
  for (auto logit : root[GetParam().second].get_array()) {
    ASSERT_EQ(result->vectors[i].size(), 1u);
    EXPECT_NEAR(result->vectors[i][0], double(logit), 1e-5) << "document " << i;
    ++i;
  }
  EXPECT_EQ(i, inputs.size());
}

INSTANTIATE_TEST_SUITE_P(Encoders, RerankerTest,
                         ::testing::Values(std::make_pair("hf_bert_rerank", "logits"),
                                           std::make_pair("gguf_bert_rerank_f32",
                                                          "logits_without_pooler"),
                                           std::make_pair("hf_xlmr_rerank", "logits"),
                                           std::make_pair("gguf_xlmr_rerank_f32", "logits"),
                                           std::make_pair("hf_roberta_rerank", "logits"),
                                           std::make_pair("gguf_roberta_rerank_f32", "logits"),
                                           // DistilBERT's head: pre_classifier, ReLU, classifier.
                                           std::make_pair("hf_distilbert_rerank", "logits")));

// A DistilBERT whose feed-forward is not GELU, and a class Sluice has no head for, are refused
// naming the key and the class.
TEST(EncoderTest, DistilBertVariantsNotServedAreRefusedByName) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "distilbert_variant";
  std::string config;
  {
    std::ifstream in(Dir("hf_distilbert_mean") + "/config.json");
    config.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto refusal = [&](const std::string& from, const std::string& to) -> std::string {
    const size_t at = config.find(from);
    if (at == std::string::npos) return "config.json has no " + from;
    std::string changed = config;
    changed.replace(at, from.size(), to);
    fs::remove_all(dir);
    fs::copy(Dir("hf_distilbert_mean"), dir, fs::copy_options::recursive);
    std::ofstream(dir / "config.json") << changed;
    auto engine = LoadLlmEngine(dir.string());
    fs::remove_all(dir);
    return engine.ok() ? "loaded" : engine.status().message();
  };
  EXPECT_EQ(refusal("\"DistilBertModel\"", "\"DistilBertModel\""), "loaded");
  const std::string relu = refusal("\"activation\": \"gelu\"", "\"activation\": \"relu\"");
  EXPECT_NE(relu.find("'activation' is 'relu'"), std::string::npos) << relu;
  const std::string qa = refusal("\"DistilBertModel\"", "\"DistilBertForQuestionAnswering\"");
  EXPECT_NE(qa.find("names 'DistilBertForQuestionAnswering'"), std::string::npos) << qa;
}

// What Sluice does not read is refused at load, naming it.
TEST(EncoderTest, UnsupportedPoolingIsRefusedByName) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "bert_max_pooling";
  fs::remove_all(dir);
  fs::copy(Dir("hf_bert_mean"), dir, fs::copy_options::recursive);
  {
    std::ofstream out(dir / "1_Pooling" / "config.json");
    out << R"({"embedding_dimension": 64, "pooling_mode": "max"})";
  }
  auto engine = LoadLlmEngine(dir.string());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("pooling mode 'max'"), std::string::npos)
      << engine.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice::llm
