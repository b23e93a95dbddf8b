// OpenAI request bodies to typed requests: response_format's shapes and its errors, parameters
// refused by name, and vLLM's /tokenize and /detokenize bodies.
#include "http/openai_request.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

namespace sluice::openai {
namespace {

std::optional<ParseError> Chat(const std::string& extra, CompletionRequest& r) {
  return ParseCompletion(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" + extra + "}",
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
  for (const char* key : {"logit_bias", "functions", "function_call"}) {
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

// max_tokens and max_completion_tokens are one limit under two names: either, not both.
TEST(OpenAiRequestTest, OneTokenLimit) {
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    CompletionRequest r;
    ASSERT_FALSE(Chat(std::string(", \"") + key + "\": 7", r)) << key;
    EXPECT_EQ(r.max_tokens, 7);
  }
  CompletionRequest r;
  auto error = Chat(R"(, "max_tokens": 7, "max_completion_tokens": 9)", r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "max_completion_tokens");
}

// Ollama's keep_alive on chat, completions and embeddings: seconds or a duration string.
TEST(OpenAiRequestTest, KeepAliveAsOllamaTakesIt) {
  CompletionRequest none;
  ASSERT_FALSE(Chat("", none));
  EXPECT_FALSE(none.keep_alive.has_value());
  for (const auto& [json, ms] : std::vector<std::pair<std::string, int64_t>>{
           {R"("10m")", 600000}, {"300", 300000}, {"-1", -1000}, {"0", 0}, {"2.5", 2500}}) {
    CompletionRequest r;
    auto error = Chat(", \"keep_alive\": " + json, r);
    ASSERT_FALSE(error) << json << ": " << error->message;
    ASSERT_TRUE(r.keep_alive.has_value()) << json;
    EXPECT_EQ(r.keep_alive->count(), ms) << json;
  }
  for (const char* json : {R"("soon")", "true", "[1]"}) {
    CompletionRequest r;
    auto error = Chat(std::string(", \"keep_alive\": ") + json, r);
    ASSERT_TRUE(error) << json;
    EXPECT_EQ(error->param, "keep_alive") << json;
  }
  CompletionRequest completion;
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "hi", "keep_alive": "5m"})", false, completion));
  EXPECT_EQ(completion.keep_alive->count(), 300000);
  EmbeddingsRequest embeddings;
  ASSERT_FALSE(ParseEmbeddings(R"({"input": "hi", "keep_alive": 60})", embeddings));
  EXPECT_EQ(embeddings.keep_alive->count(), 60000);
}

// A completion's prompt: a string or token ids, alone or as an array of one; several prompts, an
// empty or mixed array are refused naming 'prompt'.
TEST(OpenAiRequestTest, PromptAsTextOrTokenIds) {
  for (const char* body : {R"({"prompt": "hi"})", R"({"prompt": ["hi"]})"}) {
    CompletionRequest r;
    ASSERT_FALSE(ParseCompletion(body, /*chat=*/false, r)) << body;
    EXPECT_EQ(r.prompt, "hi");
    EXPECT_TRUE(r.prompt_tokens.empty());
  }
  for (const char* body : {R"({"prompt": [5, 6, 7]})", R"({"prompt": [[5, 6, 7]]})"}) {
    CompletionRequest r;
    ASSERT_FALSE(ParseCompletion(body, /*chat=*/false, r)) << body;
    EXPECT_EQ(r.prompt_tokens, (std::vector<int64_t>{5, 6, 7}));
  }
  for (const char* body :
       {R"({"prompt": []})", R"({"prompt": ["a", "b"]})", R"({"prompt": [1, "a"]})",
        R"({"prompt": [[1], [2]]})", R"({"prompt": [1.5]})", R"({"prompt": 3})"}) {
    CompletionRequest r;
    auto error = ParseCompletion(body, /*chat=*/false, r);
    ASSERT_TRUE(error) << body;
    EXPECT_EQ(error->param, "prompt") << body;
  }
}

// What a new user sends wrong gets a 400 naming it, never a quiet drop: a message's tool fields
// and unknown fields, stream_options without stream or with unknown keys, non-boolean flags, a
// non-string model. A message's name reaches the template.
TEST(OpenAiRequestTest, StrictBodiesNameWhatIsWrong) {
  const std::pair<std::string, std::pair<const char*, const char*>> cases[] = {
      {R"({"model": "m", "messages": [{"role": "user", "content": null,
           "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "f", "arguments": "{}"}}]}]})",
       {"messages", "'messages[0].tool_calls' is not supported outside assistant messages"}},
      {R"({"model": "m", "messages": [{"role": "assistant", "content": null,
           "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}]}]})",
       {"messages", "'messages[0].tool_calls' must hold"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a", "tool_call_id": "c1"}]})",
       {"messages", "'messages[0].tool_call_id' is not supported outside tool messages"}},
      {R"({"model": "m", "messages": [{"role": "tool", "content": "4"}]})",
       {"messages", "'messages[0].tool_call_id' (a string) is required"}},
      {R"({"model": "m", "messages": [{"role": "function", "content": "4", "name": "f"}]})",
       {"messages", "role 'function' (deprecated) is not supported"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a", "refusal": null}]})",
       {"messages", "'messages[0].refusal' is not supported"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a", "name": 3}]})",
       {"messages", "'messages[0].name' must be a non-empty string"}},
      {R"({"model": "m", "messages": ["hi"]})", {"messages", "'messages[0]' must be an object"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}],
           "stream_options": {"include_usage": true}})",
       {"stream_options", "only allowed when 'stream' is true"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": true,
           "stream_options": {"include_usage": true, "chunk": 2}})",
       {"stream_options", "'stream_options.chunk' is not supported"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": true,
           "stream_options": {"include_usage": "yes"}})",
       {"stream_options", "include_usage' must be true or false"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": true,
           "stream_options": {"include_obfuscation": true}})",
       {"stream_options", "only served as false"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": "yes"})",
       {"stream", "'stream' must be true or false"}},
      {R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "ignore_eos": 1})",
       {"ignore_eos", "'ignore_eos' must be true or false"}},
      {R"({"model": 7, "messages": [{"role": "user", "content": "a"}]})",
       {"model", "'model' must be a string"}},
      {R"({"model": 7, "prompt": "a"})", {"model", "'model' must be a string"}},
  };
  for (const auto& [body, expected] : cases) {
    CompletionRequest r;
    const bool chat = body.find("\"messages\"") != std::string::npos;
    auto error = ParseCompletion(body, chat, r);
    ASSERT_TRUE(error) << body;
    EXPECT_EQ(error->param, expected.first) << body;
    EXPECT_NE(error->message.find(expected.second), std::string::npos) << error->message;
  }
  CompletionRequest r;
  ASSERT_FALSE(ParseCompletion(R"({"model": "m", "messages": [
      {"role": "user", "content": "a", "name": "ada"}], "stream": true,
      "stream_options": {"include_usage": true, "include_obfuscation": false}})",
                               /*chat=*/true, r));
  EXPECT_EQ(r.messages[0].name, "ada");
  EXPECT_TRUE(r.stream && r.include_usage);

  // An agent loop sends a thinking model's reply back as it came, reasoning_content included (or
  // vLLM's newer name, reasoning); only an assistant message carries it.
  for (const char* key : {"reasoning_content", "reasoning"}) {
    r = {};
    ASSERT_FALSE(ParseCompletion(fmt::format(R"({{"messages": [{{"role": "user", "content": "a"}},
        {{"role": "assistant", "content": "b", "{}": "thought"}},
        {{"role": "user", "content": "c"}}]}})",
                                             key),
                                 /*chat=*/true, r))
        << key;
    EXPECT_EQ(r.messages[1].reasoning_content, "thought");
    auto error = ParseCompletion(
        fmt::format(R"({{"messages": [{{"role": "user", "content": "a", "{}": "x"}}]}})", key),
        /*chat=*/true, r);
    ASSERT_TRUE(error);
    EXPECT_EQ(error->message, fmt::format("'messages[0].{}' is not supported", key));
  }

  r = {};
  ASSERT_FALSE(Chat(R"(, "chat_template_kwargs": {"enable_thinking": false, "depth": 2,
                                                    "style": "terse"})",
                    r));
  EXPECT_EQ(std::get<bool>(r.template_arguments.at("enable_thinking")), false);
  EXPECT_EQ(std::get<int64_t>(r.template_arguments.at("depth")), 2);
  EXPECT_EQ(std::get<std::string>(r.template_arguments.at("style")), "terse");
  for (const char* bad : {R"([1])", R"({"x": 1.5})", R"({"x": {}})", R"({"messages": 1})"}) {
    r = {};
    auto error = Chat(std::string(R"(, "chat_template_kwargs": )") + bad, r);
    ASSERT_TRUE(error) << bad;
    EXPECT_EQ(error->param, "chat_template_kwargs") << bad;
  }
  r = {};
  auto error = ParseCompletion(R"({"prompt": "p", "chat_template_kwargs": {}})", false, r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "chat_template_kwargs");
}

// tools, tool_choice and parallel_tool_calls as OpenAI's API takes them, and the tool messages of
// an agent's history.
TEST(OpenAiRequestTest, ToolsAndToolMessages) {
  const std::string weather =
      R"({"type": "function", "function": {"name": "get_weather", "description": "d",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
          "strict": true}})";
  CompletionRequest r;
  ASSERT_FALSE(Chat(R"(, "tools": [)" + weather + R"(, {"type": "function", "function": {"name":
      "now"}}], "tool_choice": {"type": "function", "function": {"name": "now"}},
      "parallel_tool_calls": false)",
                    r));
  ASSERT_EQ(r.tools.functions.size(), 2u);
  EXPECT_EQ(r.tools.functions[0].name, "get_weather");
  EXPECT_EQ(r.tools.functions[0].parameters,
            R"({"type":"object","properties":{"city":{"type":"string"}}})");
  EXPECT_TRUE(r.tools.functions[0].strict);
  EXPECT_EQ(r.tools.functions[1].parameters, "");
  EXPECT_EQ(r.tools.choice, llm::ToolOptions::Choice::kFunction);
  EXPECT_EQ(r.tools.function, "now");
  EXPECT_FALSE(r.tools.parallel);
  EXPECT_NE(r.tools.definitions.find(R"("description":"d")"), std::string::npos);
  for (const auto& [choice, mode] : std::vector<std::pair<std::string, llm::ToolOptions::Choice>>{
           {R"("auto")", llm::ToolOptions::Choice::kAuto},
           {R"("none")", llm::ToolOptions::Choice::kNone},
           {R"("required")", llm::ToolOptions::Choice::kRequired}}) {
    r = {};
    ASSERT_FALSE(Chat(R"(, "tools": [)" + weather + R"(], "tool_choice": )" + choice, r));
    EXPECT_EQ(r.tools.choice, mode) << choice;
  }
  const std::pair<std::string, const char*> bad[] = {
      {R"(, "tools": [])", "'tools' must be a non-empty array"},
      {R"(, "tools": [{"type": "code_interpreter"}])", "only 'function' tools are"},
      {R"(, "tools": [{"type": "function", "function": {"name": "a b"}}])", "name' must be"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])",
       "must be a JSON Schema object"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f", "returns": {}}}])",
       "'tools[0].function.returns' is not supported"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f"}},
                      {"type": "function", "function": {"name": "f"}}])",
       "two tools are named 'f'"},
  };
  for (const auto& [extra, message] : bad) {
    r = {};
    auto error = Chat(extra, r);
    ASSERT_TRUE(error) << extra;
    EXPECT_EQ(error->param, "tools") << extra;
    EXPECT_NE(error->message.find(message), std::string::npos) << error->message;
  }
  for (const std::string& extra : std::vector<std::string>{
           R"(, "tool_choice": "required")", R"(, "tool_choice": "any")",
           R"(, "tools": [)" + weather + R"(], "tool_choice": {"type": "function", "function":
            {"name": "other"}})"}) {
    r = {};
    auto error = Chat(extra, r);
    ASSERT_TRUE(error) << extra;
    EXPECT_EQ(error->param, "tool_choice") << extra;
  }
  r = {};
  ASSERT_FALSE(ParseCompletion(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]})",
                               /*chat=*/true, r));
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[2].content, "18C");
}

TEST(OpenAiRequestTest, EmbeddingsBodies) {
  EmbeddingsRequest r;
  ASSERT_FALSE(ParseEmbeddings(R"({"model": "e", "input": "hi"})", r));
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].text, "hi");
  EXPECT_FALSE(r.base64);
  r = {};
  ASSERT_FALSE(ParseEmbeddings(R"({"input": ["a", [1, 2]], "encoding_format": "base64",
                                   "dimensions": 8, "user": "u"})",
                               r));
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_FALSE(r.inputs[0].is_tokens);
  EXPECT_TRUE(r.inputs[1].is_tokens);
  EXPECT_EQ(r.inputs[1].tokens, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 8);
  r = {};
  ASSERT_FALSE(ParseEmbeddings(R"({"input": [5, 6, 7]})", r));  // One input of token ids.
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].tokens.size(), 3u);
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": "e"})", "input"},
           {R"({"input": []})", "input"},
           {R"({"input": [""]})", "input"},
           {R"({"input": [1, "a"]})", "input"},
           {R"({"input": {"text": "a"}})", "input"},
           {R"({"input": "a", "encoding_format": "int8"})", "encoding_format"},
           {R"({"input": "a", "dimensions": 0})", "dimensions"},
           {R"({"input": "a", "truncate_prompt_tokens": 8})", "truncate_prompt_tokens"}}) {
    r = {};
    auto error = ParseEmbeddings(body, r);
    ASSERT_TRUE(error) << body;
    EXPECT_EQ(error->param, param) << body;
  }
}

// The Jina/Cohere rerank body: documents as strings or {"text": ...}; Cohere's other
// parameters are refused by name.
TEST(OpenAiRequestTest, RerankBodies) {
  RerankRequest r;
  ASSERT_FALSE(ParseRerank(R"({"model": "m", "query": "q", "documents": ["a", {"text": "b"}],
                               "top_n": 1, "return_documents": true})",
                           r));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.query, "q");
  EXPECT_EQ(r.documents, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.top_n, 1);
  EXPECT_TRUE(r.return_documents);
  r = {};
  ASSERT_FALSE(ParseRerank(R"({"query": "", "documents": ["a"]})", r));
  EXPECT_EQ(r.top_n, 0);
  EXPECT_FALSE(r.return_documents);
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"documents": ["a"]})", "query"},
           {R"({"query": null, "documents": ["a"]})", "query"},
           {R"({"query": 3, "documents": ["a"]})", "query"},
           {R"({"query": "q"})", "documents"},
           {R"({"query": "q", "documents": []})", "documents"},
           {R"({"query": "q", "documents": [{"content": "a"}]})", "documents"},
           {R"({"query": "q", "documents": ["a"], "top_n": 0})", "top_n"},
           {R"({"query": "q", "documents": ["a"], "rank_fields": ["t"]})", "rank_fields"}}) {
    r = {};
    auto error = ParseRerank(body, r);
    ASSERT_TRUE(error) << body;
    EXPECT_EQ(error->param, param) << body;
  }
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
