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

struct ChatMessage {
  std::string role;
  std::string content;
  std::string name;  // OpenAI's participant name; the template sees message.name when set.
};

// A request's extra template variable (OpenAI-style servers' chat_template_kwargs, such as
// Qwen3's enable_thinking).
using TemplateArgument = std::variant<bool, int64_t, std::string>;

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

  struct Node;

 private:
  ChatTemplate() = default;
  std::vector<std::unique_ptr<Node>> body_;
  bool thinks_ = false;
};

}  // namespace sluice::llm
