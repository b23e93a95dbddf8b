// OpenAI-style request bodies to typed requests, before anything reaches an engine: the
// completions and chat completions bodies, and vLLM's /tokenize and /detokenize. A parameter
// Sluice does not serve is refused by name, never ignored; every error names its parameter.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/request_fields.h"
#include "llm/generation_service.h"
#include "llm/text/chat_template.h"

namespace sluice::openai {

using fields::ParseError;

using ResponseFormat = llm::ResponseFormat;

// What the generation service runs (llm/generation_service.h), and what the route itself keeps.
struct CompletionRequest : llm::GenerateRequest {
  std::string model;  // "": the one model served.
  bool stream = false;
  bool include_usage = false;
  // Ollama's keep_alive: how long the model stays loaded once idle, from this request on.
  std::optional<std::chrono::milliseconds> keep_alive;
};

// POST /v1/chat/completions (`chat`) or /v1/completions.
std::optional<ParseError> ParseCompletion(std::string_view body, bool chat, CompletionRequest& r);

// POST /v1/embeddings: `input` as a string, a list of strings, token ids or a list of them.
struct EmbeddingsRequest {
  std::string model;
  std::optional<std::chrono::milliseconds> keep_alive;  // As CompletionRequest's.
  std::vector<llm::EmbeddingInput> inputs;
  bool base64 = false;     // encoding_format "base64": little-endian float32, base64-encoded.
  int64_t dimensions = 0;  // 0: not given.
};
std::optional<ParseError> ParseEmbeddings(std::string_view body, EmbeddingsRequest& r);

// POST /v1/rerank (also /rerank and /v2/rerank), the shape Jina's and Cohere's rerank APIs share
// and llama.cpp and vLLM serve: a query, documents (strings or {"text": ...}), top_n, and
// return_documents.
struct RerankRequest {
  std::string model;
  std::string query;
  std::vector<std::string> documents;
  int64_t top_n = 0;  // 0: every document.
  bool return_documents = false;
};
std::optional<ParseError> ParseRerank(std::string_view body, RerankRequest& r);

// vLLM's /v1/load_lora_adapter ({"lora_name", "lora_path"}) and /v1/unload_lora_adapter
// ({"lora_name"}) bodies, with `model` naming the base model where several are served.
struct LoraAdapterRequest {
  std::string model;
  std::string name;
  std::string path;  // Load only.
};
std::optional<ParseError> ParseLoraAdapter(std::string_view body, bool load, LoraAdapterRequest& r);

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
