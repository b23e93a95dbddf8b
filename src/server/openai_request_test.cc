// OpenAI request bodies to typed requests: response_format's shapes and its errors, parameters
// refused by name, and vLLM's /tokenize and /detokenize bodies.
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice::openai {
namespace {

std::optional<ParseError> Chat(const std::string& extra, CompletionRequest& r) {
  return ParseCompletion(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" +
                             extra + "}",
                         /*chat=*/true, r);
}

TEST(OpenAiRequestTest, ResponseFormatShapes) {
  CompletionRequest r;
  ASSERT_FALSE(Chat("", r));
  EXPECT_EQ(r.response_format.type, ResponseFormat::Type::kText);
  r = {};
  ASSERT_FALSE(Chat(R"(, "response_format": {"type": "text"})", r));
  EXPECT_EQ(r.response_format.type, ResponseFormat::Type::kText);
  r = {};
  ASSERT_FALSE(Chat(R"(, "response_format": {"type": "json_object"})", r));
  EXPECT_EQ(r.response_format.type, ResponseFormat::Type::kJsonObject);
  r = {};
  ASSERT_FALSE(Chat(R"(, "response_format": {"type": "json_schema", "json_schema": {
      "name": "person_1", "strict": true, "description": "d",
      "schema": {"type": "object", "properties": {"age": {"type": "integer"}}}}})",
                    r));
  EXPECT_EQ(r.response_format.type, ResponseFormat::Type::kJsonSchema);
  EXPECT_EQ(r.response_format.schema,
            R"({"type":"object","properties":{"age":{"type":"integer"}}})");
  // Completions take it too (as vLLM's do).
  r = {};
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "p", "response_format": {"type": "json_object"}})",
                               /*chat=*/false, r));
  EXPECT_EQ(r.response_format.type, ResponseFormat::Type::kJsonObject);
}

TEST(OpenAiRequestTest, ResponseFormatErrorsNameIt) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("json")", "must be an object"},
      {R"({"type": "regex"})", "'regex' is not supported"},
      {R"({"type": "json_object", "schema": {}})", "'response_format.schema' is not supported"},
      {R"({"type": "json_schema"})", "'response_format.json_schema' (an object) is required"},
      {R"({"type": "json_schema", "json_schema": {"name": "x"}})", "schema' (a JSON Schema"},
      {R"({"type": "json_schema", "json_schema": {"schema": true}})", "schema' (a JSON Schema"},
      {R"({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}})", "name' must"},
      {R"({"type": "json_schema", "json_schema": {"strict": 1, "schema": {}}})", "strict' must"},
      {R"({"type": "json_schema", "json_schema": {"schema": {}, "format": 1}})",
       "'response_format.json_schema.format' is not supported"},
  };
  for (const auto& [format, message] : cases) {
    CompletionRequest r;
    auto error = Chat(std::string(R"(, "response_format": )") + format, r);
    ASSERT_TRUE(error) << format;
    EXPECT_EQ(error->param, "response_format") << format;
    EXPECT_NE(error->message.find(message), std::string::npos) << error->message;
  }
  CompletionRequest r;
  auto error = Chat(R"(, "ignore_eos": true, "response_format": {"type": "json_object"})", r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "ignore_eos");
}

TEST(OpenAiRequestTest, UnservedParametersAreRefusedByName) {
  for (const char* key : {"tools", "logit_bias", "parallel_tool_calls"}) {
    CompletionRequest r;
    auto error = Chat(std::string(", \"") + key + "\": null", r);
    ASSERT_TRUE(error) << key;
    EXPECT_EQ(error->param, key);
  }
  CompletionRequest r;
  auto error = ParseCompletion(R"({"prompt": "p", "top_logprobs": 2})", /*chat=*/false, r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "top_logprobs");
}

TEST(OpenAiRequestTest, TokenizeAndDetokenizeBodies) {
  TokenizeRequest t;
  ASSERT_FALSE(ParseTokenize(R"({"model": "m", "prompt": "hi"})", t));
  EXPECT_FALSE(t.chat);
  EXPECT_TRUE(t.add_special_tokens);
  EXPECT_EQ(t.prompt, "hi");
  t = {};
  ASSERT_FALSE(ParseTokenize(R"({"messages": [{"role": "user", "content": "hi"}],
                                  "add_generation_prompt": false})",
                             t));
  EXPECT_TRUE(t.chat);
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_FALSE(t.add_generation_prompt);
  ASSERT_EQ(t.messages.size(), 1u);
  t = {};
  auto error = ParseTokenize(R"({"prompt": "a", "messages": []})", t);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "prompt");
  t = {};
  EXPECT_TRUE(ParseTokenize("[1]", t));

  DetokenizeRequest d;
  ASSERT_FALSE(ParseDetokenize(R"({"tokens": [1, 2, -3]})", d));
  EXPECT_EQ(d.tokens, (std::vector<int64_t>{1, 2, -3}));
  d = {};
  error = ParseDetokenize(R"({"tokens": [1, "2"]})", d);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "tokens");
}

}  // namespace
}  // namespace sluice::openai
