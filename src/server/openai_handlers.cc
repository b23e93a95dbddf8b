#include "server/openai_handlers.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

#include "common/json_writer.h"
#include "metrics/prometheus.h"

namespace sluice {
namespace {

using simdjson::dom::element;

std::atomic<uint64_t> g_next_id{1};

// A typed request, parsed from the body before anything reaches the engine.
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
};

struct ParseError {
  std::string message;
  std::string param;
};

std::optional<ParseError> ReadNumber(const element& root, const char* key, double low, double high,
                                     double& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  double number = 0;
  int64_t integer = 0;
  if (value.get(number) != simdjson::SUCCESS) {
    if (value.get(integer) != simdjson::SUCCESS)
      return ParseError{fmt::format("'{}' must be a number", key), key};
    number = static_cast<double>(integer);
  }
  if (!(number >= low && number <= high)) {
    return ParseError{fmt::format("'{}' is {}; it must lie in [{}, {}]", key, number, low, high),
                      key};
  }
  out = number;
  return std::nullopt;
}

std::optional<ParseError> ReadInt(const element& root, const char* key, int64_t low, int64_t high,
                                  int64_t& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  int64_t number = 0;
  if (value.get(number) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be an integer", key), key};
  }
  if (number < low || number > high) {
    return ParseError{fmt::format("'{}' is {}; it must lie in [{}, {}]", key, number, low, high),
                      key};
  }
  out = number;
  return std::nullopt;
}

// Content as a string, or OpenAI's array of parts of which the text ones are joined.
std::optional<ParseError> ReadContent(const element& message, std::string& out) {
  element content;
  if (message["content"].get(content) != simdjson::SUCCESS || content.is_null()) {
    out.clear();
    return std::nullopt;
  }
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) {
    out = std::string(text);
    return std::nullopt;
  }
  simdjson::dom::array parts;
  if (content.get(parts) != simdjson::SUCCESS) {
    return ParseError{"message content must be a string or an array of text parts", "messages"};
  }
  for (element part : parts) {
    std::string_view type;
    if (part["type"].get(type) != simdjson::SUCCESS || type != "text" ||
        part["text"].get(text) != simdjson::SUCCESS) {
      return ParseError{"only text content parts are supported", "messages"};
    }
    out += text;
  }
  return std::nullopt;
}

// root["messages"]: a non-empty array of {role, content}.
std::optional<ParseError> ReadMessages(const element& root, std::vector<llm::ChatMessage>& out) {
  simdjson::dom::array messages;
  if (root["messages"].get(messages) != simdjson::SUCCESS || messages.size() == 0) {
    return ParseError{"'messages' must be a non-empty array", "messages"};
  }
  std::string_view text;
  for (element m : messages) {
    llm::ChatMessage message;
    if (m["role"].get(text) != simdjson::SUCCESS) {
      return ParseError{"each message needs a string 'role'", "messages"};
    }
    message.role = std::string(text);
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "developer" && message.role != "tool") {
      return ParseError{fmt::format("unknown message role '{}'", message.role), "messages"};
    }
    if (auto error = ReadContent(m, message.content)) return error;
    out.push_back(std::move(message));
  }
  return std::nullopt;
}

// `body` as a JSON object, parsed into `parser`'s memory.
std::optional<ParseError> ParseObject(simdjson::dom::parser& parser, std::string_view body,
                                      element& root) {
  if (parser.parse(body.data(), body.size()).get(root) != simdjson::SUCCESS || !root.is_object()) {
    return ParseError{"the body is not a JSON object", ""};
  }
  return std::nullopt;
}

// root[key] as a string when present (else `out` unchanged).
std::optional<ParseError> ReadString(const element& root, const char* key, std::string& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  std::string_view text;
  if (value.get(text) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be a string", key), key};
  }
  out = std::string(text);
  return std::nullopt;
}

// root[key] as a bool when present (else `out` unchanged).
std::optional<ParseError> ReadBool(const element& root, const char* key, bool& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  if (value.get(out) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be true or false", key), key};
  }
  return std::nullopt;
}

// The first key of `root` outside `known`, refused by name.
std::optional<ParseError> OnlyKeys(const element& root,
                                   std::initializer_list<std::string_view> known) {
  simdjson::dom::object object;
  if (root.get(object) != simdjson::SUCCESS) return ParseError{"the body is not a JSON object", ""};
  for (auto field : object) {
    if (std::find(known.begin(), known.end(), field.key) == known.end()) {
      return ParseError{fmt::format("'{}' is not a parameter of this route", field.key),
                        std::string(field.key)};
    }
  }
  return std::nullopt;
}

std::optional<ParseError> Parse(std::string_view body, bool chat, CompletionRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  std::string_view text;
  if (root["model"].get(text) == simdjson::SUCCESS) r.model = std::string(text);
  if (chat) {
    if (auto error = ReadMessages(root, r.messages)) return error;
  } else {
    element prompt;
    if (root["prompt"].get(prompt) != simdjson::SUCCESS) {
      return ParseError{"'prompt' is required", "prompt"};
    }
    simdjson::dom::array list;
    if (prompt.get(text) == simdjson::SUCCESS) {
      r.prompt = std::string(text);
    } else if (prompt.get(list) == simdjson::SUCCESS && list.size() == 1 &&
               list.at(0).get(text) == simdjson::SUCCESS) {
      r.prompt = std::string(text);
    } else {
      return ParseError{"'prompt' must be a string (or an array of one string)", "prompt"};
    }
  }
  // Parameters Sluice does not serve (response_format, tools, logit_bias, echo, best_of, ...)
  // are refused by name, never ignored.
  if (auto error =
          chat ? OnlyKeys(root,
                          {"model", "messages", "stream", "stream_options", "max_tokens",
                           "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                           "frequency_penalty", "presence_penalty", "repetition_penalty",
                           "ignore_eos", "n", "logprobs", "top_logprobs", "user"})
               : OnlyKeys(root, {"model", "prompt", "stream", "stream_options", "max_tokens",
                                 "temperature", "top_p", "top_k", "seed", "stop",
                                 "frequency_penalty", "presence_penalty", "repetition_penalty",
                                 "ignore_eos", "n", "logprobs", "user"})) {
    return error;
  }
  bool flag = false;
  if (root["stream"].get(flag) == simdjson::SUCCESS) r.stream = flag;
  if (root["stream_options"]["include_usage"].get(flag) == simdjson::SUCCESS)
    r.include_usage = flag;
  if (root["ignore_eos"].get(flag) == simdjson::SUCCESS) r.ignore_eos = flag;
  int64_t integer = 1;
  if (auto e = ReadInt(root, "n", 1, 128, integer)) return e;
  r.n = static_cast<int>(integer);
  if (chat) {
    // logprobs: true for the chosen tokens'; top_logprobs: how many alternatives beside.
    bool logprobs = false;
    if (auto e = ReadBool(root, "logprobs", logprobs)) return e;
    integer = -1;
    if (auto e = ReadInt(root, "top_logprobs", 0, 20, integer)) return e;
    if (integer >= 0 && !logprobs) {
      return ParseError{"'top_logprobs' needs 'logprobs': true", "top_logprobs"};
    }
    if (logprobs) r.top_logprobs = std::max<int>(0, static_cast<int>(integer));
  } else {
    // logprobs: the number of alternatives beside each chosen token.
    integer = -1;
    if (auto e = ReadInt(root, "logprobs", 0, 20, integer)) return e;
    r.top_logprobs = static_cast<int>(integer);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    integer = 0;
    if (auto e = ReadInt(root, key, 1, 1 << 24, integer)) return e;
    if (integer > 0) r.max_tokens = static_cast<int>(integer);
  }
  integer = 0;
  if (auto e = ReadInt(root, "top_k", -1, 1 << 24, integer)) return e;
  r.sampling.top_k = integer < 0 ? 0 : static_cast<int>(integer);
  element seed;
  if (root["seed"].get(seed) == simdjson::SUCCESS && !seed.is_null()) {
    // Any 64-bit integer, signed or not.
    int64_t signed_seed = 0;
    uint64_t unsigned_seed = 0;
    if (seed.get(signed_seed) == simdjson::SUCCESS) {
      r.sampling.seed = static_cast<uint64_t>(signed_seed);
    } else if (seed.get(unsigned_seed) == simdjson::SUCCESS) {
      r.sampling.seed = unsigned_seed;
    } else {
      return ParseError{"'seed' must be an integer", "seed"};
    }
  }
  if (auto e = ReadNumber(root, "temperature", 0, 2, r.sampling.temperature)) return e;
  if (auto e = ReadNumber(root, "top_p", 1e-9, 1, r.sampling.top_p)) return e;
  if (auto e = ReadNumber(root, "frequency_penalty", -2, 2, r.sampling.frequency_penalty)) return e;
  if (auto e = ReadNumber(root, "presence_penalty", -2, 2, r.sampling.presence_penalty)) return e;
  if (auto e = ReadNumber(root, "repetition_penalty", 1e-3, 100, r.sampling.repetition_penalty))
    return e;
  element stop;
  if (root["stop"].get(stop) == simdjson::SUCCESS && !stop.is_null()) {
    simdjson::dom::array list;
    if (stop.get(text) == simdjson::SUCCESS) {
      r.stop.emplace_back(text);
    } else if (stop.get(list) == simdjson::SUCCESS && list.size() <= 4) {
      for (element item : list) {
        if (item.get(text) != simdjson::SUCCESS)
          return ParseError{"'stop' must hold strings", "stop"};
        r.stop.emplace_back(text);
      }
    } else {
      return ParseError{"'stop' must be a string or an array of up to 4 strings", "stop"};
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) return ParseError{"stop strings must not be empty", "stop"};
    }
  }
  return std::nullopt;
}

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
  std::atomic<bool> answered{false};  // Non-streaming: the one response has been given.
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
                    const std::vector<llm::TokenLogprobs>& tokens) const {
    const Choice& choice = choices[index];
    JsonWriter json;
    BeginObject(json, id, chat ? "chat.completion.chunk" : "text_completion", created, model);
    json.Key("choices").BeginArray().BeginObject().Field("index", static_cast<int64_t>(index));
    if (chat) {
      json.Key("delta").BeginObject();
      if (!choice.sent_role) json.Field("role", "assistant");
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
        json.Key("message").BeginObject().Field("role", "assistant").Field("content", c.text);
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
    if (!event.text.empty() || !tokens.empty()) {
      out += Chunk(index, event.text, llm::FinishReason::kNone, tokens);
      for (const llm::TokenLogprobs& t : tokens) {
        choice.text_offset +=
            static_cast<int64_t>(engine->tokenizer().TokenBytes(t.chosen.token).size());
      }
    }
    if (event.finish != llm::FinishReason::kNone) {
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
  auto it = models_.find(model);
  if (it == models_.end()) {
    return Status::NotFound(model.empty() ? std::string("'model' is required")
                                          : fmt::format("The model '{}' does not exist", model));
  }
  return it->second;
}

Result<std::string> OpenAiHandlers::RenderChat(const llm::LlmEngine& engine,
                                               const std::string& model,
                                               const std::vector<llm::ChatMessage>& messages,
                                               bool add_generation_prompt) {
  const llm::ChatTemplate* chat_template = engine.chat_template();
  if (chat_template == nullptr) {
    return Status::InvalidArgument(
        fmt::format("model '{}' has no chat template; use /v1/completions", model));
  }
  const llm::Tokenizer& tokenizer = engine.tokenizer();
  return chat_template->Render(
      messages, add_generation_prompt,
      {{"bos_token", tokenizer.bos_token()}, {"eos_token", tokenizer.eos_token()}});
}

void OpenAiHandlers::Tokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, request.body, root)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message)));
  }
  std::string model, prompt;
  std::vector<llm::ChatMessage> messages;
  std::string_view text;
  const bool chat = root["messages"].error() == simdjson::SUCCESS;
  bool add_special = !chat, add_generation_prompt = true;
  std::optional<ParseError> error = OnlyKeys(
      root, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"});
  if (!error) error = ReadBool(root, "add_special_tokens", add_special);
  if (!error) error = ReadBool(root, "add_generation_prompt", add_generation_prompt);
  if (!error) error = ReadString(root, "model", model);
  if (!error && chat) {
    if (root["prompt"].error() == simdjson::SUCCESS) {
      error = ParseError{"give 'prompt' or 'messages', not both", "prompt"};
    } else {
      error = ReadMessages(root, messages);
    }
  } else if (!error) {
    if (root["prompt"].get(text) != simdjson::SUCCESS) {
      error = ParseError{"'prompt' (a string) or 'messages' is required", "prompt"};
    } else {
      prompt = std::string(text);
    }
  }
  if (error) return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  auto engine = Find(model);
  if (!engine.ok()) return respond(OpenAiError(engine.status(), "model"));
  if (chat) {
    auto rendered = RenderChat(**engine, model, messages, add_generation_prompt);
    if (!rendered.ok()) return respond(OpenAiError(rendered.status(), "messages"));
    prompt = std::move(*rendered);
  }
  const std::vector<int32_t> ids = (*engine)->tokenizer().Encode(prompt, add_special);
  JsonWriter json;
  json.BeginObject().Field("count", static_cast<int64_t>(ids.size()));
  json.Field("max_model_len", int64_t{(*engine)->model().context_length()});
  json.Key("tokens").BeginArray();
  for (int32_t id : ids) json.Int(id);
  json.EndArray().EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::Detokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, request.body, root)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message)));
  }
  std::optional<ParseError> error = OnlyKeys(root, {"model", "tokens"});
  std::string model;
  if (!error) error = ReadString(root, "model", model);
  simdjson::dom::array tokens;
  if (!error && root["tokens"].get(tokens) != simdjson::SUCCESS) {
    error = ParseError{"'tokens' (an array of token ids) is required", "tokens"};
  }
  if (error) return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  auto engine = Find(model);
  if (!engine.ok()) return respond(OpenAiError(engine.status(), "model"));
  const int64_t vocab = (*engine)->model().architecture().vocab_size;
  std::vector<int32_t> ids;
  for (element token : tokens) {
    int64_t id = 0;
    if (token.get(id) != simdjson::SUCCESS || id < 0 || id >= vocab) {
      return respond(
          OpenAiError(Status::InvalidArgument(fmt::format(
                          "'tokens' must hold token ids in [0, {}) of model '{}'", vocab, model)),
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
  if (auto error = Parse(request.body, chat, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = Find(parsed.model);
  if (!found.ok()) return respond(OpenAiError(found.status(), "model"));
  std::shared_ptr<llm::LlmEngine> engine = *found;
  std::string prompt_text = parsed.prompt;
  if (chat) {
    auto rendered =
        RenderChat(*engine, parsed.model, parsed.messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return respond(OpenAiError(rendered.status(), "messages"));
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
  if (parsed.stream) state->stream = std::make_shared<ResponseStream>();
  // Each choice is a request of its own; with a seed, choice i samples with seed + i, so the
  // choices differ and the same seed gives the same n texts.
  for (int i = 0; i < parsed.n; ++i) {
    llm::GenerationRequest choice = generation;
    if (choice.sampling.seed) *choice.sampling.seed += static_cast<uint64_t>(i);
    const auto index = static_cast<size_t>(i);
    auto submitted = engine->Submit(
        std::move(choice),
        [state, index](const llm::GenerationEvent& event) { state->OnEvent(index, event); });
    if (!submitted.ok()) {
      // All or nothing: the choices already queued are dropped unanswered.
      state->cancelled = true;
      state->CancelChoices();
      return respond(OpenAiError(submitted.status(), {}, engine->EstimatedWaitSeconds()));
    }
    state->engine_ids[index] = *submitted;
  }
  if (state->cancelled.load()) state->CancelChoices();
  if (request.on_disconnect) request.on_disconnect([state] { state->Cancel(); });
  if (state->stream) {
    HttpResponse response;
    response.content_type = "text/event-stream";
    response.headers.emplace_back("Cache-Control", "no-cache");
    response.stream = state->stream;
    respond(std::move(response));
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
           "Prompt tokens of requests given a slot (vLLM's prefix-cache queries).");
  for (const auto& [name, s] : all)
    w.Sample("sluice_llm_prefix_cache_queries_total", label(name),
             static_cast<double>(s.prefix_cache_queries));
  w.Family("sluice_llm_prefix_cache_hits_total", "counter",
           "Of those, tokens found in the slot's cache and not run again.");
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
  w.Family("sluice_llm_slots", "gauge", "KV-cache slots.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_slots", label(name), s.slots);
  w.Family("sluice_llm_slots_busy", "gauge", "Slots holding a request.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_slots_busy", label(name), s.slots_busy);
  w.Family("sluice_llm_requests_waiting", "gauge", "Requests waiting for a slot.");
  for (const auto& [name, s] : all) w.Sample("sluice_llm_requests_waiting", label(name), s.waiting);
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
