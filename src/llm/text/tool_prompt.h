// Tools for a chat template that renders none (Gemma 2 and 3, Phi-3, Llama 2, ...): the
// conversation rewritten so such a template carries them. The tools' definitions and how to call
// them lead the conversation; earlier calls become the assistant's text in that form (a JSON
// array of {"name", "arguments"}, which the JSON fallback parser reads back), and tool results
// become user turns naming their function, so a template that insists on alternating user and
// assistant turns still renders an agent's history.
#pragma once

#include <string>
#include <vector>

#include "llm/text/chat_template.h"

namespace sluice::llm {

// Where the tools' preamble goes: into the system message (one is opened where there is none),
// or, for templates that refuse a system role, at the head of the first user message.
enum class ToolPreamblePlace { kSystem, kFirstUser };

// `messages` with `definitions` (the request's tools, as JSON text; empty: none offered, the
// history's calls and results rewritten all the same) and their calls and results written as
// text. `parallel`: more than one call in a reply.
std::vector<ChatMessage> ToolsInConversation(const std::vector<ChatMessage>& messages,
                                             const std::string& definitions, bool parallel,
                                             ToolPreamblePlace place);

}  // namespace sluice::llm
