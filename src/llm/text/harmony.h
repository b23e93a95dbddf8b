// gpt-oss's chat format (OpenAI's harmony). A reply is a run of messages, each a header and a
// body ended by <|end|>, <|return|> (the last) or <|call|> (a tool call, the last):
//
//   <|channel|>analysis<|message|>The user wants the weather.<|end|>
//   <|start|>assistant<|channel|>final<|message|>It is 18 C.<|return|>
//   <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
//     {"city": "Paris"}<|call|>
//
// (the recipient also stands before the channel: "<|start|>assistant to=functions.get_weather
// <|channel|>commentary json<|message|>", as gpt-oss's template writes calls back). The analysis
// channel is reasoning (reasoning_content), final and commentary without a recipient are the
// answer (content), and a message to functions.NAME is a call of NAME with its body as arguments
// (tool_calls). The markers are special tokens: the reply's text must keep them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "llm/text/tool_calls.h"

namespace sluice::llm {

// Whether a chat template writes harmony (gpt-oss's): its messages open with <|channel|> and
// their bodies with <|message|>.
bool IsHarmonyTemplate(std::string_view source);

// Fed a reply's text as it is generated, gives back its reasoning, content and the calls
// completed so far; text that may be a marker's start is held until the next piece (or Finish)
// settles it. A body cut short (the token limit) is given as what its channel makes it, a call's
// as content; text outside any message (a model that writes no header) is content. Without
// `calls` (no tools offered, or tool_choice none), a message to a function is content too. Not
// thread-safe: one per reply.
class HarmonyParser {
 public:
  explicit HarmonyParser(bool calls);
  struct Pieces {
    std::string reasoning, content;
    std::vector<ToolCall> calls;
  };
  Pieces Add(std::string_view text);
  Pieces Finish();

 private:
  enum class Target { kReasoning, kContent, kCall };
  void Run(Pieces& out, bool end);
  void Header(std::string_view header);
  void Release(Pieces& out, std::string_view text);

  bool calls_;
  bool in_body_ = false;
  Target target_ = Target::kContent;
  std::string buffer_;     // A header so far, or body text held back (a marker's start).
  std::string call_name_;  // kCall: the function; its body so far in call_body_.
  std::string call_body_;
};

}  // namespace sluice::llm
