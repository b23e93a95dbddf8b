// gpt-oss's harmony replies: reasoning, answer and calls told apart however the text is split, and
// the calls gpt-oss's own template writes back (llama.cpp's copy of it) read as those calls.
#include "llm/text/harmony.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "llm/text/chat_template.h"

namespace sluice::llm {
namespace {

constexpr std::string_view kCallReply =
    "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>";
constexpr std::string_view kAnswerReply =
    "<|channel|>analysis<|message|>It is 18 C there.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Paris: 18 C, <b>sunny</b> | dry.<|return|>";

// The reply fed `step` bytes at a time, then finished.
HarmonyParser::Pieces Parse(std::string_view reply, size_t step, bool calls = true) {
  HarmonyParser parser(calls);
  HarmonyParser::Pieces all;
  auto take = [&](HarmonyParser::Pieces pieces) {
    all.reasoning += pieces.reasoning;
    all.content += pieces.content;
    for (ToolCall& call : pieces.calls) all.calls.push_back(std::move(call));
  };
  for (size_t at = 0; at < reply.size(); at += step) take(parser.Add(reply.substr(at, step)));
  take(parser.Finish());
  return all;
}

TEST(HarmonyTest, ChannelsAndCallsWhateverTheSplit) {
  for (size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000}}) {
    SCOPED_TRACE(step);
    const HarmonyParser::Pieces call = Parse(kCallReply, step);
    EXPECT_EQ(call.reasoning, "Need the weather; call the tool.");
    EXPECT_EQ(call.content, "");
    ASSERT_EQ(call.calls.size(), 1u);
    EXPECT_EQ(call.calls[0].name, "get_weather");
    EXPECT_EQ(call.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
    EXPECT_TRUE(call.calls[0].id.starts_with("call_"));
    const HarmonyParser::Pieces answer = Parse(kAnswerReply, step);
    EXPECT_EQ(answer.reasoning, "It is 18 C there.");
    EXPECT_EQ(answer.content, "Paris: 18 C, <b>sunny</b> | dry.");
    EXPECT_TRUE(answer.calls.empty());
  }
}

TEST(HarmonyTest, ARepliesTextIsGivenAsItComesAndMarkersAreHeld) {
  HarmonyParser parser(true);
  EXPECT_EQ(parser.Add("<|channel|>analysis<|mess").reasoning, "");
  EXPECT_EQ(parser.Add("age|>thinking <").reasoning, "thinking ");  // "<" may open <|end|>.
  HarmonyParser::Pieces next = parser.Add("b> more<|e");
  EXPECT_EQ(next.reasoning, "<b> more");
  next = parser.Add("nd|><|start|>assistant<|channel|>final<|message|>hi");
  EXPECT_EQ(next.reasoning, "");
  EXPECT_EQ(next.content, "hi");
  EXPECT_EQ(parser.Finish().content, "");
}

TEST(HarmonyTest, WithoutToolsCutShortOrOutsideTheFormatItIsText) {
  // No tools offered: a message to a function is text.
  const HarmonyParser::Pieces no_tools = Parse(kCallReply, 5, /*calls=*/false);
  EXPECT_TRUE(no_tools.calls.empty());
  EXPECT_EQ(no_tools.content, R"({"city": "Paris", "unit": "c"})");
  // The token limit inside a call: its text, never half a call.
  const std::string_view cut = kCallReply.substr(0, kCallReply.size() - 12);
  const HarmonyParser::Pieces cut_call = Parse(cut, 4);
  EXPECT_TRUE(cut_call.calls.empty());
  EXPECT_EQ(cut_call.content, R"({"city": "Paris", "unit": )");
  // ... or inside the reasoning: the reasoning so far.
  EXPECT_EQ(Parse("<|channel|>analysis<|message|>half a tho", 3).reasoning, "half a tho");
  // A model that writes no header at all (the end token that closes it is not text).
  EXPECT_EQ(Parse("just text", 2).content, "just text");
  EXPECT_EQ(Parse("just text<|return|>", 3).content, "just text");
  const std::string long_text(300, 'x');
  EXPECT_EQ(Parse(long_text, 7).content, long_text);
  // Two calls in a row (parallel calls) and a preamble to the user (commentary, no recipient).
  const HarmonyParser::Pieces two = Parse(
      "<|channel|>commentary<|message|>Checking both.<|end|>"
      "<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|>"
      "<|start|>assistant to=functions.b<|channel|>commentary json<|message|>{\"x\":1}<|call|>",
      6);
  EXPECT_EQ(two.content, "Checking both.");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].name, "a");
  EXPECT_EQ(two.calls[0].arguments, "{}");
  EXPECT_EQ(two.calls[1].arguments, R"({"x":1})");
}

// A reply the model ends with an end token of its own that is not harmony's (an <|endoftext|>,
// its text not given): the open message is closed, so a call's body is a call; without that
// close (a cut) it is its text.
TEST(HarmonyTest, AnEndTokenOfTheModelsOwnClosesTheLastMessage) {
  const std::string_view body = kCallReply.substr(0, kCallReply.size() - 8);  // No <|call|>.
  for (const bool closed : {true, false}) {
    HarmonyParser parser(/*calls=*/true);
    HarmonyParser::Pieces pieces = parser.Add(body);
    const HarmonyParser::Pieces rest = parser.Finish(closed);
    pieces.content += rest.content;
    for (const ToolCall& call : rest.calls) pieces.calls.push_back(call);
    if (closed) {
      ASSERT_EQ(pieces.calls.size(), 1u);
      EXPECT_EQ(pieces.calls[0].name, "get_weather");
      EXPECT_EQ(pieces.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
      EXPECT_EQ(pieces.content, "");
    } else {
      EXPECT_TRUE(pieces.calls.empty());
      EXPECT_EQ(pieces.content, R"({"city": "Paris", "unit": "c"})");
    }
  }
  HarmonyParser answer(/*calls=*/true);
  HarmonyParser::Pieces pieces = answer.Add("<|channel|>final<|message|>Done.");
  EXPECT_EQ(pieces.content + answer.Finish(/*closed=*/true).content, "Done.");
}

// gpt-oss's template (llama.cpp's models/templates copy) writes an agent's earlier turn back: its
// reasoning (reasoning_content, which the template reads as message.thinking) in the analysis
// channel and its call to functions.get_weather. That call, read by the parser, is the same call.
TEST(HarmonyTest, TheCallsGptOssTemplateWritesReadBack) {
  std::ifstream file(std::string(SLUICE_CHAT_TEMPLATES) + "/openai-gpt-oss-120b.jinja");
  ASSERT_TRUE(file);
  std::stringstream source;
  source << file.rdbuf();
  ASSERT_TRUE(IsHarmonyTemplate(source.str()));
  EXPECT_FALSE(IsHarmonyTemplate("{{ messages[0].content }}<|im_end|>"));
  EXPECT_EQ(ToolCallFormatOf(source.str()), ToolCallFormat::kHarmony);
  auto chat = ChatTemplate::Parse(source.str());
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  std::vector<ChatMessage> messages(4);
  messages[0].role = "user";
  messages[0].content = "Weather in Paris?";
  messages[1].role = "assistant";
  messages[1].reasoning_content = "Need the weather.";
  messages[1].tool_calls.push_back({"call_1", "get_weather", R"({"city":"Paris","unit":"c"})"});
  messages[2].role = "tool";
  messages[2].tool_call_id = "call_1";
  messages[2].content = "18 C";
  messages[3].role = "user";
  messages[3].content = "And tomorrow?";
  auto prompt = (*chat)->Render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_TRUE(prompt->ends_with("<|start|>assistant")) << *prompt;
  const size_t start = prompt->find("<|start|>assistant<|channel|>analysis");
  const size_t end = prompt->find("<|call|>");
  ASSERT_NE(start, std::string::npos) << *prompt;
  ASSERT_NE(end, std::string::npos) << *prompt;
  const std::string turn = prompt->substr(start, end + 8 - start);
  const HarmonyParser::Pieces read = Parse(turn, 5);
  EXPECT_EQ(read.reasoning, "Need the weather.");
  ASSERT_EQ(read.calls.size(), 1u);
  EXPECT_EQ(read.calls[0].name, "get_weather");
  EXPECT_EQ(read.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  EXPECT_NE(prompt->find("<|start|>functions.get_weather to=assistant<|channel|>commentary"
                         "<|message|>\"18 C\"<|end|>"),
            std::string::npos)
      << *prompt;
}

}  // namespace
}  // namespace sluice::llm
