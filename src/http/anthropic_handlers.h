// Anthropic's Messages API over the generation service, for clients written against it (the
// Anthropic SDKs; coding agents that speak it): POST /v1/messages, its reply as a message of
// content blocks (thinking, text, tool_use) or, with `stream`, Anthropic's server-sent events
// (message_start, content_block_start / _delta / _stop, message_delta with the stop_reason,
// message_stop); POST /v1/messages/count_tokens. Errors in Anthropic's shape
// ({"type": "error", "error": {"type", "message"}}). The request parser is anthropic_request.h;
// the template, tool calls, reasoning and grammars are the generation service's, as for the
// OpenAI routes.
#pragma once

#include "http/router.h"
#include "llm/generation_service.h"

namespace sluice {

// Thread-safe. `service` outlives it.
class AnthropicHandlers {
 public:
  explicit AnthropicHandlers(llm::GenerationService& service) : service_(service) {}

  void AddRoutes(Router& router);
  void Messages(const HttpRequest& request, const PathParams&, Responder respond);
  void CountTokens(const HttpRequest& request, const PathParams&, Responder respond);

 private:
  llm::GenerationService& service_;
};

// {"type": "error", "error": {"type": "invalid_request_error" | "not_found_error" |
// "overloaded_error" | "api_error", "message"}} with the status's HTTP code (503 adds
// Retry-After).
HttpResponse AnthropicError(const Status& status, double retry_after_seconds = 1);

}  // namespace sluice
