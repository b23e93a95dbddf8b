// Chat templates rendered in C++ against transformers' apply_chat_template (and Jinja with
// transformers' settings) on the conversations tools/llm_export.py --test wrote.
#include "llm/text/chat_template.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <string>

namespace sluice::llm {
namespace {

TEST(ChatTemplateTest, RendersLikeTransformers) {
  const std::string path =
      std::string(SLUICE_TEST_MODELS) + "/smollm2_tokenizer/chat_template_cases.json";
  simdjson::dom::parser parser;
  simdjson::dom::array cases;
  ASSERT_EQ(parser.load(path).get(cases), simdjson::SUCCESS) << path;
  int rendered = 0, raised = 0, with_tools = 0;
  for (auto c : cases) {
    const std::string source{std::string_view(c["template"])};
    auto chat_template = ChatTemplate::Parse(source);
    ASSERT_TRUE(chat_template.ok()) << chat_template.status().ToString();
    std::vector<ChatMessage> messages;
    for (auto m : c["messages"].get_array()) {
      ChatMessage message;
      message.role = std::string(std::string_view(m["role"]));
      std::string_view text;
      if (m["content"].get(text) == simdjson::SUCCESS) message.content = std::string(text);
      if (m["tool_call_id"].get(text) == simdjson::SUCCESS)
        message.tool_call_id = std::string(text);
      simdjson::dom::array calls;
      if (m["tool_calls"].get(calls) == simdjson::SUCCESS) {
        for (auto call : calls) {
          message.tool_calls.push_back(
              ToolCallRecord{std::string(std::string_view(call["id"])),
                             std::string(std::string_view(call["function"]["name"])),
                             simdjson::minify(call["function"]["arguments"])});
        }
      }
      messages.push_back(std::move(message));
    }
    std::map<std::string, TemplateArgument> arguments;
    simdjson::dom::element tools;
    if (c["tools"].get(tools) == simdjson::SUCCESS) {
      arguments["tools"] = TemplateJson{simdjson::minify(tools)};
      ++with_tools;
    }
    auto text = (*chat_template)->Render(messages, bool(c["add_generation_prompt"]), {}, arguments);
    std::string_view expected, error;
    if (c["error"].get(error) == simdjson::SUCCESS) {
      ASSERT_FALSE(text.ok()) << "expected the template to raise: " << error;
      EXPECT_NE(text.status().message().find(std::string(error)), std::string::npos);
      ++raised;
      continue;
    }
    ASSERT_EQ(c["text"].get(expected), simdjson::SUCCESS);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, expected) << "template:\n" << source;
    ++rendered;
  }
  EXPECT_GE(rendered, 40);
  EXPECT_GE(raised, 1);
  EXPECT_EQ(with_tools, 2);  // Tools and calls in a conversation, as transformers renders them.
}

TEST(ChatTemplateTest, ParseErrorsAreReportedAtLoad) {
  for (const char* bad :
       {"{% if x %}no end", "{% for x in %}{% endfor %}", "{{ 'unterminated }}",
        "{% while true %}{% endwhile %}", "{{ x | no_such_filter }}x{% endif %}"}) {
    EXPECT_FALSE(ChatTemplate::Parse(bad).ok()) << bad;
  }
}

TEST(ChatTemplateTest, ExpressionsAndVariables) {
  auto t = ChatTemplate::Parse(
      "{{ bos_token }}{{ messages | length }}{{ 7 // 2 }}{{ 'a' ~ 1 }}{{ [1, 2, 3][1:] | join('-') "
      "}}"
      "{{ 'x' in 'yxz' }}{{ none is none }}{{ {'k': 'v'}.get('k') }}{{ undefined_name | "
      "default('d') }}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto text = (*t)->Render({{"user", "u"}}, false, {{"bos_token", "<s>"}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<s>13a12-3TrueTruevd");
}

// '+' on values Jinja cannot add names both operands and what they were: gpt-oss's template adds
// a tool's description to a string, and a tool sent without one fails there.
TEST(ChatTemplateTest, AddingUnlikeValuesNamesTheOperands) {
  auto t = ChatTemplate::Parse(
      "{%- for tool in tools %}{{ '// ' + tool.description }}{{ tool.name }}{%- endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto text = (*t)->Render({{"user", "u"}}, false, {},
                           {{"tools", TemplateJson{R"([{"name": "get_weather"}])"}}});
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find(
                "'+' on a string ('// ') and an undefined value (tool.description)"),
            std::string::npos)
      << text.status().message();
  auto described =
      (*t)->Render({{"user", "u"}}, false, {},
                   {{"tools", TemplateJson{R"([{"name": "f", "description": "d"}])"}}});
  ASSERT_TRUE(described.ok()) << described.status().ToString();
  EXPECT_EQ(*described, "// df");
}

// What the real published templates use beyond the basics (Qwen3's messages[::-1], Mistral's
// selectattr and namespace(index=0), Hermes 3's macros, Mistral Nemo's "}}" in a string), each
// as Jinja computes it.
TEST(ChatTemplateTest, WhatRealTemplatesUse) {
  auto t = ChatTemplate::Parse(
      "{{ [1, 2, 3, 4][::-1] | join }}|{{ 'abcdef'[::2] }}|{{ [1, 2, 3, 4][2::-1] | join }}|"
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
      "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|"
      "{%- set ns = namespace(index=0, found=false) %}{%- for m in messages %}"
      "{%- set ns.index = ns.index + 1 %}{%- endfor %}{{ ns.index }}{{ ns.found }}|"
      "{%- macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{%- endmacro %}"
      "{{ greet('ada') }} {{ greet('bob', '?') }}|{{ \"}}\" }}|"
      "{%- for k, v in {'a': 1} | items %}{{ k }}={{ v }}{%- endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto text = (*t)->Render({{"user", "u"}, {"assistant", "a"}, {"user", "v"}}, false);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "4321|ace|321|2|1|3False|hi ada! hi bob?|}}|a=1");
}

// A message's name is message.name where it is given, and undefined where it is not.
TEST(ChatTemplateTest, AMessagesNameWhereGiven) {
  auto t = ChatTemplate::Parse(
      "{% for m in messages %}{{ m.role }}{% if m.name is defined %}({{ m.name }}){% endif %}:"
      "{{ m.content }};{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto text = (*t)->Render({{"user", "hi", "ada"}, {"assistant", "hello"}}, false);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "user(ada):hi;assistant:hello;");
}

// A request's template arguments (chat_template_kwargs) are variables of any JSON scalar type;
// a template that writes </think> thinks.
TEST(ChatTemplateTest, ArgumentsAndThinking) {
  auto t = ChatTemplate::Parse(
      "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
      "{% else %}<think>\n{% endif %}{{ depth | default(0) }}{{ style | default('-') }}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->thinks());
  auto on = (*t)->Render({{"user", "u"}}, true);
  ASSERT_TRUE(on.ok());
  EXPECT_EQ(*on, "<think>\n0-");
  auto off = (*t)->Render({{"user", "u"}}, true, {},
                          {{"enable_thinking", false}, {"depth", int64_t{3}}, {"style", "terse"}});
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(*off, "<think>\n\n</think>\n\n3terse");
  auto plain = ChatTemplate::Parse("{{ messages[0].content }}");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->thinks());
}

}  // namespace
}  // namespace sluice::llm
