// OpenAI's Responses API over the generation service (what the OpenAI Agents SDK and the
// SDK's client.responses speak): POST /v1/responses, its reply as a response object of output
// items (reasoning, message, function_call) or, with `stream`, OpenAI's events
// (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta / .done,
// response.reasoning_text.delta, response.function_call_arguments.delta / .done,
// response.output_item.done, response.completed or response.incomplete, each with its
// sequence_number); GET and DELETE /v1/responses/{id} on the bounded store (response_store.h)
// that previous_response_id continues from. The request parser is responses_request.h; the
// template, tool calls, reasoning and grammars are the generation service's. Errors in OpenAI's
// shape.
#pragma once

#include <cstddef>

#include "http/response_store.h"
#include "http/router.h"
#include "llm/generation_service.h"

namespace sluice {

struct ResponseStoreOptions {
  size_t max_count = 4096;        // Responses kept at most ...
  size_t max_bytes = 128u << 20;  // ... and their bytes at most; the least recently used go.
};

// Thread-safe. `service` outlives it.
class ResponsesHandlers {
 public:
  ResponsesHandlers(llm::GenerationService& service, ResponseStoreOptions options)
      : service_(service), store_(options.max_count, options.max_bytes) {}

  void AddRoutes(Router& router);
  void Create(const HttpRequest& request, const PathParams&, Responder respond);
  void Retrieve(const HttpRequest& request, const PathParams& params, Responder respond);
  void Delete(const HttpRequest& request, const PathParams& params, Responder respond);
  void InputItems(const HttpRequest& request, const PathParams& params, Responder respond);

  ResponseStore& store() { return store_; }

 private:
  llm::GenerationService& service_;
  ResponseStore store_;
};

}  // namespace sluice
