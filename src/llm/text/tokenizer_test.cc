// The C++ tokenizer against the tokenizers package: SmolLM2's tokenizer and the tiny models'
// on the strings tools/llm_export.py --test wrote with the ids the package gives them.
#include "llm/text/tokenizer.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "llm/files/gguf.h"
#include "llm/llm_config.h"
#include "sentencepiece_model.pb.h"

namespace sluice::llm {
namespace {

std::string Dir(const std::string& name) { return std::string(SLUICE_TEST_MODELS) + "/" + name; }

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;  // What the reference decodes the ids to: the text unless the file says.
};

std::vector<Case> ReadCases(const std::string& path) {
  std::vector<Case> cases;
  std::ifstream in(path);
  simdjson::dom::parser parser;
  std::string line;
  while (std::getline(in, line)) {
    simdjson::dom::element row;
    EXPECT_EQ(parser.parse(line).get(row), simdjson::SUCCESS);
    Case c;
    std::string_view text;
    EXPECT_EQ(row["text"].get(text), simdjson::SUCCESS);
    c.text = std::string(text);
    std::string_view decoded;
    if (row["decoded"].get(decoded) != simdjson::SUCCESS) decoded = text;
    c.decoded = std::string(decoded);
    for (auto id : row["ids"].get_array()) c.ids.push_back(static_cast<int32_t>(int64_t(id)));
    cases.push_back(std::move(c));
  }
  return cases;
}

// The tokenizer of `dir`: its GGUF file's, or its folder's.
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir) {
  auto gguf = FindGgufFile(dir);
  if (!gguf.ok()) return gguf.status();
  if (gguf->empty()) return Tokenizer::Load(dir);
  auto file = GgufFile::Open(*gguf);
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

class TokenizerCasesTest : public ::testing::TestWithParam<std::pair<std::string, size_t>> {};

// The ids the reference gave: the tokenizers package for a tokenizer.json, llama.cpp
// (llama_tokenize) for a GGUF file's tokenizer; decoded again, the text (or what llama.cpp's
// llama_detokenize makes of the ids, where the file records it).
TEST_P(TokenizerCasesTest, SameIdsAsTheReferenceAndRoundTrips) {
  const std::string dir = Dir(GetParam().first);
  auto tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const std::vector<Case> cases = ReadCases(dir + "/tokenizer_cases.jsonl");
  ASSERT_GE(cases.size(), GetParam().second);
  int id_mismatches = 0, round_trip_failures = 0, stream_failures = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(c.text);
    if (ids != c.ids && ++id_mismatches <= 5) {
      ADD_FAILURE() << "ids differ for " << ::testing::PrintToString(c.text) << ": got "
                    << ::testing::PrintToString(ids) << ", expected "
                    << ::testing::PrintToString(c.ids);
    }
    if ((*tokenizer)->Decode(ids) != c.decoded && ++round_trip_failures <= 5) {
      ADD_FAILURE() << "decode(encode(s)) is "
                    << ::testing::PrintToString((*tokenizer)->Decode(ids)) << ", expected "
                    << ::testing::PrintToString(c.decoded);
    }
    // The stream is every token's bytes (nothing dropped at the start), whole characters only.
    std::string pieces;
    for (int32_t id : ids) pieces += (*tokenizer)->TokenBytes(id);
    StreamDecoder stream(**tokenizer, /*skip_special=*/false);
    std::string streamed;
    bool whole_characters = true;
    for (int32_t id : ids) {
      const std::string piece = stream.Push(id);
      whole_characters &= IsValidUtf8(piece);
      streamed += piece;
    }
    streamed += stream.Flush();
    if ((streamed != Utf8Lossy(pieces) || !whole_characters) && ++stream_failures <= 5) {
      ADD_FAILURE() << "streaming decode differs for " << ::testing::PrintToString(c.text);
    }
  }
  EXPECT_EQ(id_mismatches, 0) << "of " << cases.size();
  EXPECT_EQ(round_trip_failures, 0);
  EXPECT_EQ(stream_failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizers, TokenizerCasesTest,
    ::testing::Values(std::make_pair("smollm2_tokenizer", size_t{10000}),
                      std::make_pair("gguf_smollm2_q4_1", size_t{10000}),
                      std::make_pair("gguf_mistral_f32", size_t{2000}),
                      std::make_pair("gguf_qwen2_f32", size_t{2000}),
                      std::make_pair("gguf_phi3_f32", size_t{2000}),
                      std::make_pair("converted/gguf_spm_llama_f32", size_t{2300}),
                      std::make_pair("converted/gguf_phi3_longrope_f32", size_t{2300}),
                      // GPT-4o's pre-tokenizer (gpt-oss's files) over tiny_llm's vocabulary.
                      std::make_pair("converted/gguf_gpt_oss_f32", size_t{2300}),
                      std::make_pair("converted/hf_spm_llama", size_t{2300}),
                      std::make_pair("converted/hf_spm_always", size_t{2300}),
                      std::make_pair("converted/hf_spm_legacy", size_t{2300}),
                      std::make_pair("converted/hf_spm_model_only", size_t{2300}),
                      std::make_pair("converted/hf_spm_model_only_legacy", size_t{2300}),
                      std::make_pair("tiny_llm", size_t{2000})));

// Encoder vocabularies, trained here (tools/encoder_models.py): WordPiece (BERT's and
// DistilBERT's, by the tokenizers package, lowercased and accents stripped, and cased), byte-level
// BPE (RoBERTa's, by the tokenizers package) and SentencePiece Unigram (XLM-RoBERTa's, by the
// sentencepiece package, converted to tokenizer.json by transformers).
// The ids the tokenizers package gives each string with the special tokens, from the folder's
// tokenizer.json and from the GGUF file llama.cpp's converter made of it. llama.cpp's own ids
// (its tokenizer_cases.jsonl) differ from the package's on some strings (accents, symbols);
// Sluice follows the package, which the models were trained with.
struct EncoderVocabulary {
  std::string dir, cases;  // The tokenizer's folder or GGUF file; the reference's folder.
  std::string cls, sep;    // BERT's [CLS] A [SEP] B [SEP]; RoBERTa's <s> A </s></s> B </s>.
  int middle_seps;
};

void PrintTo(const EncoderVocabulary& v, std::ostream* os) { *os << v.dir; }

class EncoderTokenizerTest : public ::testing::TestWithParam<EncoderVocabulary> {};

TEST_P(EncoderTokenizerTest, SameIdsAsTheTokenizersPackage) {
  const EncoderVocabulary& v = GetParam();
  const std::string dir = Dir(v.dir);
  auto tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const std::vector<Case> cases = ReadCases(Dir(v.cases) + "/tokenizer_cases.jsonl");
  ASSERT_GE(cases.size(), 1500u);
  int mismatches = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(c.text, /*add_special_tokens=*/true);
    if (ids != c.ids && ++mismatches <= 5) {
      ADD_FAILURE() << "ids differ for " << ::testing::PrintToString(c.text) << ": got "
                    << ::testing::PrintToString(ids) << ", expected "
                    << ::testing::PrintToString(c.ids);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size();
  // A pair, as a cross-encoder reads it.
  const Tokenizer& t = **tokenizer;
  ASSERT_TRUE(t.has_pair_template());
  const std::vector<int32_t> a = t.Encode("how fast"), b = t.Encode("very fast.");
  std::vector<int32_t> expected = {t.TokenId(v.cls)};
  expected.insert(expected.end(), a.begin(), a.end());
  for (int i = 0; i < v.middle_seps; ++i) expected.push_back(t.TokenId(v.sep));
  expected.insert(expected.end(), b.begin(), b.end());
  expected.push_back(t.TokenId(v.sep));
  EXPECT_EQ(t.EncodePair("how fast", "very fast."), expected);
}

INSTANTIATE_TEST_SUITE_P(
    Encoders, EncoderTokenizerTest,
    ::testing::Values(
        EncoderVocabulary{"encoders/hf_bert_mean", "encoders/hf_bert_mean", "[CLS]", "[SEP]", 1},
        EncoderVocabulary{"encoders/hf_bert_cls", "encoders/hf_bert_cls", "[CLS]", "[SEP]", 1},
        EncoderVocabulary{"encoders/gguf_bert_mean_f32", "encoders/hf_bert_mean", "[CLS]", "[SEP]",
                          1},
        EncoderVocabulary{"encoders/gguf_bert_cls_f32", "encoders/hf_bert_cls", "[CLS]", "[SEP]",
                          1},
        EncoderVocabulary{"encoders/hf_xlmr_mean", "encoders/hf_xlmr_mean", "<s>", "</s>", 2},
        EncoderVocabulary{"encoders/gguf_xlmr_mean_f32", "encoders/hf_xlmr_mean", "<s>", "</s>", 2},
        // RoBERTa's byte-level BPE (RobertaProcessing) and DistilBERT's WordPiece.
        EncoderVocabulary{"encoders/hf_roberta_mean", "encoders/hf_roberta_mean", "<s>", "</s>", 2},
        EncoderVocabulary{"encoders/gguf_roberta_mean_f32", "encoders/hf_roberta_mean", "<s>",
                          "</s>", 2},
        EncoderVocabulary{"encoders/hf_distilbert_mean", "encoders/hf_distilbert_mean", "[CLS]",
                          "[SEP]", 1},
        EncoderVocabulary{"encoders/gguf_distilbert_mean_f32", "encoders/hf_distilbert_mean",
                          "[CLS]", "[SEP]", 1},
        // sentencepiece.bpe.model without tokenizer.json: transformers' ids from that folder.
        EncoderVocabulary{"encoders/hf_xlmr_model_only", "encoders/hf_xlmr_model_only", "<s>",
                          "</s>", 2}));

TEST(TokenizerTest, WordPieceDecodesWordsWithSpaces) {
  auto tokenizer = Tokenizer::Load(Dir("encoders/hf_bert_mean"));
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ((*tokenizer)->Decode((*tokenizer)->Encode("hello, world")), "hello , world");
}

TEST(TokenizerTest, SpecialTokensAndConfig) {
  auto tokenizer = Tokenizer::Load(Dir("smollm2_tokenizer"));
  ASSERT_TRUE(tokenizer.ok());
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.bos_token(), "<|im_start|>");
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  const int32_t start = t.TokenId("<|im_start|>"), end = t.TokenId("<|im_end|>");
  ASSERT_GE(start, 0);
  EXPECT_TRUE(t.IsSpecial(start));
  const std::vector<int32_t> ids = t.Encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(ids.back(), end);
  EXPECT_EQ(t.Decode(ids, /*skip_special=*/true), "user\nhi");
  EXPECT_EQ(t.Decode(ids), "<|im_start|>user\nhi<|im_end|>");
}

// A folder with tokenizer.model and no tokenizer.json: the ids are checked against transformers'
// above; here tokenizer_config.json's part (bos/eos, add_bos_token, the chat template, special
// tokens) and the model files Sluice refuses by name.
TEST(TokenizerTest, SentencePieceModelWithoutTokenizerJson) {
  const std::string dir = Dir("converted/hf_spm_model_only");
  ASSERT_FALSE(std::filesystem::exists(dir + "/tokenizer.json"));
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.eos_token(), "</s>");
  EXPECT_NE(t.chat_template().find("<|end|>"), std::string::npos);
  const int32_t user = t.TokenId("<|user|>"), end = t.TokenId("<|end|>");
  EXPECT_EQ(user, 1000);
  EXPECT_EQ(end, 1002);
  EXPECT_TRUE(t.IsSpecial(end));
  const std::vector<int32_t> ids = t.Encode("<|user|>\nhello world<|end|>", true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], t.TokenId("<s>"));  // add_bos_token
  EXPECT_EQ(ids[1], user);
  EXPECT_EQ(ids.back(), end);
  EXPECT_EQ(t.Decode(ids, /*skip_special=*/true), "\nhello world");
  const std::vector<int32_t> plain = t.Encode("hello world");
  ASSERT_FALSE(plain.empty());
  EXPECT_NE(plain.front(), t.TokenId("<s>"));  // Without the special tokens, no BOS.
}

TEST(TokenizerTest, SentencePieceModelsNotReadAreRefusedByName) {
  sentencepiece::ModelProto proto;
  {
    std::ifstream in(Dir("converted/hf_spm_model_only/tokenizer.model"), std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in));
  }
  auto refused = [&](const sentencepiece::ModelProto& changed) {
    const std::string dir = ::testing::TempDir() + "/spm_refused";
    std::filesystem::create_directories(dir);
    {
      std::ofstream out(dir + "/tokenizer.model", std::ios::binary);
      changed.SerializeToOstream(&out);
    }
    auto tokenizer = Tokenizer::Load(dir);
    std::filesystem::remove_all(dir);
    return tokenizer.ok() ? std::string("loaded") : tokenizer.status().message();
  };
  sentencepiece::ModelProto unigram = proto;
  unigram.mutable_trainer_spec()->set_model_type(sentencepiece::TrainerSpec::UNIGRAM);
  EXPECT_NE(refused(unigram).find("a SentencePiece UNIGRAM model with tokenizer_class ''"),
            std::string::npos)
      << refused(unigram);
  // A Unigram model is read with XLM-RoBERTa's classes (hf_xlmr_model_only's cases), not others'.
  {
    const std::string dir = ::testing::TempDir() + "/spm_unigram";
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(Dir("encoders/hf_xlmr_model_only/sentencepiece.bpe.model"),
                               dir + "/sentencepiece.bpe.model",
                               std::filesystem::copy_options::overwrite_existing);
    auto load = [&](const std::string& config) {
      std::ofstream(dir + "/tokenizer_config.json") << config;
      auto tokenizer = Tokenizer::Load(dir);
      return tokenizer.ok() ? std::string("loaded") : tokenizer.status().message();
    };
    EXPECT_EQ(load(R"({"tokenizer_class": "XLMRobertaTokenizerFast"})"), "loaded");
    EXPECT_NE(load(R"({"tokenizer_class": "T5Tokenizer"})")
                  .find("UNIGRAM model with tokenizer_class 'T5Tokenizer'"),
              std::string::npos);
    EXPECT_NE(load(R"({"tokenizer_class": "XLMRobertaTokenizer", "add_prefix_space": false})")
                  .find("add_prefix_space false is not supported"),
              std::string::npos);
    std::filesystem::remove_all(dir);
  }
  sentencepiece::ModelProto nfkc = proto;
  nfkc.mutable_normalizer_spec()->set_name("nmt_nfkc");
  EXPECT_NE(refused(nfkc).find("normalizer 'nmt_nfkc' is not supported"), std::string::npos)
      << refused(nfkc);
  EXPECT_EQ(refused(proto), "loaded");  // The same file unchanged loads.
  // transformers' Llama conversion prepends "▁" whatever the file's add_dummy_prefix says (its
  // ids for "hello world" from such a file: the same as with the prefix).
  {
    sentencepiece::ModelProto no_prefix = proto;
    no_prefix.mutable_normalizer_spec()->set_add_dummy_prefix(false);
    const std::string dir = ::testing::TempDir() + "/spm_no_prefix";
    std::filesystem::create_directories(dir);
    {
      std::ofstream out(dir + "/tokenizer.model", std::ios::binary);
      no_prefix.SerializeToOstream(&out);
    }
    auto with = Tokenizer::Load(Dir("converted/hf_spm_model_only"));
    auto without = Tokenizer::Load(dir);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_EQ((*without)->Encode("hello world"), (*with)->Encode("hello world"));
    EXPECT_EQ((*without)->Decode((*without)->Encode("hello world")), "hello world");
    // Gemma's and T5's classes convert tokenizer.model their own ways: refused by name.
    std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "GemmaTokenizer"})";
    auto gemma = Tokenizer::Load(dir);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(gemma.ok());
    EXPECT_NE(gemma.status().message().find("tokenizer_class 'GemmaTokenizer'"), std::string::npos)
        << gemma.status().ToString();
  }
  {
    const std::string dir = ::testing::TempDir() + "/spm_garbage";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/tokenizer.model") << "not a model";
    auto tokenizer = Tokenizer::Load(dir);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_NE(tokenizer.status().message().find("cannot read it as a SentencePiece model"),
              std::string::npos);
  }
}

TEST(TokenizerTest, StreamDecoderHoldsBackHalfCharacters) {
  auto tokenizer = Tokenizer::Load(Dir("tiny_llm"));
  ASSERT_TRUE(tokenizer.ok());
  // The tiny vocab has no token for "😀": it is four byte tokens, emitted only when complete.
  const std::vector<int32_t> ids = (*tokenizer)->Encode("😀");
  ASSERT_EQ(ids.size(), 4u);
  StreamDecoder stream(**tokenizer, false);
  EXPECT_EQ(stream.Push(ids[0]), "");
  EXPECT_EQ(stream.Push(ids[1]), "");
  EXPECT_EQ(stream.Push(ids[2]), "");
  EXPECT_EQ(stream.Push(ids[3]), "😀");
  // A character cut short at the end is flushed as U+FFFD.
  EXPECT_EQ(stream.Push(ids[0]), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
}

TEST(Utf8Test, PrefixesAndLossyDecoding) {
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(CompleteUtf8Prefix("\xFF"
                               "a"),
            2u);  // Invalid bytes are "complete".
  EXPECT_EQ(Utf8Lossy("a\xFF"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));  // A surrogate.
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));      // Overlong.
}

TEST(TokenizerTest, MissingOrUnsupportedFilesAreErrors) {
  EXPECT_FALSE(Tokenizer::Load(Dir("no_such_dir")).ok());
  EXPECT_FALSE(Tokenizer::Load(Dir("tiny_cnn")).ok());
}

}  // namespace
}  // namespace sluice::llm
