#include "http/anthropic_handlers.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/json_writer.h"
#include "http/anthropic_request.h"
#include "http/llm_front.h"

namespace sluice {
namespace {

std::string_view ErrorType(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return "invalid_request_error";
    case StatusCode::kNotFound:
      return "not_found_error";
    case StatusCode::kPayloadTooLarge:
      return "request_too_large";
    case StatusCode::kUnavailable:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

std::string ErrorBody(std::string_view type, std::string_view message) {
  JsonWriter json;
  json.BeginObject().Field("type", "error").Key("error").BeginObject();
  json.Field("type", type).Field("message", message).EndObject().EndObject();
  return json.str();
}

std::string_view StopReason(llm::FinishReason finish, const std::string& stop_string) {
  switch (finish) {
    case llm::FinishReason::kLength:
      return "max_tokens";
    case llm::FinishReason::kToolCalls:
      return "tool_use";
    default:
      return stop_string.empty() ? "end_turn" : "stop_sequence";
  }
}

// Anthropic counts input_tokens apart from those read from its cache.
void WriteUsage(JsonWriter& json, int prompt, int cached, int output) {
  json.Key("usage").BeginObject().Field("input_tokens", int64_t{prompt - cached});
  json.Field("cache_creation_input_tokens", int64_t{0});
  json.Field("cache_read_input_tokens", int64_t{cached});
  json.Field("output_tokens", int64_t{output}).EndObject();
}

std::string Event(std::string_view name, const JsonWriter& json) {
  return fmt::format("event: {}\ndata: {}\n\n", name, json.str());
}

// One reply to one message request in Anthropic's shape: a body or a stream of events (see
// EventWriter for which thread runs what).
class MessageWriter final : public EventWriter {
 public:
  std::string id, model;
  bool omit_thinking = false;  // thinking.display "omitted": the blocks stay, their text does not.

  std::string StreamFailure(const Status& error) override {
    return fmt::format("event: error\ndata: {}\n\n", ErrorBody("api_error", error.message()));
  }

  void Add(const llm::ChoiceEvent& event) override {
    Count(event);
    reasoning_ += event.reasoning;
    content_ += event.content;
    calls_.insert(calls_.end(), event.tool_calls.begin(), event.tool_calls.end());
    finish_ = event.finish;
    stop_string_ = event.stop_string;
  }

  std::string Body() override {
    JsonWriter json;
    BeginMessage(json);
    json.Key("content").BeginArray();
    if (!reasoning_.empty()) {
      json.BeginObject().Field("type", "thinking");
      json.Field("thinking", omit_thinking ? std::string() : reasoning_);
      json.Field("signature", "").EndObject();
    }
    if (!content_.empty()) {
      json.BeginObject().Field("type", "text").Field("text", content_).EndObject();
    }
    for (const llm::ToolCall& call : calls_) WriteToolUse(json, call, /*with_input=*/true);
    json.EndArray().Field("stop_reason", StopReason(finish_, stop_string_)).Key("stop_sequence");
    if (stop_string_.empty()) {
      json.Null();
    } else {
      json.String(stop_string_);
    }
    WriteUsage(json, prompt_tokens_, cached_tokens_, output_tokens_);
    json.EndObject();
    return json.str();
  }

  std::string StreamChoice(const llm::ChoiceEvent& event, bool) override {
    Count(event);
    return Stream(event);
  }

 private:
  enum class Block { kNone, kThinking, kText };

  void Count(const llm::ChoiceEvent& event) {
    prompt_tokens_ = event.prompt_tokens;
    cached_tokens_ = event.cached_prompt_tokens;
    output_tokens_ = event.completion_tokens;
  }

  void BeginMessage(JsonWriter& json) const {
    json.BeginObject().Field("id", id).Field("type", "message").Field("role", "assistant");
    json.Field("model", model);
  }

  static void WriteToolUse(JsonWriter& json, const llm::ToolCall& call, bool with_input) {
    json.BeginObject().Field("type", "tool_use").Field("id", call.id).Field("name", call.name);
    json.Key("input");
    if (with_input) {
      json.Raw(call.arguments);
    } else {
      json.BeginObject().EndObject();
    }
    json.EndObject();
  }

  // Closes the open block, if any.
  void CloseBlock(std::string& out) {
    if (open_ == Block::kNone) return;
    JsonWriter json;
    json.BeginObject().Field("type", "content_block_stop").Field("index", int64_t{index_});
    json.EndObject();
    out += Event("content_block_stop", json);
    open_ = Block::kNone;
  }

  // A delta of `text` in a block of `kind`, opening it (and closing another) where needed.
  void Delta(std::string& out, Block kind, std::string_view text) {
    const bool thinking = kind == Block::kThinking;
    if (text.empty() && (!thinking || !omit_thinking)) return;
    if (open_ != kind) {
      CloseBlock(out);
      JsonWriter start;
      start.BeginObject().Field("type", "content_block_start").Field("index", int64_t{++index_});
      start.Key("content_block").BeginObject().Field("type", thinking ? "thinking" : "text");
      if (thinking) {
        start.Field("thinking", "").Field("signature", "");
      } else {
        start.Field("text", "");
      }
      start.EndObject().EndObject();
      out += Event("content_block_start", start);
      open_ = kind;
    }
    if (text.empty()) return;
    JsonWriter json;
    json.BeginObject().Field("type", "content_block_delta").Field("index", int64_t{index_});
    json.Key("delta").BeginObject().Field("type", thinking ? "thinking_delta" : "text_delta");
    json.Field(thinking ? "thinking" : "text", text).EndObject().EndObject();
    out += Event("content_block_delta", json);
  }

  std::string Stream(const llm::ChoiceEvent& event) {
    std::string out;
    if (!started_) {
      JsonWriter json;
      json.BeginObject().Field("type", "message_start").Key("message");
      BeginMessage(json);
      json.Key("content").BeginArray().EndArray().Key("stop_reason").Null();
      json.Key("stop_sequence").Null();
      WriteUsage(json, prompt_tokens_, cached_tokens_, 0);
      json.EndObject().EndObject();
      out += Event("message_start", json);
      started_ = true;
    }
    if (!event.reasoning.empty()) {
      // Omitted: the block opens, and no text follows.
      Delta(out, Block::kThinking, omit_thinking ? std::string_view() : event.reasoning);
    }
    Delta(out, Block::kText, event.content);
    // Each call whole: its block opens with an empty input, one delta carries its arguments.
    for (const llm::ToolCall& call : event.tool_calls) {
      CloseBlock(out);
      JsonWriter start;
      start.BeginObject().Field("type", "content_block_start").Field("index", int64_t{++index_});
      start.Key("content_block");
      WriteToolUse(start, call, /*with_input=*/false);
      start.EndObject();
      out += Event("content_block_start", start);
      JsonWriter delta;
      delta.BeginObject().Field("type", "content_block_delta").Field("index", int64_t{index_});
      delta.Key("delta").BeginObject().Field("type", "input_json_delta");
      delta.Field("partial_json", call.arguments).EndObject().EndObject();
      out += Event("content_block_delta", delta);
      JsonWriter stop;
      stop.BeginObject().Field("type", "content_block_stop").Field("index", int64_t{index_});
      stop.EndObject();
      out += Event("content_block_stop", stop);
    }
    const bool end = event.finish != llm::FinishReason::kNone;
    if (end) {
      CloseBlock(out);
      JsonWriter json;
      json.BeginObject().Field("type", "message_delta").Key("delta").BeginObject();
      json.Field("stop_reason", StopReason(event.finish, event.stop_string)).Key("stop_sequence");
      if (event.stop_string.empty()) {
        json.Null();
      } else {
        json.String(event.stop_string);
      }
      json.EndObject();
      WriteUsage(json, prompt_tokens_, cached_tokens_, output_tokens_);
      json.EndObject();
      out += Event("message_delta", json);
      JsonWriter stop;
      stop.BeginObject().Field("type", "message_stop").EndObject();
      out += Event("message_stop", stop);
    }
    return out;
  }

  bool started_ = false;  // message_start sent.
  Block open_ = Block::kNone;
  int index_ = -1;  // The last block opened.
  std::string reasoning_, content_;
  std::vector<llm::ToolCall> calls_;
  llm::FinishReason finish_ = llm::FinishReason::kNone;
  std::string stop_string_;
  int prompt_tokens_ = 0, cached_tokens_ = 0, output_tokens_ = 0;
};

// A reply in Anthropic's error shape.
class MessageReply final : public FrontReply {
 public:
  using FrontReply::FrontReply;

 private:
  HttpResponse Error(const Status& status, std::string_view,
                     double retry_after_seconds) const override {
    return AnthropicError(status, retry_after_seconds);
  }
};

// The thinking switch against the model's template: refused where it cannot think, or where its
// model always reasons (gpt-oss's harmony) and thinking is disabled; else the template's
// enable_thinking (Qwen3's) follows it.
std::optional<Status> ApplyThinking(const llm::LlmEngine& engine,
                                    anthropic::MessagesRequest& request) {
  if (!request.thinking) return std::nullopt;
  const llm::ChatTemplate* chat_template = engine.chat_template();
  const bool thinks = chat_template != nullptr && chat_template->thinks();
  if (*request.thinking && (chat_template == nullptr || !chat_template->reasons())) {
    return Status::InvalidArgument(fmt::format(
        "'thinking' is enabled, but model '{}' has no thinking chat template", request.model));
  }
  if (!*request.thinking && !thinks && chat_template != nullptr && chat_template->reasons()) {
    return Status::InvalidArgument(fmt::format(
        "'thinking' is disabled, but model '{}' (harmony, gpt-oss's format) always reasons",
        request.model));
  }
  if (thinks) request.template_arguments["enable_thinking"] = *request.thinking;
  return std::nullopt;
}

}  // namespace

HttpResponse AnthropicError(const Status& status, double retry_after_seconds) {
  HttpResponse response = HttpResponse::Json(HttpStatusFor(status.code()),
                                             ErrorBody(ErrorType(status.code()), status.message()));
  if (status.code() == StatusCode::kUnavailable) {
    response.headers.emplace_back(
        "Retry-After", std::to_string(static_cast<int64_t>(std::ceil(
                           std::max(retry_after_seconds, status.retry_after_seconds())))));
  }
  return response;
}

void AnthropicHandlers::AddRoutes(Router& router) {
  router.Post("/v1/messages",
              [this](const HttpRequest& request, const PathParams& params, Responder respond) {
                Messages(request, params, std::move(respond));
              });
  router.Post("/v1/messages/count_tokens",
              [this](const HttpRequest& request, const PathParams& params, Responder respond) {
                CountTokens(request, params, std::move(respond));
              });
}

void AnthropicHandlers::Messages(const HttpRequest& request, const PathParams&, Responder respond) {
  anthropic::MessagesRequest parsed;
  if (auto error = anthropic::ParseMessages(request.body, /*count_tokens=*/false, parsed)) {
    return respond(AnthropicError(Status::InvalidArgument(error->message)));
  }
  auto found = service_.Find(parsed.model, &parsed.adapter);
  if (!found.ok()) {
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond,
                    RunAgain(this, &AnthropicHandlers::Messages))) {
      return;
    }
    return respond(AnthropicError(found.status()));
  }

  std::shared_ptr<llm::LlmEngine> engine = *found;
  if (auto refusal = ApplyThinking(*engine, parsed)) return respond(AnthropicError(*refusal));
  auto writer = std::make_shared<MessageWriter>();
  writer->id = RandomId("msg_");
  writer->model = parsed.model;
  writer->omit_thinking = parsed.omit_thinking;
  auto reply = std::make_shared<MessageReply>(writer, 1);
  reply->respond = std::move(respond);
  if (parsed.stream) reply->stream = std::make_shared<ResponseStream>();
  if (request.on_disconnect) request.on_disconnect([reply] { reply->Cancel(); });
  reply->Attach(service_.Start(engine, std::move(parsed), reply));
}

void AnthropicHandlers::CountTokens(const HttpRequest& request, const PathParams&,
                                    Responder respond) {
  anthropic::MessagesRequest parsed;
  if (auto error = anthropic::ParseMessages(request.body, /*count_tokens=*/true, parsed)) {
    return respond(AnthropicError(Status::InvalidArgument(error->message)));
  }
  auto found = service_.Find(parsed.model);
  if (!found.ok()) {
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond,
                    RunAgain(this, &AnthropicHandlers::CountTokens))) {
      return;
    }
    return respond(AnthropicError(found.status()));
  }

  const llm::LlmEngine& engine = **found;
  if (auto refusal = ApplyThinking(engine, parsed)) return respond(AnthropicError(*refusal));
  // The prompt as a generation would run it: the template's, with tools and the reply's opening.
  auto rendered = llm::GenerationService::RenderRequest(engine, parsed);
  if (!rendered.ok()) return respond(AnthropicError(rendered.status()));
  const size_t tokens = engine.tokenizer().Encode(*rendered, /*add_special_tokens=*/false).size();
  JsonWriter json;
  json.BeginObject().Field("input_tokens", static_cast<int64_t>(tokens)).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

}  // namespace sluice
