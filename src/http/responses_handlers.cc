#include "http/responses_handlers.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>

#include "common/json_writer.h"
#include "http/llm_front.h"
#include "http/openai_handlers.h"
#include "http/responses_request.h"

namespace sluice {
namespace {

// One output item as it grows: reasoning, a message's text, or a function call.
struct OutputItem {
  enum class Kind { kReasoning, kMessage, kFunctionCall };
  Kind kind = Kind::kMessage;
  std::string id;
  std::string text;
  llm::ToolCall call;
  bool done = false;
};

// The part of a reasoning item or message: {"type": "reasoning_text" | "output_text", "text"}.
void WritePart(JsonWriter& json, const OutputItem& item, std::string_view text) {
  if (item.kind == OutputItem::Kind::kReasoning) {
    json.BeginObject().Field("type", "reasoning_text").Field("text", text).EndObject();
  } else {
    json.BeginObject().Field("type", "output_text").Field("text", text);
    json.Key("annotations").BeginArray().EndArray().Key("logprobs").BeginArray().EndArray();
    json.EndObject();
  }
}

// An item as the output lists it; before it is done, as output_item.added announces it.
void WriteItem(JsonWriter& json, const OutputItem& item) {
  json.BeginObject().Field("id", item.id);
  switch (item.kind) {
    case OutputItem::Kind::kReasoning:
      json.Field("type", "reasoning").Key("summary").BeginArray().EndArray();
      json.Key("content").BeginArray();
      if (item.done) WritePart(json, item, item.text);
      json.EndArray();
      break;
    case OutputItem::Kind::kMessage:
      json.Field("type", "message").Field("role", "assistant").Key("content").BeginArray();
      if (item.done) WritePart(json, item, item.text);
      json.EndArray();
      break;
    case OutputItem::Kind::kFunctionCall:
      json.Field("type", "function_call").Field("call_id", item.call.id);
      json.Field("name", item.call.name).Field("arguments", item.done ? item.call.arguments : "");
      break;
  }
  json.Field("status", item.done ? "completed" : "in_progress").EndObject();
}

// What a response object repeats of its request.
struct Echo {
  std::optional<std::string> instructions;
  std::string previous_response_id;
  std::string tools_json, tool_choice_json, text_json, reasoning_json, metadata_json;
  int max_output_tokens = 0;
  double temperature = 1, top_p = 1;
  bool parallel_tool_calls = true;
  bool store = true;
};

// One response to one request in OpenAI's shape: a body or a stream of events (see EventWriter
// for which thread runs what).
class ResponseWriter final : public EventWriter {
 public:
  std::string id, model;
  int64_t created = 0;
  Echo echo;
  bool streaming = false;
  // The conversation so far (no instructions), kept with this response's output when stored.
  std::vector<llm::ChatMessage> conversation;
  std::vector<std::string> input_items;  // This request's, as JSON objects with ids.
  ResponseStore* store = nullptr;        // Null: store false.
  // Counts the reasoning's tokens; kept so a response rendered after its model unloads has it.
  std::shared_ptr<const llm::Tokenizer> tokenizer;

  // response.created and response.in_progress: posted before the generation starts, so they
  // lead the stream.
  std::string Begin() {
    std::string out = Event("response.created", [&](JsonWriter& json) {
      json.Key("response");
      WriteResponse(json, "in_progress", llm::FinishReason::kNone);
    });
    out += Event("response.in_progress", [&](JsonWriter& json) {
      json.Key("response");
      WriteResponse(json, "in_progress", llm::FinishReason::kNone);
    });
    return out;
  }

  std::string StreamFailure(const Status& error) override {
    error_ = error.message();
    return Event("response.failed", [&](JsonWriter& json) {
      json.Key("response");
      WriteResponse(json, "failed", llm::FinishReason::kError);
    });
  }

  void Add(const llm::ChoiceEvent& event) override {
    std::string none;  // Not streaming: no event text.
    Apply(none, event);
  }

  std::string Body() override { return Complete(); }

  std::string StreamChoice(const llm::ChoiceEvent& event, bool) override {
    std::string out;
    Apply(out, event);
    if (finish_ == llm::FinishReason::kNone) return out;
    const bool cut = finish_ == llm::FinishReason::kLength;
    const std::string body = Complete();
    out += Event(cut ? "response.incomplete" : "response.completed", [&](JsonWriter& json) {
      json.Key("response").Raw(body);
    });
    return out;
  }

 private:
  // An event's text and calls into the output items (and, streaming, their events into `out`).
  void Apply(std::string& out, const llm::ChoiceEvent& event) {
    prompt_tokens_ = event.prompt_tokens;
    cached_tokens_ = event.cached_prompt_tokens;
    output_tokens_ = event.completion_tokens;
    Grow(out, OutputItem::Kind::kReasoning, event.reasoning);
    Grow(out, OutputItem::Kind::kMessage, event.content);
    for (const llm::ToolCall& call : event.tool_calls) {
      Close(out);
      OutputItem& item = items_.emplace_back();
      item.kind = OutputItem::Kind::kFunctionCall;
      item.id = RandomId("fc_");
      item.call = call;
      if (streaming) {
        out += Added(item);
        const int64_t index = static_cast<int64_t>(items_.size()) - 1;
        out += Event("response.function_call_arguments.delta", [&](JsonWriter& json) {
          json.Field("item_id", item.id).Field("output_index", index);
          json.Field("delta", call.arguments);
        });
        out += Event("response.function_call_arguments.done", [&](JsonWriter& json) {
          json.Field("item_id", item.id).Field("output_index", index);
          json.Field("name", call.name).Field("arguments", call.arguments);
        });
      }
      Close(out);
    }
    if (event.finish != llm::FinishReason::kNone) {
      Close(out);
      finish_ = event.finish;
    }
  }

  // "event: TYPE\ndata: {"type", "sequence_number", ...}\n\n".
  template <typename Fill>
  std::string Event(std::string_view type, Fill fill) {
    JsonWriter json;
    json.BeginObject().Field("type", type).Field("sequence_number", sequence_++);
    fill(json);
    json.EndObject();
    return fmt::format("event: {}\ndata: {}\n\n", type, json.str());
  }

  std::string Added(const OutputItem& item) {
    const int64_t index = static_cast<int64_t>(items_.size()) - 1;
    std::string out = Event("response.output_item.added", [&](JsonWriter& json) {
      json.Field("output_index", index).Key("item");
      WriteItem(json, item);
    });
    if (item.kind != OutputItem::Kind::kFunctionCall) {
      out += Event("response.content_part.added", [&](JsonWriter& json) {
        json.Field("item_id", item.id).Field("output_index", index);
        json.Field("content_index", int64_t{0}).Key("part");
        WritePart(json, item, "");
      });
    }
    return out;
  }

  // Text for an item of `kind`: the open one grows, or another opens after the open one closes.
  void Grow(std::string& out, OutputItem::Kind kind, const std::string& text) {
    if (text.empty()) return;
    if (items_.empty() || items_.back().done || items_.back().kind != kind) {
      Close(out);
      OutputItem& item = items_.emplace_back();
      item.kind = kind;
      item.id = RandomId(kind == OutputItem::Kind::kReasoning ? "rs_" : "msg_");
      if (streaming) out += Added(item);
    }
    OutputItem& item = items_.back();
    item.text += text;
    if (!streaming) return;
    const int64_t index = static_cast<int64_t>(items_.size()) - 1;
    const bool reasoning = kind == OutputItem::Kind::kReasoning;
    out += Event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                 [&](JsonWriter& json) {
                   json.Field("item_id", item.id).Field("output_index", index);
                   json.Field("content_index", int64_t{0}).Field("delta", text);
                   if (!reasoning) json.Key("logprobs").BeginArray().EndArray();
                 });
  }

  // The open item, done.
  void Close(std::string& out) {
    if (items_.empty() || items_.back().done) return;
    OutputItem& item = items_.back();
    item.done = true;
    if (!streaming) return;
    const int64_t index = static_cast<int64_t>(items_.size()) - 1;
    if (item.kind != OutputItem::Kind::kFunctionCall) {
      const bool reasoning = item.kind == OutputItem::Kind::kReasoning;
      out += Event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                   [&](JsonWriter& json) {
                     json.Field("item_id", item.id).Field("output_index", index);
                     json.Field("content_index", int64_t{0}).Field("text", item.text);
                     if (!reasoning) json.Key("logprobs").BeginArray().EndArray();
                   });
      out += Event("response.content_part.done", [&](JsonWriter& json) {
        json.Field("item_id", item.id).Field("output_index", index);
        json.Field("content_index", int64_t{0}).Key("part");
        WritePart(json, item, item.text);
      });
    }
    out += Event("response.output_item.done", [&](JsonWriter& json) {
      json.Field("output_index", index).Key("item");
      WriteItem(json, item);
    });
  }

  // The finished response (stored where the request asked): its reasoning tokens counted, once.
  std::string Complete() {
    for (const OutputItem& item : items_) {
      if (item.kind == OutputItem::Kind::kReasoning) {
        reasoning_tokens_ += static_cast<int>(tokenizer->Encode(item.text, false).size());
      }
    }
    const bool cut = finish_ == llm::FinishReason::kLength;
    JsonWriter body;
    WriteResponse(body, cut ? "incomplete" : "completed", finish_);
    if (store != nullptr) Store(body.str());
    return body.str();
  }

  // The conversation with this response's output, as one assistant turn.
  void Store(std::string body) {
    StoredResponse stored;
    stored.id = id;
    stored.model = model;
    stored.body = std::move(body);
    stored.conversation = conversation;
    stored.input_items = input_items;
    llm::ChatMessage turn;
    turn.role = "assistant";
    for (const OutputItem& item : items_) {
      if (item.kind == OutputItem::Kind::kReasoning) turn.reasoning_content += item.text;
      if (item.kind == OutputItem::Kind::kMessage) turn.content += item.text;
      if (item.kind == OutputItem::Kind::kFunctionCall) {
        turn.tool_calls.push_back({item.call.id, item.call.name, item.call.arguments});
      }
    }
    stored.conversation.push_back(std::move(turn));
    store->Put(std::move(stored));
  }

  void WriteResponse(JsonWriter& json, std::string_view status, llm::FinishReason finish) const {
    json.BeginObject().Field("id", id).Field("object", "response").Field("created_at", created);
    json.Field("status", status).Field("background", false).Key("error");
    if (finish == llm::FinishReason::kError) {
      json.BeginObject().Field("code", "server_error").Field("message", error_).EndObject();
    } else {
      json.Null();
    }
    json.Key("incomplete_details");
    if (finish == llm::FinishReason::kLength) {
      json.BeginObject().Field("reason", "max_output_tokens").EndObject();
    } else {
      json.Null();
    }
    json.Key("instructions");
    if (echo.instructions) {
      json.String(*echo.instructions);
    } else {
      json.Null();
    }
    json.Key("max_output_tokens");
    if (echo.max_output_tokens > 0) {
      json.Int(echo.max_output_tokens);
    } else {
      json.Null();
    }
    json.Field("model", model).Key("output").BeginArray();
    const bool final = status != "in_progress";
    if (final) {
      for (const OutputItem& item : items_) WriteItem(json, item);
    }
    json.EndArray().Field("parallel_tool_calls", echo.parallel_tool_calls);
    json.Key("previous_response_id");
    if (echo.previous_response_id.empty()) {
      json.Null();
    } else {
      json.String(echo.previous_response_id);
    }
    json.Key("reasoning").Raw(echo.reasoning_json).Field("store", echo.store);
    json.Field("temperature", echo.temperature).Key("text").Raw(echo.text_json);
    json.Key("tool_choice").Raw(echo.tool_choice_json).Key("tools").Raw(echo.tools_json);
    json.Field("top_p", echo.top_p).Field("truncation", "disabled");
    json.Key("metadata").Raw(echo.metadata_json).Key("usage");
    if (final && finish != llm::FinishReason::kError) {
      json.BeginObject().Field("input_tokens", int64_t{prompt_tokens_});
      json.Key("input_tokens_details").BeginObject();
      json.Field("cached_tokens", int64_t{cached_tokens_}).EndObject();
      json.Field("output_tokens", int64_t{output_tokens_}).Key("output_tokens_details");
      json.BeginObject().Field("reasoning_tokens", int64_t{reasoning_tokens_}).EndObject();
      json.Field("total_tokens", int64_t{prompt_tokens_ + output_tokens_}).EndObject();
    } else {
      json.Null();
    }
    json.EndObject();
  }

  int64_t sequence_ = 0;
  llm::FinishReason finish_ = llm::FinishReason::kNone;
  std::string error_;
  std::vector<OutputItem> items_;
  int prompt_tokens_ = 0, cached_tokens_ = 0, output_tokens_ = 0;
  int reasoning_tokens_ = 0;  // Set once the response is done.
};

// reasoning.effort against the model's template: a template that reads reasoning_effort
// (gpt-oss's) is given it; a thinking one thinks unless the effort is "none" or "minimal"
// (Qwen3's enable_thinking); one that does not reason takes only those two.
std::optional<Status> ApplyEffort(const llm::LlmEngine& engine,
                                  responses::ResponsesRequest& request) {
  const std::string& effort = request.reasoning_effort;
  if (effort.empty()) return std::nullopt;
  const llm::ChatTemplate* chat_template = engine.chat_template();
  const bool off = effort == "none" || effort == "minimal";
  if (chat_template != nullptr &&
      chat_template->source().find("reasoning_effort") != std::string::npos) {
    request.template_arguments["reasoning_effort"] = effort;
  } else if (chat_template != nullptr && chat_template->thinks()) {
    request.template_arguments["enable_thinking"] = !off;
  } else if (!off) {
    return Status::InvalidArgument(
        fmt::format("'reasoning.effort' '{}': model '{}' has no thinking chat template", effort,
                    request.model));
  }
  return std::nullopt;
}

}  // namespace

void ResponsesHandlers::AddRoutes(Router& router) {
  router.Post("/v1/responses",
              [this](const HttpRequest& request, const PathParams& params, Responder respond) {
                Create(request, params, std::move(respond));
              });
  router.Get("/v1/responses/{id}",
             [this](const HttpRequest& request, const PathParams& params, Responder respond) {
               Retrieve(request, params, std::move(respond));
             });
  router.Get("/v1/responses/{id}/input_items",
             [this](const HttpRequest& request, const PathParams& params, Responder respond) {
               InputItems(request, params, std::move(respond));
             });
  router.Add("DELETE", "/v1/responses/{id}",
             [this](const HttpRequest& request, const PathParams& params, Responder respond) {
               Delete(request, params, std::move(respond));
             });
}

void ResponsesHandlers::Create(const HttpRequest& request, const PathParams&, Responder respond) {
  responses::ResponsesRequest parsed;
  if (auto error = responses::ParseResponses(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = service_.Find(parsed.model, &parsed.adapter);
  if (!found.ok()) {
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond,
                    RunAgain(this, &ResponsesHandlers::Create))) {
      return;
    }
    return respond(OpenAiError(found.status(), "model"));
  }

  std::shared_ptr<llm::LlmEngine> engine = *found;
  if (auto refusal = ApplyEffort(*engine, parsed)) {
    return respond(OpenAiError(*refusal, "reasoning"));
  }
  auto writer = std::make_shared<ResponseWriter>();
  if (!parsed.previous_response_id.empty()) {
    auto previous = store_.Get(parsed.previous_response_id);
    if (previous == nullptr) {
      return respond(OpenAiError(
          Status::InvalidArgument(fmt::format(
              "Previous response with id '{}' not found (never stored, deleted, or let go by "
              "the store's bound)",
              parsed.previous_response_id)),
          "previous_response_id"));
    }
    writer->conversation = previous->conversation;
  }
  for (llm::ChatMessage& message : parsed.input) writer->conversation.push_back(message);
  // Instructions lead this request only: they do not carry over to the next.
  if (parsed.instructions) {
    llm::ChatMessage system;
    system.role = "system";
    system.content = *parsed.instructions;
    parsed.messages.push_back(std::move(system));
  }
  parsed.messages.insert(parsed.messages.end(), writer->conversation.begin(),
                         writer->conversation.end());
  writer->id = RandomId("resp_");
  writer->model = parsed.model;
  writer->created = UnixSeconds();
  writer->echo = Echo{parsed.instructions,
                     parsed.previous_response_id,
                     parsed.tools_json,
                     parsed.tool_choice_json,
                     parsed.text_json,
                     parsed.reasoning_json,
                     parsed.metadata_json,
                     parsed.max_output_tokens,
                     parsed.sampling.temperature,
                     parsed.sampling.top_p,
                     parsed.tools.parallel,
                     parsed.store};
  writer->store = parsed.store ? &store_ : nullptr;
  if (parsed.store) writer->input_items = std::move(parsed.input_items);
  writer->tokenizer = engine->shared_tokenizer();
  writer->streaming = parsed.stream;
  auto reply = std::make_shared<OpenAiReply>(writer, 1);
  reply->respond = std::move(respond);
  if (parsed.stream) {
    reply->stream = std::make_shared<ResponseStream>();
    reply->stream->Post([writer] { return writer->Begin(); }, 4096 + writer->echo.tools_json.size());
  }
  if (request.on_disconnect) request.on_disconnect([reply] { reply->Cancel(); });
  reply->Attach(service_.Start(engine, std::move(parsed), reply));
}

void ResponsesHandlers::Retrieve(const HttpRequest&, const PathParams& params, Responder respond) {
  const std::string id(params.Get("id"));
  auto stored = store_.Get(id);
  if (stored == nullptr) {
    return respond(
        OpenAiError(Status::NotFound(fmt::format("No response with id '{}' is stored", id)), "id"));
  }
  respond(HttpResponse::Json(200, stored->body));
}

void ResponsesHandlers::Delete(const HttpRequest&, const PathParams& params, Responder respond) {
  const std::string id(params.Get("id"));
  if (!store_.Delete(id)) {
    return respond(
        OpenAiError(Status::NotFound(fmt::format("No response with id '{}' is stored", id)), "id"));
  }
  JsonWriter json;
  json.BeginObject().Field("id", id).Field("object", "response").Field("deleted", true);
  json.EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void ResponsesHandlers::InputItems(const HttpRequest& request, const PathParams& params,
                                   Responder respond) {
  const std::string id(params.Get("id"));
  auto parameters = QueryParameters(request.query);
  if (!parameters) {
    return respond(OpenAiError(Status::InvalidArgument("the query string has a malformed escape")));
  }
  int64_t limit = 20;
  bool ascending = false;
  std::string after;
  for (const auto& [name, value] : *parameters) {
    if (name == "limit") {
      char* end = nullptr;
      limit = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || limit < 1 || limit > 100) {
        return respond(OpenAiError(
            Status::InvalidArgument("'limit' must be a whole number from 1 to 100"), "limit"));
      }
    } else if (name == "order") {
      if (value != "asc" && value != "desc") {
        return respond(
            OpenAiError(Status::InvalidArgument("'order' must be \"asc\" or \"desc\""), "order"));
      }
      ascending = value == "asc";
    } else if (name == "after") {
      after = value;
    } else {
      return respond(OpenAiError(
          Status::InvalidArgument(fmt::format("'{}' is not supported by Sluice", name)), name));
    }
  }
  auto stored = store_.Get(id);
  if (stored == nullptr) {
    return respond(
        OpenAiError(Status::NotFound(fmt::format("No response with id '{}' is stored", id)), "id"));
  }
  // Each item's id, to page by.
  std::vector<std::pair<std::string, const std::string*>> items;
  simdjson::dom::parser parser;
  for (const std::string& item : stored->input_items) {
    std::string_view item_id;
    if (parser.parse(item)["id"].get(item_id) != simdjson::SUCCESS) continue;
    items.emplace_back(std::string(item_id), &item);
  }
  if (!ascending) std::reverse(items.begin(), items.end());
  size_t start = 0;
  if (!after.empty()) {
    while (start < items.size() && items[start].first != after) ++start;
    if (start == items.size()) {
      return respond(OpenAiError(
          Status::InvalidArgument(fmt::format("No input item with id '{}' in response '{}'",
                                              after, id)),
          "after"));
    }
    ++start;
  }
  const size_t end = std::min(items.size(), start + static_cast<size_t>(limit));
  JsonWriter json;
  json.BeginObject().Field("object", "list").Key("data").BeginArray();
  for (size_t i = start; i < end; ++i) json.Raw(*items[i].second);
  json.EndArray().Key("first_id");
  if (start < end) {
    json.String(items[start].first);
  } else {
    json.Null();
  }
  json.Key("last_id");
  if (start < end) {
    json.String(items[end - 1].first);
  } else {
    json.Null();
  }
  json.Field("has_more", end < items.size()).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

}  // namespace sluice
