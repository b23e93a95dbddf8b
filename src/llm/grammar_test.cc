// Constrained decoding on the tiny test vocabulary: a "model" whose logits are random noise is
// masked by the grammar at every step and sampled at temperature 1; every document it ends must
// parse and validate, whatever the noise.
#include "llm/grammar.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "llm/sampler.h"
#include "llm/text/harmony.h"
#include "llm/text/tokenizer.h"

namespace sluice::llm {
namespace {

constexpr int32_t kEos = 2;  // <|im_end|> in the tiny vocabulary.
constexpr int kVocab = 400;  // Wider than the tokenizer's 384, as a model's logits may be.

std::unique_ptr<Tokenizer> LoadTokenizer() {
  auto tokenizer = Tokenizer::Load(std::string(SLUICE_TEST_MODELS) + "/tiny_llm");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

// The noise Generate draws: over `vocab` logits, ending at one of `stops`, with `bias` added to
// the `favoured` token's logit where there is one.
struct Noise {
  int vocab = kVocab;
  std::vector<int32_t> stops = {kEos};
  int32_t favoured = -1;
  float bias = 0;
};

// Samples from noise under `grammar` until it terminates (true) or `max_tokens` run out.
bool Generate(const std::shared_ptr<const Grammar>& grammar, uint64_t seed, int max_tokens,
              std::vector<int32_t>* out, const Noise& options = {}) {
  GrammarMatcher matcher(grammar);
  SamplingParams params;
  params.temperature = 1;
  params.seed = seed;
  Sampler sampler(params, {});
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> noise(0, 2);
  std::vector<float> logits(static_cast<size_t>(options.vocab));
  for (int i = 0; i < max_tokens; ++i) {
    for (float& x : logits) x = noise(rng);
    if (options.favoured >= 0) logits[static_cast<size_t>(options.favoured)] += options.bias;
    matcher.Mask(logits.data(), options.vocab);
    const int32_t token = sampler.Next(logits.data(), options.vocab);
    EXPECT_FALSE(std::isinf(logits[token])) << "a masked token was drawn";
    EXPECT_TRUE(matcher.Accept(token)) << token;
    if (matcher.Terminated()) {
      EXPECT_NE(std::find(options.stops.begin(), options.stops.end(), token), options.stops.end())
          << token;
      return true;
    }
    out->push_back(token);
  }
  return false;
}

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"},
    "colour": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}
  },
  "required": ["name", "age", "ok", "colour"],
  "additionalProperties": false
})";

TEST(GrammarTest, NoiseUnderASchemaAlwaysGivesValidDocuments) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  auto grammar = compiler.JsonSchema(kSchema);
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  simdjson::dom::parser parser;
  std::set<std::string> names;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    std::vector<int32_t> ids;
    ASSERT_TRUE(Generate(*grammar, seed, 600, &ids)) << "seed " << seed << " did not finish";
    const std::string text = tokenizer->Decode(ids);
    SCOPED_TRACE(text);
    std::string bytes;
    for (int32_t id : ids) bytes += tokenizer->TokenBytes(id);
    ASSERT_EQ(bytes, text) << "the tokens' bytes are not valid UTF-8";
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(text).get(doc), simdjson::SUCCESS);
    simdjson::dom::object object;
    ASSERT_EQ(doc.get(object), simdjson::SUCCESS);
    std::set<std::string> keys;
    for (auto field : object) keys.insert(std::string(field.key));
    for (const char* key : {"name", "age", "ok", "colour"}) EXPECT_TRUE(keys.count(key)) << key;
    for (const std::string& key : keys) {
      EXPECT_TRUE(key == "name" || key == "age" || key == "ok" || key == "colour" || key == "tags")
          << key;
    }
    std::string_view name;
    ASSERT_EQ(object["name"].get(name), simdjson::SUCCESS);
    // maxLength counts characters (code points), not bytes.
    size_t chars = 0;
    for (unsigned char c : name) chars += (c & 0xC0) != 0x80;
    EXPECT_LE(chars, 12u);
    names.insert(std::string(name));
    int64_t age = -1;
    ASSERT_EQ(object["age"].get(age), simdjson::SUCCESS);
    EXPECT_GE(age, 0);
    EXPECT_LE(age, 120);
    bool ok = false;
    EXPECT_EQ(object["ok"].get(ok), simdjson::SUCCESS);
    std::string_view colour;
    ASSERT_EQ(object["colour"].get(colour), simdjson::SUCCESS);
    EXPECT_TRUE(colour == "red" || colour == "green" || colour == "blue") << colour;
    simdjson::dom::array tags;
    if (object["tags"].get(tags) == simdjson::SUCCESS) {
      EXPECT_LE(tags.size(), 3u);
      for (auto tag : tags) EXPECT_TRUE(tag.is_string());
    }
  }
  // The noise explores: the documents differ.
  EXPECT_GT(names.size(), 50u);
}

// Strings are where a byte-level vocabulary can spell what UTF-8 forbids (surrogates, overlong
// forms): 1,000 documents of strings alone, each byte for byte valid UTF-8.
TEST(GrammarTest, StringsStayValidUtf8) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  auto grammar = compiler.JsonSchema(R"({"type": "object", "properties": {
      "a": {"type": "string", "maxLength": 10}, "b": {"type": "string", "maxLength": 10}},
      "required": ["a", "b"], "additionalProperties": false})");
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    std::vector<int32_t> ids;
    ASSERT_TRUE(Generate(*grammar, seed, 300, &ids)) << "seed " << seed;
    std::string bytes;
    for (int32_t id : ids) bytes += tokenizer->TokenBytes(id);
    ASSERT_TRUE(simdjson::validate_utf8(bytes.data(), bytes.size())) << "seed " << seed;
  }
}

// After a lead byte 0xED, a continuation in 0xA0-0xBF would encode a surrogate: masked, and
// refused by Accept(); 0x80-0x9F stays allowed.
TEST(GrammarTest, ASurrogateCannotBeSpelled) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  auto single = [&](uint8_t byte) {
    for (int id = 0; id < tokenizer->vocab_size(); ++id) {
      if (tokenizer->TokenBytes(id) == std::string(1, static_cast<char>(byte))) return id;
    }
    return -1;
  };
  const int lead = single(0xED), low = single(0x9F), high = single(0xA0);
  ASSERT_TRUE(lead >= 0 && low >= 0 && high >= 0);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  auto grammar = compiler.JsonSchema(R"({"type": "string"})");
  ASSERT_TRUE(grammar.ok());
  GrammarMatcher matcher(*grammar);
  ASSERT_TRUE(matcher.Accept(tokenizer->Encode("\"")[0]));
  ASSERT_TRUE(matcher.Accept(lead));
  std::vector<float> logits(kVocab, 0.f);
  matcher.Mask(logits.data(), kVocab);
  EXPECT_FALSE(std::isinf(logits[low]));
  EXPECT_TRUE(std::isinf(logits[high]));
  EXPECT_FALSE(matcher.Accept(high));
  EXPECT_TRUE(matcher.Accept(low));
}

TEST(GrammarTest, JsonModeGivesObjectsAndOnlyObjects) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  auto grammar = compiler.JsonObject();
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  simdjson::dom::parser parser;
  int finished = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    std::vector<int32_t> ids;
    if (!Generate(*grammar, seed, 400, &ids)) continue;  // Free-form JSON may run long.
    ++finished;
    const std::string text = tokenizer->Decode(ids);
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(text).get(doc), simdjson::SUCCESS) << text;
    EXPECT_TRUE(doc.is_object()) << text;
  }
  EXPECT_GT(finished, 50);
}

TEST(GrammarTest, TheMaskAllowsExactlyWhatAcceptTakes) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  auto grammar = compiler.JsonSchema(R"({"enum": ["yes", "no"]})");
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  GrammarMatcher matcher(*grammar);
  std::vector<float> logits(kVocab, 0.f);
  matcher.Mask(logits.data(), kVocab);
  // Before anything, only tokens that begin `"yes"` or `"no"` (a quote, with what follows it).
  int allowed = 0;
  for (int id = 0; id < kVocab; ++id) {
    if (std::isinf(logits[id])) continue;
    ++allowed;
    const std::string& bytes = tokenizer->TokenBytes(id);
    ASSERT_FALSE(bytes.empty()) << id;
    EXPECT_EQ(bytes[0], '"') << id;
  }
  EXPECT_GE(allowed, 1);
  for (int id = 384; id < kVocab; ++id) EXPECT_TRUE(std::isinf(logits[id])) << id;
  // Allowed's bits are the tokens Mask leaves.
  std::vector<uint32_t> bits;
  matcher.Allowed(kVocab, &bits);
  ASSERT_EQ(bits.size(), static_cast<size_t>((kVocab + 31) / 32));
  for (int id = 0; id < kVocab; ++id) {
    EXPECT_EQ(((bits[static_cast<size_t>(id / 32)] >> (id % 32)) & 1u) != 0,
              !std::isinf(logits[id]))
        << id;
  }
  EXPECT_FALSE(matcher.Accept(tokenizer->Encode("maybe")[0]));  // Refused, and nothing changes.
  for (int32_t id : tokenizer->Encode("\"no\"")) ASSERT_TRUE(matcher.Accept(id)) << id;
  // The document is complete: only the end-of-sequence token remains.
  std::fill(logits.begin(), logits.end(), 0.f);
  matcher.Mask(logits.data(), kVocab);
  for (int id = 0; id < kVocab; ++id) EXPECT_EQ(std::isinf(logits[id]), id != kEos) << id;
  EXPECT_FALSE(matcher.Terminated());
  EXPECT_TRUE(matcher.Accept(kEos));
  EXPECT_TRUE(matcher.Terminated());
}

TEST(GrammarTest, ASchemaThatCannotCompileIsAnInvalidArgument) {
  auto tokenizer = LoadTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  GrammarCompiler compiler(*tokenizer, kVocab, {kEos});
  for (const char* schema : {"{not json", R"({"type": "no-such-type"})", "[1, 2]"}) {
    auto grammar = compiler.JsonSchema(schema);
    ASSERT_FALSE(grammar.ok()) << schema;
    EXPECT_EQ(grammar.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(grammar.status().message().find("JSON schema"), std::string::npos);
  }
}

// gpt-oss's replies under a grammar (HarmonyReplyTag) on the tiny gpt-oss's vocabulary, whose
// harmony markers are special tokens: a reply that reasons, then answers with a document of the
// schema, is accepted token by token and ends at <|return|>; one without its final message
// cannot end; a document outside the schema, or a marker spelled in text tokens instead of the
// special token, is refused where it departs. And noise masked by the grammar (the analysis'
// end favoured, so that replies end within the budget) always gives a reply whose final message
// is a document of the schema, parsed as harmony's parser parses it.
TEST(GrammarTest, HarmonyRepliesAreItsMessagesAndTheirDocuments) {
  auto tokenizer = Tokenizer::Load(std::string(SLUICE_TEST_MODELS) + "/converted/hf_gpt_oss");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const Tokenizer& vocabulary = **tokenizer;
  std::array<int32_t, kHarmonyMarkers.size()> ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = vocabulary.TokenId(kHarmonyMarkers[i]);
    ASSERT_GE(ids[i], 0) << kHarmonyMarkers[i];
  }
  // The engine's end tokens for a harmony vocabulary: <|return|> and <|call|>.
  const int32_t ret = vocabulary.TokenId("<|return|>"), call = vocabulary.TokenId("<|call|>"),
                end = vocabulary.TokenId("<|end|>");
  GrammarCompiler compiler(vocabulary, vocabulary.vocab_size(), {ret, call});
  const std::string schema =
      R"({"type":"object","properties":{"unit":{"enum":["c","f"]}},"required":["unit"],)"
      R"("additionalProperties":false})";
  std::vector<int32_t> special;
  for (int32_t id = 0; id < vocabulary.vocab_size(); ++id) {
    if (vocabulary.IsSpecial(id)) special.push_back(id);
  }
  auto grammar = compiler.StructuralTag(HarmonyReplyTag(ids, special, schema, {}));
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  const auto encode = [&](std::string_view text) {
    return vocabulary.Encode(text, /*add_special_tokens=*/false);
  };
  // The tokens of `text` until one is refused: how many were accepted; whether it terminated.
  const auto follow = [&](const std::vector<int32_t>& tokens, bool* terminated) {
    GrammarMatcher matcher(*grammar);
    size_t accepted = 0;
    while (accepted < tokens.size() && matcher.Accept(tokens[accepted])) ++accepted;
    *terminated = matcher.Terminated();
    return accepted;
  };
  bool terminated = false;
  const std::vector<int32_t> reply = encode(
      "<|channel|>analysis<|message|>Cold.<|end|><|start|>assistant<|channel|>final<|message|>"
      "{\"unit\": \"c\"}<|return|>");
  EXPECT_EQ(follow(reply, &terminated), reply.size());
  EXPECT_TRUE(terminated);
  const std::vector<int32_t> direct =
      encode("<|channel|>final<|message|>{\"unit\":\"f\"}<|return|>");
  EXPECT_EQ(follow(direct, &terminated), direct.size());
  EXPECT_TRUE(terminated);
  const std::vector<int32_t> no_answer =
      encode("<|channel|>analysis<|message|>Cold.<|end|><|return|>");
  EXPECT_EQ(follow(no_answer, &terminated), no_answer.size() - 1);  // <|return|> refused.
  EXPECT_FALSE(terminated);
  const std::vector<int32_t> kelvin = encode("<|channel|>final<|message|>{\"unit\": \"k\"}");
  const std::vector<int32_t> before_k = encode("<|channel|>final<|message|>{\"unit\": \"");
  EXPECT_EQ(follow(kelvin, &terminated), before_k.size());
  std::vector<int32_t> spelled = encode("<|chan");
  for (const int32_t id : encode("nel|>final<|message|>{}")) spelled.push_back(id);
  EXPECT_EQ(follow(spelled, &terminated), 0u);
  EXPECT_EQ(vocabulary.TokenId("<|channel|>"), ids[3]);

  // Noise under the grammar.
  int answered = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<int32_t> tokens;
    if (!Generate(*grammar, seed, 400, &tokens, {vocabulary.vocab_size(), {ret, call}, end, 6})) {
      continue;
    }
    ++answered;
    HarmonyParser parser(/*calls=*/false);
    HarmonyParser::Pieces pieces = parser.Add(vocabulary.Decode(tokens, /*skip_special=*/false));
    HarmonyParser::Pieces rest = parser.Finish();
    const std::string content = pieces.content + rest.content;
    simdjson::dom::parser json;
    simdjson::dom::element document;
    ASSERT_EQ(json.parse(content).get(document), simdjson::SUCCESS) << content;
    std::string_view unit;
    ASSERT_EQ(document["unit"].get(unit), simdjson::SUCCESS) << content;
    EXPECT_TRUE(unit == "c" || unit == "f") << content;
  }
  std::printf("harmony noise: %d of 20 replies answered within 400 tokens\n", answered);
  EXPECT_GE(answered, 15);
}

}  // namespace
}  // namespace sluice::llm
