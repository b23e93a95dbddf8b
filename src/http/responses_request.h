// OpenAI's Responses API bodies (POST /v1/responses) to the generation service's typed request:
// `input` as a string or a list of items (messages with input_text / output_text parts,
// function_call, function_call_output, reasoning) turned into the chat messages a template
// renders, `instructions`, function `tools` (flat, strict by default as OpenAI has them),
// `tool_choice`, `parallel_tool_calls`, `text.format`, `max_output_tokens`, sampling,
// `reasoning.effort`, `store`, `previous_response_id`. What Sluice does not serve (built-in tools,
// background, conversations, images and files, truncation "auto") is refused by name.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/request_fields.h"
#include "llm/generation_service.h"

namespace sluice::responses {

using fields::ParseError;

struct ResponsesRequest : llm::GenerateRequest {
  std::string model;  // "": the one model served.
  bool stream = false;
  bool store = true;
  std::string previous_response_id;
  std::optional<std::string> instructions;  // A system message before the conversation.
  std::vector<llm::ChatMessage> input;      // This request's items, as chat messages ...
  // ... and as JSON objects, as given (a string input as one user message item); ids are given
  // to those without when stored (GET /v1/responses/{id}/input_items lists them).
  std::vector<std::string> input_items;
  std::string reasoning_effort;             // "": not given.
  // Echoed in the response object as given (JSON text).
  std::string tools_json = "[]";
  std::string tool_choice_json = "\"auto\"";
  std::string text_json = R"({"format":{"type":"text"}})";
  std::string reasoning_json = "null";
  std::string metadata_json = "{}";
  int max_output_tokens = 0;  // 0: not given.
};

std::optional<ParseError> ParseResponses(std::string_view body, ResponsesRequest& r);

}  // namespace sluice::responses
