#include "llm/text/tool_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

namespace sluice::llm {
namespace {

// Feeds `text` a few bytes at a time (as tokens arrive), then finishes.
ToolCallParser::Pieces Feed(ToolCallFormat format, std::string_view text, size_t step = 3) {
  ToolCallParser parser(format);
  ToolCallParser::Pieces all;
  auto take = [&](ToolCallParser::Pieces p) {
    all.content += p.content;
    for (ToolCall& c : p.calls) all.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += step) take(parser.Add(text.substr(i, step)));
  take(parser.Finish());
  return all;
}

TEST(ToolCallFormatTest, ReadFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOf("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("{{- '{\"name\": \"' + t.name + '\", \"parameters\": ' }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOf("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kUnknown);
}

TEST(ToolCallParserTest, HermesCallsAndTheTextAroundThem) {
  const auto p = Feed(ToolCallFormat::kHermes,
                      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": "
                      "\"get_time\", \"arguments\": {}}\n</tool_call>\n");
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(p.calls[0].id.size(), 29u);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
}

TEST(ToolCallParserTest, HermesTextThatIsNoCallStaysText) {
  // A '<' that begins no tag, a broken call, and an unclosed one at the end.
  auto p = Feed(ToolCallFormat::kHermes, "a < b <tool_call>not json</tool_call> c", 1);
  EXPECT_EQ(p.content, "a < b <tool_call>not json</tool_call> c");
  EXPECT_TRUE(p.calls.empty());
  // A model that stops before the closing tag still made its call.
  p = Feed(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCallParserTest, HermesHoldsAPartialTagUntilSettled) {
  ToolCallParser parser(ToolCallFormat::kHermes);
  EXPECT_EQ(parser.Add("hi <tool_").content, "hi ");
  EXPECT_EQ(parser.Add("x").content, "<tool_x");
}

TEST(ToolCallParserTest, Llama3JsonIsTheWholeReply) {
  auto p = Feed(ToolCallFormat::kLlama3Json,
                " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo; Norway\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Oslo; Norway"})");
  p = Feed(ToolCallFormat::kLlama3Json,
           "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": "
           "\"v\"}}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  // Text first: no call, all content, streamed as it comes.
  ToolCallParser parser(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(parser.Add("The answer is {x}").content, "The answer is {x}");
  // JSON that is not a call is content.
  p = Feed(ToolCallFormat::kLlama3Json, "{\"answer\": 42}");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"answer\": 42}");
}

TEST(ToolCallParserTest, MistralCallsFollowTheirMarker) {
  auto p = Feed(ToolCallFormat::kMistral,
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}, {\"name\": \"g\", "
                "\"arguments\": \"{\\\"b\\\": true}\"}]");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, R"({"a":[1,2]})");
  EXPECT_EQ(p.calls[1].arguments, R"({"b":true})");  // Arguments given as a JSON string.
  EXPECT_EQ(p.content, "");
}

// Mistral's newer templates (tokenizer v11, Mistral Small 3.2, Magistral, Devstral) write
// [TOOL_CALLS]name[ARGS]{...}, the marker again before each further call; and refuse any call id
// but 9 letters and digits.
TEST(ToolCallParserTest, MistralNamedCallsAndShortIds) {
  auto p =
      Feed(ToolCallFormat::kMistral,
           "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 1}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(p.calls[1].name, "add");
  EXPECT_EQ(p.content, "");
  // A name without arguments is no call: the text comes back as it was.
  p = Feed(ToolCallFormat::kMistral, "[TOOL_CALLS]get_weather");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "[TOOL_CALLS]get_weather");

  const std::string id = NewToolCallId(ToolCallFormat::kMistral);
  EXPECT_EQ(id.size(), 9u);
  EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(c) != 0; }));
  EXPECT_EQ(NewToolCallId().rfind("call_", 0), 0u);
  EXPECT_EQ(NewToolCallId().size(), 29u);
}

// A constrained array cut by the token limit (a small model repeating its call): the calls it
// completed, never its text.
TEST(ToolCallArrayTest, TheCompleteCallsOfACutArray) {
  const std::string call = R"({"name": "get_weather", "arguments": {"city": "a,]}"}})";
  auto calls = CompleteToolCalls("[" + call + ", " + call + R"(, {"name": "get_we)");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].name, "get_weather");
  EXPECT_EQ(calls[1].arguments, R"({"city":"a,]}"})");
  EXPECT_EQ(CompleteToolCalls("[" + call + "]").size(), 1u);
  EXPECT_TRUE(CompleteToolCalls(R"([{"name": "get_weather", "argu)").empty());
  EXPECT_TRUE(CompleteToolCalls("").empty());
  EXPECT_TRUE(CompleteToolCalls(call).empty());  // Not an array.
}

TEST(ToolCallArrayTest, TheConstrainedForm) {
  auto calls = ParseToolCallArray(R"([{"name": "f", "arguments": {"q": "x"}}])");
  ASSERT_TRUE(calls.ok());
  ASSERT_EQ(calls->size(), 1u);
  EXPECT_EQ((*calls)[0].arguments, R"({"q":"x"})");
  EXPECT_FALSE(ParseToolCallArray("[]").ok());
  EXPECT_FALSE(ParseToolCallArray(R"([{"name": "f"}])").ok());
  EXPECT_FALSE(ParseToolCallArray(R"({"name": "f", "arguments": {}})").ok());
}

}  // namespace
}  // namespace sluice::llm
