#include "server/openai_handlers.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>

#include "common/json_writer.h"
#include "llm/text/reasoning.h"
#include "metrics/prometheus.h"
#include "server/openai_request.h"

namespace sluice {
namespace {

using openai::CompletionRequest;
using openai::ResponseFormat;

std::atomic<uint64_t> g_next_id{1};

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
                 const std::string& model) {
  json.BeginObject().Field("id", id).Field("object", object).Field("created", created);
  json.Field("model", model);
}

void WriteUsage(JsonWriter& json, int prompt, int completion) {
  json.Key("usage").BeginObject().Field("prompt_tokens", int64_t{prompt});
  json.Field("completion_tokens", int64_t{completion});
  json.Field("total_tokens", int64_t{prompt + completion}).EndObject();
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
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

// One of a request's n choices, as its events arrive (on the engine's thread).
struct Choice {
  std::string text;  // Non-streaming: the whole reply.
  std::vector<llm::TokenLogprobs> logprobs;
  int64_t text_offset = 0;  // Completions: bytes of this choice's tokens already reported.
  int completion_tokens = 0;
  llm::FinishReason finish = llm::FinishReason::kNone;
  bool sent_role = false;
  // A thinking template's replies: the reasoning told apart from the answer.
  std::optional<llm::ReasoningSplitter> reasoning;
};

// What one generation (its n choices) shares between the handler, the engine's events and the
// disconnect hook. Events of all choices come from the engine's one loop thread.
struct Generation {
  explicit Generation(int n)
      : engine_ids(static_cast<size_t>(n)), choices(static_cast<size_t>(n)) {}

  std::shared_ptr<llm::LlmEngine> engine;
  std::string id, model;
  bool chat = false;
  bool include_usage = false;
  int top_logprobs = -1;  // -1: no log-probabilities.
  int64_t created = 0;
  std::vector<std::atomic<uint64_t>> engine_ids;  // 0 until submitted.
  std::atomic<bool> cancelled{false};
  std::atomic<bool> answered{false};  // The response (a body, or a stream begun) is given.
  Responder respond;
  std::shared_ptr<ResponseStream> stream;
  // Engine thread only.
  std::vector<Choice> choices;
  int unfinished = static_cast<int>(choices.size());
  int prompt_tokens = 0;
  bool failed = false;

  // Exactly one answer, whichever of the engine and a disconnect comes first.
  void Answer(HttpResponse response) {
    if (!answered.exchange(true)) respond(std::move(response));
  }

  // Stops every choice still generating.
  void CancelChoices() {
    for (const auto& engine_id : engine_ids) {
      if (const uint64_t request = engine_id.load()) engine->Cancel(request);
    }
  }

  void Cancel() {
    if (cancelled.exchange(true)) return;
    CancelChoices();
    // The server counts it as a client that left (a stream's end is the server's own).
    if (!stream) Answer(OpenAiError(Status::Cancelled("the client disconnected")));
  }

  void WriteLogprobs(JsonWriter& json, const Choice& choice,
                     const std::vector<llm::TokenLogprobs>& tokens) const {
    if (top_logprobs < 0) {
      json.Key("logprobs").Null();
    } else if (chat) {
      WriteChatLogprobs(json, engine->tokenizer(), tokens);
    } else {
      WriteCompletionLogprobs(json, engine->tokenizer(), tokens, choice.text_offset);
    }
  }

  // data: {...}\n\n for one streamed chunk of choice `index`.
  std::string Chunk(size_t index, std::string_view content, llm::FinishReason finish,
                    const std::vector<llm::TokenLogprobs>& tokens,
                    std::string_view reasoning = {}) const {
    const Choice& choice = choices[index];
    JsonWriter json;
    BeginObject(json, id, chat ? "chat.completion.chunk" : "text_completion", created, model);
    json.Key("choices").BeginArray().BeginObject().Field("index", static_cast<int64_t>(index));
    if (chat) {
      json.Key("delta").BeginObject();
      if (!choice.sent_role) json.Field("role", "assistant");
      if (!reasoning.empty()) json.Field("reasoning_content", reasoning);
      if (!content.empty() || !choice.sent_role) json.Field("content", content);
      json.EndObject();
    } else {
      json.Field("text", content);
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
    for (const Choice& choice : choices) total += choice.completion_tokens;
    return total;
  }

  void Fail(const Status& error) {
    failed = true;
    CancelChoices();
    if (stream) {
      // Headers are sent: the error travels as an event, then the stream ends.
      JsonWriter json;
      json.BeginObject().Key("error").BeginObject().Field("message", error.message());
      json.Field("type", "server_error").Key("param").Null().Key("code").Null();
      json.EndObject().EndObject();
      stream->Write("data: " + json.str() + "\n\n");
      stream->Close();
    } else {
      Answer(OpenAiError(error));
    }
  }

  void OnEvent(size_t index, const llm::GenerationEvent& event) {
    if (cancelled.load() || failed) return;
    if (event.finish == llm::FinishReason::kError) return Fail(event.error);
    Choice& choice = choices[index];
    choice.completion_tokens = event.completion_tokens;
    prompt_tokens = event.prompt_tokens;
    std::vector<llm::TokenLogprobs> tokens;
    if (event.logprobs) tokens.push_back(*event.logprobs);
    if (event.finish != llm::FinishReason::kNone) {
      choice.finish = event.finish;
      --unfinished;
    }
    if (stream) return Stream(index, event, tokens);
    choice.text += event.text;
    choice.logprobs.insert(choice.logprobs.end(), tokens.begin(), tokens.end());
    if (unfinished > 0) return;
    JsonWriter json;
    BeginObject(json, id, chat ? "chat.completion" : "text_completion", created, model);
    json.Key("choices").BeginArray();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      json.BeginObject().Field("index", static_cast<int64_t>(i));
      if (chat) {
        json.Key("message").BeginObject().Field("role", "assistant");
        if (c.reasoning) {
          llm::ReasoningSplitter splitter = *c.reasoning;
          llm::ReasoningSplitter::Pieces pieces = splitter.Add(c.text);
          llm::ReasoningSplitter::Pieces rest = splitter.Finish();
          json.Field("content", pieces.content + rest.content).Key("reasoning_content");
          const std::string reasoning = pieces.reasoning + rest.reasoning;
          if (reasoning.empty()) {
            json.Null();
          } else {
            json.String(reasoning);
          }
        } else {
          json.Field("content", c.text);
        }
        json.EndObject();
      } else {
        json.Field("text", c.text);
      }
      WriteLogprobs(json, c, c.logprobs);
      json.Field("finish_reason", llm::FinishReasonName(c.finish)).EndObject();
    }
    json.EndArray();
    WriteUsage(json, prompt_tokens, CompletionTokens());
    json.EndObject();
    Answer(HttpResponse::Json(200, json.str()));
  }

  void Stream(size_t index, const llm::GenerationEvent& event,
              const std::vector<llm::TokenLogprobs>& tokens) {
    Choice& choice = choices[index];
    std::string out;
    if (!choice.sent_role && chat) {
      out += Chunk(index, "", llm::FinishReason::kNone, {});
      choice.sent_role = true;
    }
    llm::ReasoningSplitter::Pieces pieces;
    if (choice.reasoning) {
      pieces = choice.reasoning->Add(event.text);
    } else {
      pieces.content = event.text;
    }
    if (!pieces.content.empty() || !pieces.reasoning.empty() || !tokens.empty()) {
      out += Chunk(index, pieces.content, llm::FinishReason::kNone, tokens, pieces.reasoning);
      for (const llm::TokenLogprobs& t : tokens) {
        choice.text_offset +=
            static_cast<int64_t>(engine->tokenizer().TokenBytes(t.chosen.token).size());
      }
    }
    if (event.finish != llm::FinishReason::kNone) {
      if (choice.reasoning) {  // What was held back as a possible tag.
        const llm::ReasoningSplitter::Pieces rest = choice.reasoning->Finish();
        if (!rest.content.empty() || !rest.reasoning.empty()) {
          out += Chunk(index, rest.content, llm::FinishReason::kNone, {}, rest.reasoning);
        }
      }
      out += Chunk(index, "", event.finish, {});
      if (unfinished == 0) {
        if (include_usage) {
          JsonWriter json;
          BeginObject(json, id, chat ? "chat.completion.chunk" : "text_completion", created, model);
          json.Key("choices").BeginArray().EndArray();
          WriteUsage(json, prompt_tokens, CompletionTokens());
          json.EndObject();
          out += "data: " + json.str() + "\n\n";
        }
        out += "data: [DONE]\n\n";
      }
    }
    if (!out.empty() && !stream->Write(std::move(out))) return Cancel();
    if (unfinished == 0) stream->Close();
  }
};

// Submits a generation's n choices (all or nothing) and, when streamed, starts the response. Each
// choice is a request of its own; with a seed, choice i samples with seed + i, so the choices
// differ and the same seed gives the same n texts.
void Launch(const std::shared_ptr<Generation>& state, const llm::GenerationRequest& generation,
            int n) {
  for (int i = 0; i < n && !state->cancelled.load(); ++i) {
    llm::GenerationRequest choice = generation;
    if (choice.sampling.seed) *choice.sampling.seed += static_cast<uint64_t>(i);
    // The other choices share the first one's prompt blocks rather than computing them again.
    if (i > 0) choice.shares_prompt_of = state->engine_ids[0].load();
    const auto index = static_cast<size_t>(i);
    auto submitted = state->engine->Submit(
        std::move(choice),
        [state, index](const llm::GenerationEvent& event) { state->OnEvent(index, event); });
    if (!submitted.ok()) {
      // All or nothing: the choices already queued are dropped unanswered.
      state->cancelled = true;
      state->CancelChoices();
      return state->Answer(
          OpenAiError(submitted.status(), {}, state->engine->EstimatedWaitSeconds()));
    }
    state->engine_ids[index] = *submitted;
  }
  if (state->cancelled.load()) {
    // The client left before (or while) its choices were queued.
    state->CancelChoices();
    return state->Answer(OpenAiError(Status::Cancelled("the client disconnected")));
  }
  if (state->stream) {
    HttpResponse response;
    response.content_type = "text/event-stream";
    response.headers.emplace_back("Cache-Control", "no-cache");
    response.stream = state->stream;
    state->Answer(std::move(response));
  }
}

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
        "Retry-After", std::to_string(static_cast<int64_t>(std::ceil(retry_after_seconds))));
  }
  return response;
}

OpenAiHandlers::OpenAiHandlers(std::map<std::string, std::shared_ptr<llm::LlmEngine>> models)
    : models_(std::move(models)), created_(UnixSeconds()) {}

void OpenAiHandlers::AddRoutes(Router& router) {
  auto bind = [this](auto method) {
    return [this, method](const HttpRequest& request, const PathParams& params, Responder respond) {
      (this->*method)(request, params, std::move(respond));
    };
  };
  router.Get("/v1/models", bind(&OpenAiHandlers::Models));
  router.Post("/v1/chat/completions", bind(&OpenAiHandlers::ChatCompletions));
  router.Post("/v1/completions", bind(&OpenAiHandlers::Completions));
  router.Post("/tokenize", bind(&OpenAiHandlers::Tokenize));
  router.Post("/detokenize", bind(&OpenAiHandlers::Detokenize));
}

Result<std::shared_ptr<llm::LlmEngine>> OpenAiHandlers::Find(std::string& model) const {
  if (model.empty() && models_.size() == 1) model = models_.begin()->first;
  if (model.empty()) {
    return Status::InvalidArgument(
        fmt::format("'model' is required: this server serves {} language models", models_.size()));
  }
  auto it = models_.find(model);
  if (it == models_.end()) {
    return Status::NotFound(fmt::format("The model '{}' does not exist", model));
  }
  return it->second;
}

Result<std::string> OpenAiHandlers::RenderChat(
    const llm::LlmEngine& engine, const std::string& model,
    const std::vector<llm::ChatMessage>& messages, bool add_generation_prompt,
    const std::map<std::string, llm::TemplateArgument>& arguments) {
  const llm::ChatTemplate* chat_template = engine.chat_template();
  if (chat_template == nullptr) {
    return Status::InvalidArgument(
        fmt::format("model '{}' has no chat template; use /v1/completions", model));
  }
  const llm::Tokenizer& tokenizer = engine.tokenizer();
  return chat_template->Render(
      messages, add_generation_prompt,
      {{"bos_token", tokenizer.bos_token()}, {"eos_token", tokenizer.eos_token()}}, arguments);
}

void OpenAiHandlers::Tokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::TokenizeRequest parsed;
  if (auto error = openai::ParseTokenize(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto engine = Find(parsed.model);
  if (!engine.ok()) return respond(OpenAiError(engine.status(), "model"));
  if (parsed.chat) {
    auto rendered =
        RenderChat(**engine, parsed.model, parsed.messages, parsed.add_generation_prompt);
    if (!rendered.ok()) return respond(OpenAiError(rendered.status(), "messages"));
    parsed.prompt = std::move(*rendered);
  }
  const std::vector<int32_t> ids =
      (*engine)->tokenizer().Encode(parsed.prompt, parsed.add_special_tokens);
  JsonWriter json;
  json.BeginObject().Field("count", static_cast<int64_t>(ids.size()));
  json.Field("max_model_len", int64_t{(*engine)->model().context_length()});
  json.Key("tokens").BeginArray();
  for (int32_t id : ids) json.Int(id);
  json.EndArray().EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::Detokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::DetokenizeRequest parsed;
  if (auto error = openai::ParseDetokenize(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto engine = Find(parsed.model);
  if (!engine.ok()) return respond(OpenAiError(engine.status(), "model"));
  const int64_t vocab = (*engine)->model().architecture().vocab_size;
  std::vector<int32_t> ids;
  for (const int64_t id : parsed.tokens) {
    if (id < 0 || id >= vocab) {
      return respond(OpenAiError(
          Status::InvalidArgument(fmt::format(
              "'tokens' must hold token ids in [0, {}) of model '{}'", vocab, parsed.model)),
          "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  JsonWriter json;
  json.BeginObject().Field("prompt", (*engine)->tokenizer().Decode(ids)).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::Models(const HttpRequest&, const PathParams&, Responder respond) {
  JsonWriter json;
  json.BeginObject().Field("object", "list").Key("data").BeginArray();
  for (const auto& [name, engine] : models_) {
    json.BeginObject().Field("id", name).Field("object", "model").Field("created", created_);
    json.Field("owned_by", "sluice");
    json.Field("max_model_len", int64_t{engine->model().context_length()});
    json.EndObject();
  }
  json.EndArray().EndObject();
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
  auto found = Find(parsed.model);
  if (!found.ok()) return respond(OpenAiError(found.status(), "model"));
  std::shared_ptr<llm::LlmEngine> engine = *found;
  std::string prompt_text = parsed.prompt;
  if (chat) {
    auto rendered = RenderChat(*engine, parsed.model, parsed.messages,
                               /*add_generation_prompt=*/true, parsed.template_arguments);
    if (!rendered.ok()) {
      return respond(OpenAiError(rendered.status(), parsed.template_arguments.empty()
                                                        ? "messages"
                                                        : "chat_template_kwargs"));
    }
    prompt_text = std::move(*rendered);
  }
  llm::GenerationRequest generation;
  generation.prompt = engine->tokenizer().Encode(prompt_text, /*add_special_tokens=*/!chat);
  generation.max_tokens = parsed.max_tokens;
  generation.sampling = parsed.sampling;
  generation.stop = std::move(parsed.stop);
  generation.ignore_eos = parsed.ignore_eos;
  if (Status length =
          engine->CheckLength(static_cast<int>(generation.prompt.size()), generation.max_tokens);
      !length.ok()) {
    return respond(OpenAiError(length, chat ? "messages" : "prompt"));
  }

  generation.top_logprobs = parsed.top_logprobs;
  auto state = std::make_shared<Generation>(parsed.n);
  state->engine = engine;
  state->id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", g_next_id.fetch_add(1));
  state->model = parsed.model;
  state->chat = chat;
  state->include_usage = parsed.include_usage;
  state->top_logprobs = parsed.top_logprobs;
  state->created = UnixSeconds();
  state->respond = respond;
  if (chat && engine->chat_template()->thinks()) {
    // Each choice's reasoning apart from its answer, inside the block the prompt may have opened.
    const bool opened = llm::PromptOpensThinking(prompt_text);
    for (Choice& choice : state->choices) choice.reasoning.emplace(opened);
  }
  if (parsed.stream) state->stream = std::make_shared<ResponseStream>();
  if (request.on_disconnect) request.on_disconnect([state] { state->Cancel(); });
  if (parsed.response_format.type == ResponseFormat::Type::kText) {
    return Launch(state, generation, parsed.n);
  }
  // A schema's first compilation takes milliseconds to seconds: off the I/O thread. Later
  // requests with the same schema find it cached.
  auto compile = [state, generation = std::move(generation), n = parsed.n,
                  format = std::move(parsed.response_format)]() mutable {
    if (state->cancelled.load()) return Launch(state, generation, n);  // Answers the cancel.
    auto grammar = format.type == ResponseFormat::Type::kJsonObject
                       ? state->engine->grammars().JsonObject()
                       : state->engine->grammars().JsonSchema(format.schema);
    if (!grammar.ok()) return state->Answer(OpenAiError(grammar.status(), "response_format"));
    generation.grammar = std::move(*grammar);
    Launch(state, generation, n);
  };
  if (!grammar_pool_.TrySubmit(std::move(compile))) {
    state->Answer(OpenAiError(
        Status::Unavailable("too many response formats are waiting to be compiled; retry later")));
  }
}

std::string OpenAiHandlers::RenderMetrics() const {
  PrometheusWriter w;
  std::vector<std::pair<std::string, llm::LlmStats>> all;
  for (const auto& [name, engine] : models_) all.emplace_back(name, engine->stats());
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
  for (const auto& [name, engine] : models_) {
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
  for (const auto& [name, engine] : models_) {
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
  for (const auto& [name, engine] : models_) {
    w.Sample("vllm:cache_config_info",
             vllm_label(name) + ",block_size=\"" + std::to_string(engine->model().kv_block_size()) +
                 "\",num_gpu_blocks=\"" + std::to_string(engine->model().kv_blocks()) + "\"",
             1);
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
