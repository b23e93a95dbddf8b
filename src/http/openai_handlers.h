// The OpenAI-style language-model routes: GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions, with `stream: true` as server-sent events in OpenAI's shape,
// POST /v1/embeddings (embedding models: config.yaml's llm.embedding); and
// vLLM's POST /tokenize ({"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens"}) and
// POST /detokenize ({"tokens"} -> {"prompt"}). Bodies are parsed into typed requests first
// (openai_request.h) and run by the generation service (llm/generation_service.h), whose events
// these handlers write in OpenAI's shape (message.tool_calls, delta.tool_calls, reasoning_content);
// nothing below them sees JSON of the protocol.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/json_writer.h"
#include "http/llm_front.h"
#include "http/router.h"
#include "llm/generation_service.h"

namespace sluice {

// Thread-safe. The language models it serves are the generation service's, which the model
// repository owns (service/model_repository.h).
class OpenAiHandlers {
 public:
  explicit OpenAiHandlers(llm::GenerationService& service);

  void AddRoutes(Router& router);
  void Models(const HttpRequest&, const PathParams&, Responder respond);
  // GET /v1/models/{model}: one model (or LoRA adapter) as the list gives it; 404 naming it.
  void Model(const HttpRequest&, const PathParams& params, Responder respond);
  void WriteModel(JsonWriter& json, const std::string& id, const std::string& parent,
                  const llm::LlmEngine& engine) const;
  // A language model of the repository not loaded: its id and its state ("unloaded", ...).
  void WriteUnloadedModel(JsonWriter& json, const std::string& id, const std::string& state) const;
  void ChatCompletions(const HttpRequest& request, const PathParams&, Responder respond);
  void Completions(const HttpRequest& request, const PathParams&, Responder respond);
  void RenderChatCompletion(const HttpRequest& request, const PathParams&, Responder respond);
  void RenderCompletion(const HttpRequest& request, const PathParams&, Responder respond);
  void Render(const HttpRequest& request, bool chat, Responder respond);
  void Tokenize(const HttpRequest& request, const PathParams&, Responder respond);
  void Detokenize(const HttpRequest& request, const PathParams&, Responder respond);
  void Embeddings(const HttpRequest& request, const PathParams&, Responder respond);
  void Rerank(const HttpRequest& request, const PathParams&, Responder respond);
  // vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
  // {"lora_name"}, where config.yaml's llm.lora.runtime_loading opens them (`model` names the
  // base where several are served).
  void LoadLoraAdapter(const HttpRequest& request, const PathParams&, Responder respond);
  void UnloadLoraAdapter(const HttpRequest& request, const PathParams&, Responder respond);

  // Prometheus series of every language model (tokens, TTFT, inter-token latency, slots).
  std::string RenderMetrics() const;
  bool empty() const { return service_.models().empty(); }
  llm::GenerationService& service() { return service_; }

 private:
  void Generate(const HttpRequest& request, bool chat, Responder respond);

  llm::GenerationService& service_;
  const int64_t created_;  // Unix seconds at start, the `created` of every model.
};

// The number in a reply's id ("chatcmpl-N", "cmpl-N", "rerank-N"): unique in the process.
uint64_t NextReplyId();

// {"error": {"message", "type", "param", "code"}} with the status's HTTP code (503 adds
// Retry-After: `retry_after_seconds`).
HttpResponse OpenAiError(const Status& status, std::string_view param = {},
                         double retry_after_seconds = 1);

// A reply to a generation in OpenAI's error shape (chat, completions, the Responses API).
class OpenAiReply final : public FrontReply {
 public:
  using FrontReply::FrontReply;

 private:
  HttpResponse Error(const Status& status, std::string_view param,
                     double retry_after_seconds) const override {
    return OpenAiError(status, param, retry_after_seconds);
  }
};

}  // namespace sluice
