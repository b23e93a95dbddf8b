// The OpenAI-style language-model routes: GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions, with `stream: true` as server-sent events in OpenAI's shape; and
// vLLM's POST /tokenize ({"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens"}) and
// POST /detokenize ({"tokens"} -> {"prompt"}). Bodies are parsed into typed requests first
// (openai_request.h); the engine (llm/llm_engine.h) never sees JSON. `response_format` compiles to
// a grammar (llm/grammar.h) that constrains the request's tokens.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "llm/llm_engine.h"
#include "server/router.h"

namespace sluice {

// Thread-safe: the model table is fixed at construction.
class OpenAiHandlers {
 public:
  explicit OpenAiHandlers(std::map<std::string, std::shared_ptr<llm::LlmEngine>> models);

  void AddRoutes(Router& router);
  void Models(const HttpRequest&, const PathParams&, Responder respond);
  void ChatCompletions(const HttpRequest& request, const PathParams&, Responder respond);
  void Completions(const HttpRequest& request, const PathParams&, Responder respond);
  void Tokenize(const HttpRequest& request, const PathParams&, Responder respond);
  void Detokenize(const HttpRequest& request, const PathParams&, Responder respond);

  // Prometheus series of every language model (tokens, TTFT, inter-token latency, slots).
  std::string RenderMetrics() const;
  bool empty() const { return models_.empty(); }

 private:
  void Generate(const HttpRequest& request, bool chat, Responder respond);
  // The engine serving `model`; an empty name is the only model where there is one (and is set
  // to its name). kNotFound naming an unknown model; kInvalidArgument for no name among several.
  Result<std::shared_ptr<llm::LlmEngine>> Find(std::string& model) const;
  // The conversation through the model's chat template (kInvalidArgument where it has none).
  static Result<std::string> RenderChat(
      const llm::LlmEngine& engine, const std::string& model,
      const std::vector<llm::ChatMessage>& messages, bool add_generation_prompt,
      const std::map<std::string, llm::TemplateArgument>& arguments = {});

  std::map<std::string, std::shared_ptr<llm::LlmEngine>> models_;
  const int64_t created_;  // Unix seconds at start, the `created` of every model.
  // Compiles response formats' grammars (last: its thread stops first, before the models go).
  ThreadPool grammar_pool_{1, 64};
};

// {"error": {"message", "type", "param", "code"}} with the status's HTTP code (503 adds
// Retry-After: `retry_after_seconds`).
HttpResponse OpenAiError(const Status& status, std::string_view param = {},
                         double retry_after_seconds = 1);

}  // namespace sluice
