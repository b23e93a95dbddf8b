// Tool calls in a model's reply. Models trained for tool calling write calls in their chat
// template's own format; the format is read from the template (how it renders an assistant's
// tool_calls), never from a flag:
//
//   Hermes / Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call> each call
//
//   Llama 3.x: {"name": ..., "parameters": {...}} as the whole reply ("; " between)
//
//   Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or its newer
//   [TOOL_CALLS]name[ARGS]{...} (one [TOOL_CALLS] per call)
//
//   DeepSeek: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
//   ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (R1 and its distills), or
//   <｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1 and later)
//
//   Any other template that knows tools (Granite, Phi-4-mini, DeepSeek, Gemma's): the JSON
//   fallback, a reply that is wholly a call {"name", "arguments"} or an array of them, after
//   Granite's <|tool_call|> or in a ```json fence where the model writes one, or the pythonic
//   [name(key=value, ...)]
//
// With tool_choice "required" or a named function, the reply is constrained to a JSON array of
// {"name", "arguments"} instead (ParseToolCallArray).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/text/chat_template.h"
#include "sluice/status.h"

namespace sluice::llm {

// kHarmony: gpt-oss's (text/harmony.h reads its replies, reasoning and calls together).
enum class ToolCallFormat { kUnknown, kHermes, kLlama3Json, kMistral, kDeepSeek, kJson, kHarmony };
std::string_view ToolCallFormatName(ToolCallFormat format);  // "hermes", "llama3_json", ...
// The format `template_source` writes an assistant's tool calls in; kUnknown if none known.
ToolCallFormat ToolCallFormatOf(std::string_view template_source);

// A call as the reply gives it: `arguments` is JSON text of an object.
struct ToolCall {
  std::string id;  // Set by NewToolCallId().
  std::string name;
  std::string arguments;
};
// "call_" and 24 random letters and digits; for Mistral's templates, which refuse any other
// form, 9 letters and digits.
std::string NewToolCallId(ToolCallFormat format = ToolCallFormat::kUnknown);

// `json` as an array of {"name": string, "arguments": object} (at least one).
Result<std::vector<ToolCall>> ParseToolCallArray(std::string_view json);
// The whole calls at the start of such an array that was cut short (a reply that reached its
// token limit), in order; none where the first is incomplete.
std::vector<ToolCall> CompleteToolCalls(std::string_view json);

// Fed a reply's text as it is generated (after any reasoning), gives back its content and the
// calls completed so far, each whole. Text that may begin a call is held until it is settled; a
// call that does not parse is given back as content, unchanged. Whitespace between calls and
// after the last one is dropped. Not thread-safe: one per reply.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format) : format_(format) {}

  struct Pieces {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Pieces Add(std::string_view text);
  Pieces Finish();  // The end of the reply: what was held, as calls or content.

 private:
  void Hermes(Pieces& out, bool end);
  void Whole(Pieces& out, bool end);  // Llama 3 JSON and Mistral: calls fill the reply's rest.
  void Release(Pieces& out, std::string text);  // Content, after any whitespace held.

  ToolCallFormat format_;
  std::string buffer_;
  bool in_call_ = false;     // Hermes: inside <tool_call>; the others: the rest is calls.
  bool started_ = false;     // Llama 3: non-space text seen (a call can only open the reply).
  bool after_call_ = false;  // Whitespace after a call is dropped.
};

}  // namespace sluice::llm
