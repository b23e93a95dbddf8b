// Renders a model's chat template: the subset of Jinja that Hugging Face chat templates use, with
// transformers' environment settings (trim_blocks, lstrip_blocks). Statements: for (with loop.*
// and an `if` filter), if/elif/else, set; expressions: literals, names, attributes, subscripts
// and slices, + - * / % ~, comparisons, and/or/not, in, is [not] defined/none/string,
// conditional expressions, filters (trim, length, upper, lower, tojson, default, join),
// string methods (strip, startswith, endswith, split...), raise_exception(). Anything else is
// a parse error at load time, not a wrong prompt at run time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

// A function call an assistant message made (OpenAI's tool_calls[i]).
struct ToolCallRecord {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text; the template sees the object it holds.
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::string name;          // OpenAI's participant name; the template sees message.name when set.
  std::string tool_call_id;  // Role "tool": the call this message answers.
  std::vector<ToolCallRecord> tool_calls;  // Role "assistant": the calls it made.
  // Role "assistant": its reasoning, as a reply gave it back; the template sees
  // message.reasoning_content (and message.thinking, where it reads that: gpt-oss's) when set and
  // keeps or drops it as it was written to.
  std::string reasoning_content;
};

// A JSON document as a template variable (objects keep their key order).
struct TemplateJson {
  std::string text;
};

// A request's extra template variable (OpenAI-style servers' chat_template_kwargs, such as
// Qwen3's enable_thinking; `tools`, as JSON).
using TemplateArgument = std::variant<bool, int64_t, std::string, TemplateJson>;

// Immutable after Parse(); thread-safe.
class ChatTemplate {
 public:
  static Result<std::unique_ptr<ChatTemplate>> Parse(const std::string& source);
  ~ChatTemplate();

  // kInvalidArgument when the template raises (e.g. "roles must alternate"). `arguments` are set
  // after `variables` (and may not be messages or add_generation_prompt: the caller checks).
  Result<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             const std::map<std::string, std::string>& variables = {},
                             const std::map<std::string, TemplateArgument>& arguments = {}) const;

  // Whether the template knows thinking blocks (it writes "</think>"): its replies' reasoning is
  // told apart from their answer (text/reasoning.h).
  bool thinks() const { return thinks_; }
  // Whether its replies carry reasoning apart from their answer: a thinking block, or harmony's
  // analysis channel (gpt-oss's, text/harmony.h), whose model always reasons.
  bool reasons() const { return thinks_ || harmony_; }
  // Whether the template renders a `tools` variable (function definitions for tool calling).
  bool renders_tools() const { return renders_tools_; }
  const std::string& source() const { return source_; }

  struct Node;

 private:
  ChatTemplate() = default;
  std::vector<std::unique_ptr<Node>> body_;
  bool thinks_ = false;
  bool harmony_ = false;
  bool renders_tools_ = false;
  bool content_none_ = false;    // It tests a message's content against none.
  bool reads_thinking_ = false;  // It reads message.thinking (gpt-oss's): reasoning_content.
  std::string source_;
};

}  // namespace sluice::llm
