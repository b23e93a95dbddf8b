// Anthropic's Messages API bodies (POST /v1/messages and /v1/messages/count_tokens) to the
// generation service's typed request: `system` (a string or text blocks), messages of content
// blocks (text, tool_use, tool_result, thinking) turned into the chat messages a template renders
// (an assistant's tool_use blocks its tool_calls, a tool_result a tool message), `tools` with
// their input_schema, tool_choice auto/any/tool/none, stop_sequences, sampling. A parameter or
// block Sluice does not serve (images, documents, built-in tools, redacted thinking) is refused
// by name, never dropped.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "http/request_fields.h"
#include "llm/generation_service.h"

namespace sluice::anthropic {

using fields::ParseError;

struct MessagesRequest : llm::GenerateRequest {
  std::string model;  // "": the one model served.
  bool stream = false;
  // `thinking`: {"type": "enabled"} (true) or {"type": "disabled"} (false); unset where not given
  // or "adaptive" (the template's own default).
  std::optional<bool> thinking;
  bool omit_thinking = false;  // thinking.display "omitted": thinking blocks come back empty.
};

// `count_tokens`: the count_tokens body (no max_tokens, stream or sampling).
std::optional<ParseError> ParseMessages(std::string_view body, bool count_tokens,
                                        MessagesRequest& r);

}  // namespace sluice::anthropic
