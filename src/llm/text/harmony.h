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

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/text/tool_calls.h"

namespace sluice::llm {

// Whether a chat template writes harmony (gpt-oss's): its messages open with <|channel|> and
// their bodies with <|message|>.
bool IsHarmonyTemplate(std::string_view source);

// Harmony's markers inside a reply (the ends that stop it, <|return|> and <|call|>, apart): a
// grammar over harmony's replies names them (HarmonyReplyTag), so a grammar's vocabulary gives
// them their text (grammar.cc), where it gives other special tokens none.
constexpr std::array<std::string_view, 5> kHarmonyMarkers = {"<|start|>", "<|end|>", "<|message|>",
                                                             "<|channel|>", "<|constrain|>"};

// A call a harmony reply may make under a grammar: the function and its arguments' JSON Schema.
struct HarmonyCallSchema {
  std::string name, schema;
};

// XGrammar's structural tag for a harmony reply under a grammar: at most one analysis message
// (its text free), then the final message or a call of one of `calls` (in the header form
// gpt-oss writes: "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"). The
// final message is not allowed without `answer`, free where it is empty, else a document of
// that JSON Schema. `ids`: the token ids of kHarmonyMarkers, in its order; the markers are
// token-level elements, so that the reply's framing is the special tokens, never text that spells
// them. Free text is any tokens but the markers and `special` (the vocabulary's other special
// tokens, which XGrammar's matcher refuses where its mask would let them through). The reply's
// end token (<|return|>, <|call|>) follows the grammar's end.
std::string HarmonyReplyTag(const std::array<int32_t, kHarmonyMarkers.size()>& ids,
                            const std::vector<int32_t>& special,
                            const std::optional<std::string>& answer,
                            const std::vector<HarmonyCallSchema>& calls);

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
  // The reply is over. `closed`: it ended at an end token of the model's own that is not one of
  // harmony's (an <|endoftext|>), which closes its last message as <|return|> would (a call's
  // body is then a call, where a body cut short is its text).
  Pieces Finish(bool closed = false);

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
