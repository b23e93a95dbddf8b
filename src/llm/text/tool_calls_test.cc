#include "llm/text/tool_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "llm/text/chat_template.h"
#include "llm/text/reasoning.h"

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

// Templates that know tools but no format above (Granite, Phi-4-mini, DeepSeek): the reply as a
// JSON call or array of calls, after Granite's marker or in a fence; other text stays text.
TEST(ToolCallParserTest, TheJsonFallback) {
  EXPECT_EQ(ToolCallFormatOf("{{ tools }}{{ messages }}"), ToolCallFormat::kJson);
  EXPECT_EQ(ToolCallFormatOf("{{ messages }}"), ToolCallFormat::kUnknown);
  for (const std::string reply :
       {R"({"name": "f", "arguments": {"a": 1}})", R"([{"name": "f", "arguments": {"a": 1}}])",
        R"(<|tool_call|>[{"name": "f", "arguments": {"a": 1}}])",
        R"(<|tool_call|>[{"name": "f", "arguments": {"a": 1}}]<|/tool_call|>)",
        "```json\n{\"name\": \"f\", \"parameters\": {\"a\": 1}}\n```"}) {
    auto p = Feed(ToolCallFormat::kJson, reply);
    ASSERT_EQ(p.calls.size(), 1u) << reply;
    EXPECT_EQ(p.calls[0].name, "f");
    EXPECT_EQ(p.calls[0].arguments, R"({"a":1})");
    EXPECT_EQ(p.content, "") << reply;
  }
  for (const std::string& text : {std::string("It is sunny."), std::string("```python\nx = 1\n```"),
                                 std::string(R"({"answer": 4})")}) {
    auto p = Feed(ToolCallFormat::kJson, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // The pythonic form (Llama 3.2's and 4's pythonic templates, Gemma fine-tunes).
  auto pythonic =
      Feed(ToolCallFormat::kJson, R"([get_weather(city="Paris", days=3, hourly=True), )"
                                  R"(search(q='it\'s', filters={"lang": ["en", None]}, top=0.5)])");
  ASSERT_EQ(pythonic.calls.size(), 2u) << pythonic.content;
  EXPECT_EQ(pythonic.calls[0].name, "get_weather");
  EXPECT_EQ(pythonic.calls[0].arguments, R"({"city":"Paris","days":3,"hourly":true})");
  EXPECT_EQ(pythonic.calls[1].arguments,
            R"({"q":"it's","filters":{"lang":["en",null]},"top":0.5})");
  EXPECT_EQ(pythonic.content, "");
  for (const std::string& text :
       {std::string("[1, 2]"), std::string("[f(x)]"), std::string("[f(a=1)] and more")}) {
    auto p = Feed(ToolCallFormat::kJson, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // Mistral Small 3.2's call id between the name and the arguments.
  auto p = Feed(ToolCallFormat::kMistral, R"([TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"a": 1})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
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

// Each format's parser on the calls the real published templates write (llama.cpp's copies of
// them, from the pinned source distribution): an assistant turn with a call is rendered by the
// template, and the reply's text parses back to that call. Mistral's templates refuse any id
// but 9 letters and digits, which NewToolCallId gives them.
TEST(ToolCallParserTest, EachFormatOnItsRealTemplate) {
  // Granite 3.3's template writes no calls back; it tells the model to answer with
  // <|tool_call|> and a JSON list, which is what its replies hold.
  const std::string granite_reply =
      R"(<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}])";
  const std::pair<const char*, ToolCallFormat> templates[] = {
      {"Qwen-Qwen2.5-7B-Instruct", ToolCallFormat::kHermes},
      {"Qwen-Qwen3-0.6B", ToolCallFormat::kHermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolCallFormat::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct", ToolCallFormat::kLlama3Json},
      {"meta-llama-Llama-3.2-3B-Instruct", ToolCallFormat::kLlama3Json},
      {"meta-llama-Llama-3.3-70B-Instruct", ToolCallFormat::kLlama3Json},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolCallFormat::kMistral},
      {"Mistral-Small-3.2-24B-Instruct-2506", ToolCallFormat::kMistral},
      {"unsloth-mistral-Devstral-Small-2507", ToolCallFormat::kMistral},
      {"ibm-granite-granite-3.3-2B-Instruct", ToolCallFormat::kJson},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", ToolCallFormat::kDeepSeek},
      {"deepseek-ai-DeepSeek-V3.1", ToolCallFormat::kDeepSeek},
  };
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",)"
      R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  for (const auto& [name, format] : templates) {
    SCOPED_TRACE(name);
    std::ifstream file(std::string(SLUICE_CHAT_TEMPLATES) + "/" + name + ".jinja");
    ASSERT_TRUE(file) << "missing template " << name;
    std::stringstream source;
    source << file.rdbuf();
    auto parsed = ChatTemplate::Parse(source.str());
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    if (!parsed.ok()) continue;
    EXPECT_EQ(ToolCallFormatOf(source.str()), format);
    ChatMessage user;
    user.role = "user";
    user.content = "Weather in Paris?";
    ChatMessage call;
    call.role = "assistant";
    call.tool_calls.push_back({NewToolCallId(format), "get_weather", R"({"city": "Paris"})"});
    const std::map<std::string, std::string> variables = {{"bos_token", "<s>"},
                                                          {"eos_token", "</s>"}};
    const std::map<std::string, TemplateArgument> arguments = {{"tools", TemplateJson{tools}}};
    auto prompt = (*parsed)->Render({user}, /*add_generation_prompt=*/true, variables, arguments);
    auto turn =
        (*parsed)->Render({user, call}, /*add_generation_prompt=*/false, variables, arguments);
    EXPECT_TRUE(prompt.ok()) << prompt.status().ToString();
    EXPECT_TRUE(turn.ok()) << turn.status().ToString();
    if (!prompt.ok() || !turn.ok()) continue;
    // The reply: what the turn adds after the prompt they share (DeepSeek R1's prompt ends by
    // opening <think>, which its template drops from a past turn).
    size_t shared = 0;
    while (shared < prompt->size() && shared < turn->size() &&
           (*prompt)[shared] == (*turn)[shared]) {
      ++shared;
    }
    // Where they part inside a tag ("<think>" against "<｜tool..."), the tag is the reply's.
    if (shared < prompt->size() && shared > 0 && (*turn)[shared - 1] == '<') --shared;
    EXPECT_GT(shared, prompt->find("Weather in Paris?")) << *prompt << "\n---\n" << *turn;
    std::string reply = turn->substr(shared);
    if (format == ToolCallFormat::kJson) {
      EXPECT_NE(prompt->find("<|tool_call|> followed by a JSON list"), std::string::npos);
      reply = granite_reply;
    }
    // The turn's end is the end-of-sequence token the model stops on, not the reply's text.
    for (const char* end : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|end_of_text|>",
                            "<｜end▁of▁sentence｜>"}) {
      if (const size_t at = reply.rfind(end); at != std::string::npos) reply.erase(at);
    }
    if ((*parsed)->thinks()) {
      // Qwen3 writes an empty thinking block before the call: the reasoning splitter's, as served.
      ReasoningSplitter splitter(/*in_reasoning=*/false);
      reply = splitter.Add(reply).content + splitter.Finish().content;
    }
    const ToolCallParser::Pieces pieces = Feed(format, reply);
    EXPECT_EQ(pieces.calls.size(), 1u) << reply;
    if (pieces.calls.size() != 1) continue;
    EXPECT_EQ(pieces.calls[0].name, "get_weather");
    EXPECT_EQ(pieces.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(pieces.content, "") << reply;
  }
}

}  // namespace
}  // namespace sluice::llm
