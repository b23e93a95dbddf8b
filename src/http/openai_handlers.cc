#include "http/openai_handlers.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "codec/base64.h"
#include "common/json_writer.h"
#include "common/mutex.h"
#include "http/llm_front.h"
#include "http/openai_request.h"
#include "metrics/prometheus.h"

namespace sluice {
namespace {

using openai::CompletionRequest;

std::string_view ErrorType(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kPayloadTooLarge:
      return "invalid_request_error";
    case StatusCode::kUnavailable:
      return "service_unavailable";
    default:
      return "server_error";
  }
}

// The shared part of every chunk and response object.
void BeginObject(JsonWriter& json, const std::string& id, std::string_view object, int64_t created,
                 const std::string& model, const std::string& fingerprint) {
  json.BeginObject().Field("id", id).Field("object", object).Field("created", created);
  json.Field("model", model).Field("system_fingerprint", fingerprint);
}

// `cached`: of the prompt's tokens, those the prefix cache held (OpenAI's cached_tokens).
void WriteUsage(JsonWriter& json, int prompt, int completion, int cached) {
  json.Key("usage").BeginObject().Field("prompt_tokens", int64_t{prompt});
  json.Field("completion_tokens", int64_t{completion});
  json.Field("total_tokens", int64_t{prompt + completion});
  json.Key("prompt_tokens_details").BeginObject().Field("cached_tokens", int64_t{cached});
  json.EndObject().EndObject();
}

// A token as OpenAI's log-probability entries show it: its text, or where its bytes are not whole
// UTF-8 characters, "bytes:" and their escapes (vLLM's form).
std::string TokenText(const llm::Tokenizer& tokenizer, int32_t id) {
  const std::string& bytes = tokenizer.TokenBytes(id);
  if (llm::IsValidUtf8(bytes)) return bytes;
  std::string escaped = "bytes:";
  for (unsigned char byte : bytes) escaped += fmt::format("\\x{:02x}", byte);
  return escaped;
}

// "token", and its bytes as numbers.
void WriteToken(JsonWriter& json, const llm::Tokenizer& tokenizer, int32_t id) {
  json.Field("token", TokenText(tokenizer, id)).Key("bytes").BeginArray();
  for (unsigned char byte : tokenizer.TokenBytes(id)) json.Int(byte);
  json.EndArray();
}

// Chat's "logprobs": {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}.
void WriteChatLogprobs(JsonWriter& json, const llm::Tokenizer& tokenizer,
                       const std::vector<llm::TokenLogprobs>& tokens) {
  json.Key("logprobs").BeginObject().Key("content").BeginArray();
  for (const llm::TokenLogprobs& t : tokens) {
    json.BeginObject();
    WriteToken(json, tokenizer, t.chosen.token);
    json.Field("logprob", static_cast<double>(t.chosen.logprob)).Key("top_logprobs").BeginArray();
    for (const llm::TokenLogprob& alternative : t.top) {
      json.BeginObject();
      WriteToken(json, tokenizer, alternative.token);
      json.Field("logprob", static_cast<double>(alternative.logprob)).EndObject();
    }
    json.EndArray().EndObject();
  }
  json.EndArray().EndObject();
}

// Completions' "logprobs": {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
void WriteCompletionLogprobs(JsonWriter& json, const llm::Tokenizer& tokenizer,
                             const std::vector<llm::TokenLogprobs>& tokens, int64_t offset) {
  json.Key("logprobs").BeginObject().Key("tokens").BeginArray();
  for (const llm::TokenLogprobs& t : tokens) json.String(TokenText(tokenizer, t.chosen.token));
  json.EndArray().Key("token_logprobs").BeginArray();
  for (const llm::TokenLogprobs& t : tokens) json.Double(t.chosen.logprob);
  json.EndArray().Key("top_logprobs").BeginArray();
  for (const llm::TokenLogprobs& t : tokens) {
    json.BeginObject();
    for (const llm::TokenLogprob& alternative : t.top) {
      json.Field(TokenText(tokenizer, alternative.token), static_cast<double>(alternative.logprob));
    }
    json.EndObject();
  }
  json.EndArray().Key("text_offset").BeginArray();
  for (const llm::TokenLogprobs& t : tokens) {
    json.Int(offset);
    offset += static_cast<int64_t>(tokenizer.TokenBytes(t.chosen.token).size());
  }
  json.EndArray().EndObject();
}

// Starts a pooled run (embeddings, reranking) and cancels it when the client leaves. The hook is
// set before `start`: an answer given at once (a bad input) must find it set, so the connection
// drops it.
void StartCancellable(const HttpRequest& request, const std::function<void(HttpResponse)>& answer,
                      const std::function<std::shared_ptr<llm::Generation>()>& start) {
  auto link = std::make_shared<CancelLink>();
  if (request.on_disconnect) {
    request.on_disconnect([link, answer] {
      if (link->Cancel()) answer(OpenAiError(Status::Cancelled("the client disconnected")));
    });
  }
  link->Attach(start());
}

// One of a request's n choices as the reply gives it.
struct Choice {
  std::string content;  // Non-streaming: the whole reply.
  std::string reasoning;
  std::vector<llm::ToolCall> tool_calls;
  std::vector<llm::TokenLogprobs> logprobs;
  int64_t text_offset = 0;  // Completions: bytes of this choice's tokens already reported.
  int completion_tokens = 0;
  llm::FinishReason finish = llm::FinishReason::kNone;
  bool sent_role = false;
};

// A streamed chat chunk's delta beside its content: reasoning, or one tool call's start (id and
// name) or arguments.
struct Delta {
  std::string_view content, reasoning;
  const llm::ToolCall* call = nullptr;
  int call_index = 0;
  bool call_start = false;  // The call's id, type and name (and empty arguments); else arguments.
};

void WriteToolCalls(JsonWriter& json, const std::vector<llm::ToolCall>& calls) {
  json.Key("tool_calls").BeginArray();
  for (const llm::ToolCall& call : calls) {
    json.BeginObject().Field("id", call.id).Field("type", "function").Key("function");
    json.BeginObject().Field("name", call.name).Field("arguments", call.arguments).EndObject();
    json.EndObject();
  }
  json.EndArray();
}

// One response to one generation (its n choices) in OpenAI's shape: a body, or server-sent
// events (see EventWriter for which thread runs what).
class Writer final : public EventWriter {
 public:
  Writer(std::shared_ptr<const llm::Tokenizer> tokenizer, int n)
      : tokenizer_(std::move(tokenizer)), choices_(static_cast<size_t>(n)) {}

  std::string id, model;
  std::string fingerprint;  // system_fingerprint: the server's version and the model's formats.
  bool chat = false;
  bool thinks = false;  // The template's replies reason: messages carry reasoning_content.
  bool include_usage = false;
  int top_logprobs = -1;  // -1: no log-probabilities.
  int64_t created = 0;

  std::string StreamFailure(const Status& error) override {
    JsonWriter json;
    json.BeginObject().Key("error").BeginObject().Field("message", error.message());
    json.Field("type", "server_error").Key("param").Null().Key("code").Null();
    json.EndObject().EndObject();
    return "data: " + json.str() + "\n\n";
  }

  void Add(const llm::ChoiceEvent& event) override {
    Count(event);
    Choice& choice = choices_[event.index];
    choice.content += event.content;
    choice.reasoning += event.reasoning;
    choice.tool_calls.insert(choice.tool_calls.end(), event.tool_calls.begin(),
                             event.tool_calls.end());
    choice.logprobs.insert(choice.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  }

  // The non-streamed response.
  std::string Body() override {
    JsonWriter json;
    BeginObject(json, id, chat ? "chat.completion" : "text_completion", created, model,
                fingerprint);
    json.Key("choices").BeginArray();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      json.BeginObject().Field("index", static_cast<int64_t>(i));
      if (chat) {
        json.Key("message").BeginObject().Field("role", "assistant").Key("content");
        if (c.content.empty() && !c.tool_calls.empty()) {
          json.Null();
        } else {
          json.String(c.content);
        }
        if (thinks) {
          json.Key("reasoning_content");
          if (c.reasoning.empty()) {
            json.Null();
          } else {
            json.String(c.reasoning);
          }
        }
        if (!c.tool_calls.empty()) WriteToolCalls(json, c.tool_calls);
        json.EndObject();
      } else {
        json.Field("text", c.content);
      }
      WriteLogprobs(json, c, c.logprobs);
      json.Field("finish_reason", llm::FinishReasonName(c.finish)).EndObject();
    }
    json.EndArray();
    WriteUsage(json, prompt_tokens_, CompletionTokens(), cached_tokens_);
    json.EndObject();
    return json.str();
  }

  std::string StreamChoice(const llm::ChoiceEvent& event, bool last) override {
    Count(event);
    Choice& choice = choices_[event.index];
    std::string out;
    if (!choice.sent_role && chat) {
      out += Chunk(event.index, {}, llm::FinishReason::kNone, {});
      choice.sent_role = true;
    }
    if (!event.content.empty() || !event.reasoning.empty() || !event.logprobs.empty()) {
      out += Chunk(event.index, Delta{event.content, event.reasoning}, llm::FinishReason::kNone,
                   event.logprobs);
      for (const llm::TokenLogprobs& t : event.logprobs) {
        choice.text_offset += static_cast<int64_t>(tokenizer_->TokenBytes(t.chosen.token).size());
      }
    }
    // A call's first delta names it; the next carries its arguments.
    for (size_t k = 0; k < event.tool_calls.size(); ++k) {
      Delta delta;
      delta.call = &event.tool_calls[k];
      delta.call_index = event.first_tool_call + static_cast<int>(k);
      delta.call_start = true;
      out += Chunk(event.index, delta, llm::FinishReason::kNone, {});
      delta.call_start = false;
      out += Chunk(event.index, delta, llm::FinishReason::kNone, {});
    }
    if (event.finish != llm::FinishReason::kNone) {
      out += Chunk(event.index, {}, event.finish, {});
      if (last) {
        if (include_usage) {
          JsonWriter json;
          BeginObject(json, id, chat ? "chat.completion.chunk" : "text_completion", created, model,
                      fingerprint);
          json.Key("choices").BeginArray().EndArray();
          WriteUsage(json, prompt_tokens_, CompletionTokens(), cached_tokens_);
          json.EndObject();
          out += "data: " + json.str() + "\n\n";
        }
        out += "data: [DONE]\n\n";
      }
    }
    return out;
  }

 private:
  // The counts an event brings, streamed or not.
  void Count(const llm::ChoiceEvent& event) {
    Choice& choice = choices_[event.index];
    choice.completion_tokens = event.completion_tokens;
    prompt_tokens_ = event.prompt_tokens;
    // The first choice's: the others share its prompt's blocks.
    if (event.index == 0) cached_tokens_ = event.cached_prompt_tokens;
    if (event.finish != llm::FinishReason::kNone) choice.finish = event.finish;
  }

  void WriteLogprobs(JsonWriter& json, const Choice& choice,
                     const std::vector<llm::TokenLogprobs>& tokens) const {
    if (top_logprobs < 0) {
      json.Key("logprobs").Null();
    } else if (chat) {
      WriteChatLogprobs(json, *tokenizer_, tokens);
    } else {
      WriteCompletionLogprobs(json, *tokenizer_, tokens, choice.text_offset);
    }
  }

  // data: {...}\n\n for one streamed chunk of choice `index`.
  std::string Chunk(size_t index, const Delta& delta, llm::FinishReason finish,
                    const std::vector<llm::TokenLogprobs>& tokens) const {
    const Choice& choice = choices_[index];
    JsonWriter json;
    BeginObject(json, id, chat ? "chat.completion.chunk" : "text_completion", created, model,
                fingerprint);
    json.Key("choices").BeginArray().BeginObject().Field("index", static_cast<int64_t>(index));
    if (chat) {
      json.Key("delta").BeginObject();
      if (!choice.sent_role) json.Field("role", "assistant");
      if (!delta.reasoning.empty()) json.Field("reasoning_content", delta.reasoning);
      if (!delta.content.empty() || !choice.sent_role) json.Field("content", delta.content);
      if (delta.call != nullptr) {
        json.Key("tool_calls").BeginArray().BeginObject();
        json.Field("index", int64_t{delta.call_index});
        if (delta.call_start) json.Field("id", delta.call->id).Field("type", "function");
        json.Key("function").BeginObject();
        if (delta.call_start) json.Field("name", delta.call->name);
        json.Field("arguments", delta.call_start ? std::string_view() : delta.call->arguments);
        json.EndObject().EndObject().EndArray();
      }
      json.EndObject();
    } else {
      json.Field("text", delta.content);
    }
    if (tokens.empty()) {
      json.Key("logprobs").Null();
    } else {
      WriteLogprobs(json, choice, tokens);
    }
    json.Key("finish_reason");
    if (finish == llm::FinishReason::kNone) {
      json.Null();
    } else {
      json.String(llm::FinishReasonName(finish));
    }
    json.EndObject().EndArray();
    if (include_usage) json.Key("usage").Null();
    json.EndObject();
    return "data: " + json.str() + "\n\n";
  }

  int CompletionTokens() const {
    int total = 0;
    for (const Choice& choice : choices_) total += choice.completion_tokens;
    return total;
  }

  // Kept so a reply rendered after its model unloads still reads its tokens' text.
  const std::shared_ptr<const llm::Tokenizer> tokenizer_;
  std::vector<Choice> choices_;
  int prompt_tokens_ = 0;
  int cached_tokens_ = 0;
};

}  // namespace

HttpResponse OpenAiError(const Status& status, std::string_view param, double retry_after_seconds) {
  JsonWriter json;
  json.BeginObject().Key("error").BeginObject().Field("message", status.message());
  json.Field("type", ErrorType(status.code())).Key("param");
  if (param.empty()) {
    json.Null();
  } else {
    json.String(param);
  }
  json.Field("code", StatusCodeName(status.code())).EndObject().EndObject();
  HttpResponse response = HttpResponse::Json(HttpStatusFor(status.code()), json.str());
  if (status.code() == StatusCode::kUnavailable) {
    response.headers.emplace_back(
        "Retry-After", std::to_string(static_cast<int64_t>(std::ceil(
                           std::max(retry_after_seconds, status.retry_after_seconds())))));
  }
  return response;
}

OpenAiHandlers::OpenAiHandlers(llm::GenerationService& service)
    : service_(service), created_(UnixSeconds()) {}

uint64_t NextReplyId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void OpenAiHandlers::AddRoutes(Router& router) {
  auto bind = [this](auto method) {
    return [this, method](const HttpRequest& request, const PathParams& params, Responder respond) {
      (this->*method)(request, params, std::move(respond));
    };
  };
  router.Get("/v1/models", bind(&OpenAiHandlers::Models));
  router.Get("/v1/models/{model}", bind(&OpenAiHandlers::Model));
  router.Post("/v1/chat/completions", bind(&OpenAiHandlers::ChatCompletions));
  router.Post("/v1/completions", bind(&OpenAiHandlers::Completions));
  router.Post("/v1/chat/completions/render", bind(&OpenAiHandlers::RenderChatCompletion));
  router.Post("/v1/completions/render", bind(&OpenAiHandlers::RenderCompletion));
  router.Post("/tokenize", bind(&OpenAiHandlers::Tokenize));
  router.Post("/detokenize", bind(&OpenAiHandlers::Detokenize));
  router.Post("/v1/embeddings", bind(&OpenAiHandlers::Embeddings));
  for (const char* path : {"/v1/rerank", "/rerank", "/v2/rerank"}) {
    router.Post(path, bind(&OpenAiHandlers::Rerank));
  }
  router.Post("/v1/load_lora_adapter", bind(&OpenAiHandlers::LoadLoraAdapter));
  router.Post("/v1/unload_lora_adapter", bind(&OpenAiHandlers::UnloadLoraAdapter));
}

void OpenAiHandlers::Embeddings(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::EmbeddingsRequest parsed;
  if (auto error = openai::ParseEmbeddings(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = service_.Find(parsed.model);
  if (!found.ok()) {
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond,
                    RunAgain(this, &OpenAiHandlers::Embeddings))) {
      return;
    }
    return respond(OpenAiError(found.status(), "model"));
  }
  std::shared_ptr<llm::LlmEngine> engine = *found;
  if (parsed.keep_alive) engine->SetKeepAlive(*parsed.keep_alive);
  if (engine->config().pooling == llm::Pooling::kNone) {
    return respond(
        OpenAiError(Status::InvalidArgument(fmt::format(
                        "model '{}' generates text and gives no embeddings", parsed.model)),
                    "model"));
  }
  if (engine->model().classifies()) {
    return respond(OpenAiError(
        Status::InvalidArgument(fmt::format(
            "model '{}' is a reranker (a cross-encoder) and gives no embeddings: use /v1/rerank",
            parsed.model)),
        "model"));
  }
  const int64_t width = engine->model().row_width();
  if (parsed.dimensions != 0 && parsed.dimensions != width) {
    return respond(OpenAiError(
        Status::InvalidArgument(fmt::format("'dimensions' {} is not supported: model '{}' gives "
                                            "embeddings of {} dimensions only",
                                            parsed.dimensions, parsed.model, width)),
        "dimensions"));
  }
  auto answer = AnswerOnce(respond);
  auto done = [answer, engine, model = parsed.model,
               base64 = parsed.base64](Result<llm::Embeddings> result) {
    if (!result.ok()) {
      return answer(OpenAiError(
          result.status(), result.status().code() == StatusCode::kInvalidArgument ? "input" : "",
          engine->EstimatedWaitSeconds()));
    }
    JsonWriter json;
    json.BeginObject().Field("object", "list").Key("data").BeginArray();
    for (size_t i = 0; i < result->vectors.size(); ++i) {
      const std::vector<float>& vector = result->vectors[i];
      json.BeginObject().Field("object", "embedding").Field("index", static_cast<int64_t>(i));
      json.Key("embedding");
      if (base64) {
        // Little-endian float32, as OpenAI's clients decode it.
        std::string bytes(vector.size() * sizeof(float), '\0');
        std::memcpy(bytes.data(), vector.data(), bytes.size());
        json.String(Base64Encode(bytes));
      } else {
        json.BeginArray();
        for (const float v : vector) json.Double(v);
        json.EndArray();
      }
      json.EndObject();
    }
    json.EndArray().Field("model", model).Key("usage").BeginObject();
    json.Field("prompt_tokens", int64_t{result->prompt_tokens});
    json.Field("total_tokens", int64_t{result->prompt_tokens}).EndObject().EndObject();
    answer(HttpResponse::Json(200, json.str()));
  };
  StartCancellable(request, answer,
                   [&] { return service_.Embed(engine, parsed.inputs, std::move(done)); });
}

void OpenAiHandlers::Rerank(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::RerankRequest parsed;
  if (auto error = openai::ParseRerank(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = service_.Find(parsed.model);
  if (!found.ok()) {
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond,
                    RunAgain(this, &OpenAiHandlers::Rerank))) {
      return;
    }
    return respond(OpenAiError(found.status(), "model"));
  }

  std::shared_ptr<llm::LlmEngine> engine = *found;
  if (!engine->model().classifies() || engine->model().row_width() != 1) {
    return respond(OpenAiError(
        Status::InvalidArgument(fmt::format(
            "model '{}' is not a reranker: /v1/rerank serves cross-encoders with one score "
            "(BertForSequenceClassification with num_labels 1)",
            parsed.model)),
        "model"));
  }
  const llm::Tokenizer& tokenizer = engine->tokenizer();
  if (!tokenizer.has_pair_template()) {
    return respond(OpenAiError(
        Status::InvalidArgument(fmt::format(
            "model '{}' has no template for a pair of texts in its tokenizer", parsed.model)),
        "model"));
  }
  // Each document with the query, as the cross-encoder was trained: [CLS] query [SEP] doc [SEP].
  std::vector<llm::EmbeddingInput> inputs;
  for (const std::string& document : parsed.documents) {
    llm::EmbeddingInput input;
    for (const int32_t id : tokenizer.EncodePair(parsed.query, document)) {
      input.tokens.push_back(id);
    }
    input.is_tokens = true;
    inputs.push_back(std::move(input));
  }
  auto answer = AnswerOnce(respond);
  auto done = [answer, engine, parsed](Result<llm::Embeddings> result) {
    if (!result.ok()) {
      // Inputs are numbered as the documents are.
      return answer(
          OpenAiError(result.status(),
                      result.status().code() == StatusCode::kInvalidArgument ? "documents" : "",
                      engine->EstimatedWaitSeconds()));
    }
    // The relevance score: the logit through a sigmoid, as sentence-transformers' CrossEncoder
    // and vLLM score a one-label cross-encoder; highest first.
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t i = 0; i < result->vectors.size(); ++i) {
      ranked.emplace_back(1.0 / (1.0 + std::exp(-static_cast<double>(result->vectors[i][0]))), i);
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    if (parsed.top_n > 0 && static_cast<size_t>(parsed.top_n) < ranked.size()) {
      ranked.resize(static_cast<size_t>(parsed.top_n));
    }
    JsonWriter json;
    json.BeginObject().Field("id", fmt::format("rerank-{}", NextReplyId()));
    json.Field("object", "list").Field("model", parsed.model).Key("results").BeginArray();
    for (const auto& [score, index] : ranked) {
      json.BeginObject().Field("index", static_cast<int64_t>(index));
      json.Field("relevance_score", score);
      if (parsed.return_documents) {
        json.Key("document").BeginObject().Field("text", parsed.documents[index]).EndObject();
      }
      json.EndObject();
    }
    json.EndArray().Key("usage").BeginObject();
    json.Field("prompt_tokens", int64_t{result->prompt_tokens});
    json.Field("total_tokens", int64_t{result->prompt_tokens}).EndObject().EndObject();
    answer(HttpResponse::Json(200, json.str()));
  };
  StartCancellable(request, answer,
                   [&] { return service_.Embed(engine, inputs, std::move(done)); });
}

void OpenAiHandlers::LoadLoraAdapter(const HttpRequest& request, const PathParams&,
                                     Responder respond) {
  openai::LoraAdapterRequest parsed;
  if (auto error = openai::ParseLoraAdapter(request.body, /*load=*/true, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto engine = service_.Find(parsed.model);
  if (!engine.ok()) return respond(OpenAiError(engine.status(), "model"));
  if (!(*engine)->config().lora_runtime_loading) {
    return respond(OpenAiError(
        Status::NotFound(fmt::format("loading LoRA adapters at run time is off for model '{}' "
                                     "(config.yaml's llm.lora.runtime_loading)",
                                     parsed.model)),
        "model"));
  }
  std::string taken = parsed.name;
  std::shared_ptr<const llm::LoraAdapter> existing;
  if (service_.Find(taken, &existing).ok()) {
    return respond(OpenAiError(Status::InvalidArgument(fmt::format(
                                   "the name '{}' is taken by a model or an adapter", parsed.name)),
                               "lora_name"));
  }
  if (Status loaded = (*engine)->LoadAdapter(parsed.name, parsed.path); !loaded.ok()) {
    return respond(OpenAiError(loaded, "lora_path"));
  }
  JsonWriter json;
  json.BeginObject().Field("id", parsed.name).Field("object", "model");
  json.Field("parent", parsed.model).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::UnloadLoraAdapter(const HttpRequest& request, const PathParams&,
                                       Responder respond) {
  openai::LoraAdapterRequest parsed;
  if (auto error = openai::ParseLoraAdapter(request.body, /*load=*/false, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  std::string name = parsed.name;
  std::shared_ptr<const llm::LoraAdapter> adapter;
  auto engine = service_.Find(name, &adapter);
  if (!engine.ok() || adapter == nullptr) {
    return respond(OpenAiError(
        Status::NotFound(fmt::format("no LoRA adapter named '{}' is loaded", parsed.name)),
        "lora_name"));
  }
  if (!(*engine)->config().lora_runtime_loading) {
    return respond(
        OpenAiError(Status::NotFound("unloading LoRA adapters at run time is off (config.yaml's "
                                     "llm.lora.runtime_loading)"),
                    "lora_name"));
  }
  if (Status unloaded = (*engine)->UnloadAdapter(parsed.name); !unloaded.ok()) {
    return respond(OpenAiError(unloaded, "lora_name"));
  }
  JsonWriter json;
  json.BeginObject().Field("id", parsed.name).Field("deleted", true).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::ChatCompletions(const HttpRequest& request, const PathParams&,
                                     Responder respond) {
  Generate(request, /*chat=*/true, std::move(respond));
}

void OpenAiHandlers::Completions(const HttpRequest& request, const PathParams&, Responder respond) {
  Generate(request, /*chat=*/false, std::move(respond));
}

void OpenAiHandlers::Generate(const HttpRequest& request, bool chat, Responder respond) {
  CompletionRequest parsed;
  if (auto error = openai::ParseCompletion(request.body, chat, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = service_.Find(parsed.model, &parsed.adapter);
  if (!found.ok()) {
    auto again = [this, chat](const HttpRequest& r, Responder d) {
      Generate(r, chat, std::move(d));
    };
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond, again)) return;
    return respond(OpenAiError(found.status(), "model"));
  }
  std::shared_ptr<llm::LlmEngine> engine = *found;
  if (parsed.keep_alive) engine->SetKeepAlive(*parsed.keep_alive);
  auto writer = std::make_shared<Writer>(engine->shared_tokenizer(), parsed.n);
  writer->id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", NextReplyId());
  writer->model = parsed.model;
  writer->chat = chat;
  writer->thinks = chat && engine->chat_template() != nullptr && engine->chat_template()->reasons();
  writer->include_usage = parsed.include_usage;
  writer->top_logprobs = parsed.top_logprobs;
  writer->created = UnixSeconds();
  writer->fingerprint = SystemFingerprint(*engine);
  auto reply = std::make_shared<OpenAiReply>(writer, parsed.n);
  reply->respond = std::move(respond);
  if (parsed.stream) reply->stream = std::make_shared<ResponseStream>();
  if (request.on_disconnect) request.on_disconnect([reply] { reply->Cancel(); });
  reply->Attach(service_.Start(engine, std::move(parsed), reply));
}

std::string OpenAiHandlers::RenderMetrics() const {
  PrometheusWriter w;
  std::vector<std::pair<std::string, llm::LlmStats>> all;
  const auto models = service_.models();
  if (models.empty()) return "";
  for (const auto& [name, engine] : models) all.emplace_back(name, engine->stats());
  auto label = [](const std::string& name) { return "model=" + LabelValue(name); };
  w.Family("sluice_llm_prompt_tokens_total", "counter", "Prompt tokens processed.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_prompt_tokens_total", label(name), static_cast<double>(s.prompt_tokens));
  w.Family("sluice_llm_generated_tokens_total", "counter", "Tokens generated.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_generated_tokens_total", label(name),
             static_cast<double>(s.generated_tokens));
  w.Family("sluice_llm_requests_finished_total", "counter", "Generations that finished.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_requests_finished_total", label(name),
             static_cast<double>(s.requests_finished));
  w.Family("sluice_llm_steps_total", "counter", "Model steps (one batch each).");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_steps_total", label(name), static_cast<double>(s.steps));
  w.Family("sluice_llm_draft_tokens_total", "counter",
           "Prompt-lookup draft tokens proposed (speculative decoding).");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_draft_tokens_total", label(name), static_cast<double>(s.draft_tokens));
  w.Family("sluice_llm_accepted_draft_tokens_total", "counter",
           "Draft tokens that verification kept.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_accepted_draft_tokens_total", label(name),
             static_cast<double>(s.accepted_draft_tokens));
  w.Family("sluice_llm_prefix_cache_queries_total", "counter",
           "Prompt tokens of admitted requests (vLLM's prefix-cache queries).");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_prefix_cache_queries_total", label(name),
             static_cast<double>(s.prefix_cache_queries));
  w.Family("sluice_llm_prefix_cache_hits_total", "counter",
           "Of those, tokens found in cached blocks and not run again.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_prefix_cache_hits_total", label(name),
             static_cast<double>(s.prefix_cache_hits));
  w.Family("sluice_llm_model_info", "gauge",
           "The linear layers' weight formats and the kernel paths their products run on.");
  for (const auto& [name, engine] : models) {
    w.Sample("sluice_llm_model_info",
             label(name) + ",weights=" + LabelValue(engine->model().weight_formats()) +
                 ",kernels=" + LabelValue(engine->model().kernel_paths()),
             1);
  }
  w.Family("sluice_llm_slots", "gauge", "Sequences run together, at most.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_slots", label(name), s.slots);
  w.Family("sluice_llm_slots_busy", "gauge", "Slots holding a request.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_slots_busy", label(name), s.slots_busy);
  w.Family("sluice_llm_kv_cache_bytes", "gauge", "Memory of the paged KV cache.");
  for (const auto& [name, engine] : models) {
    w.Sample("sluice_llm_kv_cache_bytes", label(name),
             static_cast<double>(engine->model().kv_cache_bytes()));
  }
  w.Family("sluice_llm_kv_cache_blocks", "gauge", "Blocks of the paged KV cache.");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_kv_cache_blocks", label(name), s.kv_blocks);
  w.Family("sluice_llm_kv_cache_blocks_used", "gauge",
           "Blocks held by running requests (the rest are free or cached).");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_kv_cache_blocks_used", label(name), s.kv_blocks_used);
  w.Family("sluice_llm_kv_cache_usage_ratio", "gauge", "Blocks used over blocks.");
  for (const auto& [name, s] : all) {
    w.Sample("sluice_llm_kv_cache_usage_ratio", label(name),
             s.kv_blocks > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks : 0.0);
  }
  w.Family("sluice_llm_requests_waiting", "gauge", "Requests waiting for a slot.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_requests_waiting", label(name), s.waiting);
  // The model-server protocol of the Gateway API Inference Extension, under vLLM's names and
  // model_name label, which its endpoint picker (and llm-d's) reads from pods it does not know
  // the engine of: queued and running requests, the KV cache's use (0-1: blocks running requests
  // hold over all; cached blocks no request holds are free to take), and its block size for the
  // prefix-cache scorer.
  auto vllm_label = [](const std::string& name) { return "model_name=" + LabelValue(name); };
  w.Family("vllm:num_requests_waiting", "gauge", "Requests waiting for a slot.");
  for (const auto& [name, s] : all)
    w.Sample("vllm:num_requests_waiting", vllm_label(name), s.waiting);
  w.Family("vllm:num_requests_running", "gauge", "Requests holding a slot.");
  for (const auto& [name, s] : all)
    w.Sample("vllm:num_requests_running", vllm_label(name), s.slots_busy);
  w.Family("vllm:kv_cache_usage_perc", "gauge",
           "KV-cache use, 0-1: blocks running requests hold over all blocks.");
  for (const auto& [name, s] : all) {
    w.Sample("vllm:kv_cache_usage_perc", vllm_label(name),
             s.kv_blocks > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks : 0.0);
  }
  w.Family("vllm:cache_config_info", "gauge", "The KV cache's block size (tokens) and blocks.");
  for (const auto& [name, engine] : models) {
    w.Sample("vllm:cache_config_info",
             vllm_label(name) + ",block_size=\"" + std::to_string(engine->model().kv_block_size()) +
                 "\",num_gpu_blocks=\"" + std::to_string(engine->model().kv_blocks()) + "\"",
             1);
  }
  // vLLM's LoRA info gauge (its value the scrape's time, as vLLM's): the endpoint picker routes
  // a request for an adapter to a server that runs it, or has room for it.
  bool adapters = false;
  for (const auto& [name, s] : all) adapters = adapters || s.max_loras > 0;
  if (adapters) {
    const double now = static_cast<double>(UnixSeconds());
    w.Family("vllm:lora_requests_info", "gauge",
             "LoRA adapters of running and waiting requests, and max_lora.");
    auto join = [](const std::vector<std::string>& names) {
      std::string out;
      for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
      return out;
    };
    for (const auto& [name, s] : all) {
      if (s.max_loras == 0) continue;
      w.Sample("vllm:lora_requests_info",
               vllm_label(name) + ",max_lora=\"" + std::to_string(s.max_loras) +
                   "\",running_lora_adapters=" + LabelValue(join(s.running_adapters)) +
                   ",waiting_lora_adapters=" + LabelValue(join(s.waiting_adapters)),
               now);
    }
  }
  w.Family("sluice_llm_time_to_first_token_seconds", "histogram",
           "Submit to first generated token.");
  for (const auto& [name, s] : all)
    w.Histogram("sluice_llm_time_to_first_token_seconds", label(name), s.time_to_first_token);
  w.Family("sluice_llm_inter_token_seconds", "histogram",
           "Between consecutive tokens of a request.");
  for (const auto& [name, s] : all)
    w.Histogram("sluice_llm_inter_token_seconds", label(name), s.inter_token);
  return w.text();
}

}  // namespace sluice
