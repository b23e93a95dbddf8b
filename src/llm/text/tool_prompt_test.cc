#include "llm/text/tool_prompt.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "llm/text/tool_calls.h"

namespace sluice::llm {
namespace {

const std::string kTools =
    R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";

ChatMessage Message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

// user, assistant calling get_weather twice, both results, and the user again.
std::vector<ChatMessage> AgentHistory() {
  ChatMessage call = Message("assistant", "");
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris"})"});
  call.tool_calls.push_back({"call_2", "get_weather", R"({"city": "Rome"})"});
  ChatMessage paris = Message("tool", "18 C");
  paris.tool_call_id = "call_1";
  ChatMessage rome = Message("tool", "24 C");
  rome.tool_call_id = "call_2";
  return {Message("user", "Weather in Paris and Rome?"), call, paris, rome,
          Message("user", "And which is warmer?")};
}

TEST(ToolsInConversationTest, CallsAndResultsBecomeAlternatingTurns) {
  const std::vector<ChatMessage> out =
      ToolsInConversation(AgentHistory(), kTools, /*parallel=*/true, ToolPreamblePlace::kSystem);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].role, "system");
  EXPECT_NE(out[0].content.find(kTools), std::string::npos);
  EXPECT_NE(out[0].content.find("To call one or more,"), std::string::npos);
  EXPECT_EQ(out[1].role, "user");
  EXPECT_EQ(out[2].role, "assistant");
  EXPECT_TRUE(out[2].tool_calls.empty());
  // The calls as the preamble asks for them, which the JSON fallback reads back.
  EXPECT_EQ(out[2].content,
            R"([{"name":"get_weather","arguments":{"city": "Paris"}},)"
            R"({"name":"get_weather","arguments":{"city": "Rome"}}])");
  ToolCallParser parser(ToolCallFormat::kJson);
  ToolCallParser::Pieces parsed = parser.Add(out[2].content);
  ToolCallParser::Pieces rest = parser.Finish();
  parsed.calls.insert(parsed.calls.end(), rest.calls.begin(), rest.calls.end());
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_TRUE(parsed.content.empty() && rest.content.empty());
  EXPECT_EQ(parsed.calls[1].arguments, R"({"city":"Rome"})");
  // Both results and the next question: one user turn, each result naming its function.
  EXPECT_EQ(out[3].role, "user");
  EXPECT_EQ(out[3].content,
            "Result of get_weather:\n18 C\n\nResult of get_weather:\n24 C\n\nAnd which is warmer?");
}

TEST(ToolsInConversationTest, ThePreambleJoinsASystemMessageOrTheFirstUserTurn) {
  std::vector<ChatMessage> with_system = {Message("system", "Be brief."), Message("user", "Hi")};
  auto out = ToolsInConversation(with_system, kTools, /*parallel=*/false,
                                 ToolPreamblePlace::kSystem);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].content.substr(out[0].content.size() - 9), "Be brief.");
  EXPECT_NE(out[0].content.find("To call one of them,"), std::string::npos);
  out = ToolsInConversation({Message("user", "Hi")}, kTools, true, ToolPreamblePlace::kFirstUser);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].role, "user");
  EXPECT_NE(out[0].content.find(kTools), std::string::npos);
  EXPECT_EQ(out[0].content.substr(out[0].content.size() - 4), "\n\nHi");
  // No tools offered (tool_choice "none"): no preamble, the history rewritten all the same.
  out = ToolsInConversation(AgentHistory(), "", true, ToolPreamblePlace::kSystem);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].role, "user");
  EXPECT_EQ(out[0].content, "Weather in Paris and Rome?");
}

std::unique_ptr<ChatTemplate> RealTemplate(const std::string& name) {
  std::ifstream file(std::string(SLUICE_CHAT_TEMPLATES) + "/" + name + ".jinja");
  EXPECT_TRUE(file) << "missing template " << name;
  std::stringstream source;
  source << file.rdbuf();
  auto parsed = ChatTemplate::Parse(source.str());
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? std::move(*parsed) : nullptr;
}

TEST(ToolsInConversationTest, TemplatesThatRenderNoToolsCarryAnAgentsHistory) {
  const std::map<std::string, std::string> variables = {{"bos_token", "<s>"},
                                                        {"eos_token", "</s>"}};
  // Gemma 2's refuses a system role and turns that do not alternate: the first user turn carries
  // the tools.
  auto gemma = RealTemplate("google-gemma-2-2b-it");
  ASSERT_NE(gemma, nullptr);
  ASSERT_FALSE(gemma->renders_tools());
  EXPECT_FALSE(gemma->Render(AgentHistory(), true, variables, {}).ok());
  EXPECT_FALSE(gemma
                   ->Render(ToolsInConversation(AgentHistory(), kTools, true,
                                                ToolPreamblePlace::kSystem),
                            true, variables, {})
                   .ok());
  auto prompt = gemma->Render(
      ToolsInConversation(AgentHistory(), kTools, true, ToolPreamblePlace::kFirstUser), true,
      variables, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_NE(prompt->find("\"get_weather\""), std::string::npos);
  EXPECT_NE(prompt->find("<start_of_turn>user\nResult of get_weather:\n18 C"), std::string::npos)
      << *prompt;
  // Phi-3.5-mini's (the seeds' model) drops a tool message without a word: rewritten, the
  // results reach the prompt.
  auto phi = RealTemplate("microsoft-Phi-3.5-mini-instruct");
  ASSERT_NE(phi, nullptr);
  ASSERT_FALSE(phi->renders_tools());
  auto plain = phi->Render(AgentHistory(), true, variables, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->find("18 C"), std::string::npos);
  prompt = phi->Render(
      ToolsInConversation(AgentHistory(), kTools, true, ToolPreamblePlace::kSystem), true,
      variables, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(prompt->find("<|system|>\nYou can call these functions"), 0u) << *prompt;
  EXPECT_NE(prompt->find("18 C"), std::string::npos);
  EXPECT_NE(prompt->find("<|assistant|>\n[{\"name\":\"get_weather\""), std::string::npos);
}

}  // namespace
}  // namespace sluice::llm
