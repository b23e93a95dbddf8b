// OpenAI-style request bodies to typed requests, before anything reaches an engine: the
// completions and chat completions bodies, and vLLM's /tokenize and /detokenize. A parameter
// Sluice does not serve is refused by name, never ignored; every error names its parameter.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/sampler.h"
#include "llm/text/chat_template.h"

namespace sluice::openai {

struct ParseError {
  std::string message;
  std::string param;  // The request parameter at fault; "" for the body as a whole.
};

// `response_format`: free text, any JSON object (JSON mode), or documents of a JSON schema.
struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  std::string schema;  // kJsonSchema: the schema, as JSON text.
};

struct CompletionRequest {
  std::string model;
  std::vector<llm::ChatMessage> messages;  // Chat.
  std::string prompt;                      // Completions.
  bool stream = false;
  bool include_usage = false;
  int max_tokens = 0;  // 0: the model's default.
  llm::SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int n = 1;              // Choices, each sampled from the prompt on its own.
  int top_logprobs = -1;  // -1: no log-probabilities; else alternatives per token (0-20).
  ResponseFormat response_format;
  // Chat: chat_template_kwargs, extra variables for the model's chat template (Qwen3's
  // enable_thinking, ...): booleans, integers or strings.
  std::map<std::string, llm::TemplateArgument> template_arguments;
};

// POST /v1/chat/completions (`chat`) or /v1/completions.
std::optional<ParseError> ParseCompletion(std::string_view body, bool chat, CompletionRequest& r);

struct TokenizeRequest {
  std::string model;
  bool chat = false;  // `messages` given (rendered by the chat template), else `prompt`.
  std::string prompt;
  std::vector<llm::ChatMessage> messages;
  bool add_special_tokens = true;  // Default: true for a prompt, false for messages.
  bool add_generation_prompt = true;
};
std::optional<ParseError> ParseTokenize(std::string_view body, TokenizeRequest& r);

struct DetokenizeRequest {
  std::string model;
  std::vector<int64_t> tokens;  // Unchecked against a vocabulary.
};
std::optional<ParseError> ParseDetokenize(std::string_view body, DetokenizeRequest& r);

}  // namespace sluice::openai
