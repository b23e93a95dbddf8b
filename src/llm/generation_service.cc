#include "llm/generation_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "common/json_writer.h"
#include "llm/text/harmony.h"
#include "llm/text/reasoning.h"
#include "llm/text/stop_strings.h"
#include "llm/text/tool_prompt.h"

namespace sluice::llm {
namespace {

// Refused before anything runs: the status and the request parameter at fault.
struct Refusal {
  Status status;
  std::string param;
};

// One choice's text on its way from tokens to events (engine thread only).
struct ChoiceText {
  ChoiceText(const Tokenizer& tokenizer, bool skip_special, std::vector<std::string> stops)
      : decoder(tokenizer, skip_special), stops(std::move(stops)) {}

  StreamDecoder decoder;
  StopStringMatcher stops;
  std::optional<ReasoningSplitter> reasoning;  // A thinking template.
  std::optional<ToolCallParser> tool_parser;   // tool_choice auto.
  std::optional<HarmonyParser> harmony;        // gpt-oss's format: reasoning and calls both.
  bool constrained_calls = false;              // required / a named function.
  std::string call_text;                       // Of a constrained reply: a JSON array of calls.
  int calls = 0;                               // Tool calls given so far.
  int max_calls = 0;                           // parallel_tool_calls false: 1; else 0 (any).
  ToolCallFormat id_format = ToolCallFormat::kUnknown;  // Ids in the form the template accepts.
  bool done = false;

  // `text` (the reply's next piece; `end`: its last; `closed`: the model ended it with an end
  // token) to content, reasoning and calls.
  void Feed(std::string text, bool end, bool closed, ChoiceEvent& out) {
    if (harmony) {
      HarmonyParser::Pieces pieces = harmony->Add(text);
      if (end) {
        HarmonyParser::Pieces rest = harmony->Finish(closed);
        pieces.reasoning += rest.reasoning;
        pieces.content += rest.content;
        for (ToolCall& call : rest.calls) pieces.calls.push_back(std::move(call));
      }
      out.reasoning = std::move(pieces.reasoning);
      text = std::move(pieces.content);
      out.tool_calls = std::move(pieces.calls);
    }
    if (reasoning) {
      ReasoningSplitter::Pieces pieces = reasoning->Add(text);
      if (end) {
        ReasoningSplitter::Pieces rest = reasoning->Finish();
        pieces.reasoning += rest.reasoning;
        pieces.content += rest.content;
      }
      out.reasoning = std::move(pieces.reasoning);
      text = std::move(pieces.content);
    }
    if (constrained_calls) {
      call_text += text;
      text.clear();
      if (end) {
        auto parsed = ParseToolCallArray(call_text);
        // Cut short (the token limit): the calls it completed, never the array's text.
        out.tool_calls = parsed.ok() ? std::move(*parsed) : CompleteToolCalls(call_text);
      }
    } else if (tool_parser) {
      ToolCallParser::Pieces pieces = tool_parser->Add(text);
      if (end) {
        ToolCallParser::Pieces rest = tool_parser->Finish();
        pieces.content += rest.content;
        for (ToolCall& call : rest.calls) pieces.calls.push_back(std::move(call));
      }
      text = std::move(pieces.content);
      out.tool_calls = std::move(pieces.calls);
    }
    out.content = std::move(text);
    if (max_calls > 0 && calls + static_cast<int>(out.tool_calls.size()) > max_calls) {
      out.tool_calls.resize(static_cast<size_t>(std::max(0, max_calls - calls)));
    }
    if (id_format == ToolCallFormat::kMistral) {
      for (ToolCall& call : out.tool_calls) call.id = NewToolCallId(id_format);
    }
    out.first_tool_call = calls;
    calls += static_cast<int>(out.tool_calls.size());
  }
};

// A generation's n choices: what the front, the engine's events and Cancel() share. It holds
// its engine weakly: the engine's callbacks hold it, and an engine whose last owner were its own
// callbacks would be destroyed on its own loop thread, which cannot join itself. Its events come
// from the engine's loop, so the engine outlives each of them; Launch's caller holds it.
class Run final : public Generation {
 public:
  Run(const std::shared_ptr<LlmEngine>& engine, std::shared_ptr<GenerationObserver> observer, int n)
      : engine_(engine.get()),
        owner_(engine),
        observer_(std::move(observer)),
        ids_(static_cast<size_t>(n)) {}

  void Cancel() override {
    if (cancelled_.exchange(true)) return;
    CancelChoices();
  }

  // Set up before Launch; the engine thread's afterwards.
  std::vector<ChoiceText> choices;

  // Submits the n choices (all or nothing), then tells the observer.
  void Launch(const std::shared_ptr<Run>& self, const GenerationRequest& request) {
    const int n = static_cast<int>(ids_.size());
    for (int i = 0; i < n && !cancelled_.load(); ++i) {
      GenerationRequest choice = request;
      if (choice.sampling.seed) *choice.sampling.seed += static_cast<uint64_t>(i);
      // The other choices share the first one's prompt blocks rather than computing them again.
      if (i > 0) choice.shares_prompt_of = ids_[0].load();
      const auto index = static_cast<size_t>(i);
      auto submitted = engine_->Submit(std::move(choice), [self, index](const GenerationEvent& e) {
        self->OnEngineEvent(index, e);
      });
      if (!submitted.ok()) {
        // All or nothing: the choices already queued are dropped unanswered.
        cancelled_ = true;
        CancelChoices();
        return observer_->OnRejected(submitted.status(), "", engine_->EstimatedWaitSeconds());
      }
      ids_[index] = *submitted;
    }
    if (cancelled_.load()) {
      // The client left before (or while) its choices were queued.
      CancelChoices();
      return observer_->OnRejected(Status::Cancelled("the client disconnected"), "", 0);
    }
    observer_->OnAccepted();
  }

  bool cancelled() const { return cancelled_.load(); }
  GenerationObserver& observer() { return *observer_; }

 private:
  void CancelChoices() {
    const std::shared_ptr<LlmEngine> engine = owner_.lock();  // Gone: nothing left to cancel.
    if (engine == nullptr) return;
    for (const auto& id : ids_) {
      if (const uint64_t request = id.load()) engine->Cancel(request);
    }
  }

  void OnEngineEvent(size_t index, const GenerationEvent& event) {
    if (cancelled_.load() || failed_) return;
    ChoiceText& choice = choices[index];
    if (choice.done) return;  // Tokens of the step that reached a stop string.
    if (event.finish == FinishReason::kError) {
      failed_ = true;
      CancelChoices();
      return observer_->OnFailed(event.error);
    }
    ChoiceEvent out;
    out.index = index;
    out.prompt_tokens = event.prompt_tokens;
    out.cached_prompt_tokens = event.cached_prompt_tokens;
    out.completion_tokens = event.completion_tokens;
    if (event.logprobs) out.logprobs.push_back(*event.logprobs);
    FinishReason finish = event.finish;
    std::string text;
    if (finish != FinishReason::kStop) {
      text = choice.decoder.Push(event.token);  // Not EOS.
    } else if (choice.harmony) {
      // gpt-oss's end tokens close its last message: <|call|> makes it a call.
      const std::string end = engine_->tokenizer().TokenBytes(event.token);
      if (end == "<|call|>" || end == "<|return|>") text = choice.decoder.Push(event.token);
    }
    if (finish != FinishReason::kNone) text += choice.decoder.Flush();
    StopStringMatcher::Released released = choice.stops.Add(text);
    if (released.stopped) {
      finish = FinishReason::kStop;
      out.stop_string = std::move(released.stop);
      engine_->EndEarly(ids_[index].load());
    } else if (finish != FinishReason::kNone) {
      released.text += choice.stops.Flush();
    }
    bool end = finish != FinishReason::kNone;
    choice.Feed(std::move(released.text), end,
                event.finish == FinishReason::kStop && !released.stopped, out);
    if (!end && choice.max_calls > 0 && choice.calls >= choice.max_calls) {
      // parallel_tool_calls false: the reply ends with its one call.
      finish = FinishReason::kStop;
      end = true;
      engine_->EndEarly(ids_[index].load());
    }
    if (end) {
      choice.done = true;
      if (choice.calls > 0 && finish == FinishReason::kStop) finish = FinishReason::kToolCalls;
    }
    out.finish = finish;
    observer_->OnChoice(out);
  }

  LlmEngine* const engine_;  // Launch (its caller holds it) and events (its loop runs them).
  const std::weak_ptr<LlmEngine> owner_;  // Other threads: Cancel().
  std::shared_ptr<GenerationObserver> observer_;
  std::vector<std::atomic<uint64_t>> ids_;  // The choices' engine ids; 0 until submitted.
  std::atomic<bool> cancelled_{false};
  bool failed_ = false;  // Engine thread only.
};

// The JSON Schema a constrained reply follows: an array of {"name", "arguments"} calls of the
// allowed functions (one call unless parallel calls are allowed).
std::string ToolCallSchema(const ToolOptions& tools) {
  JsonWriter json;
  json.BeginObject().Field("type", "array").Field("minItems", int64_t{1});
  if (!tools.parallel) json.Field("maxItems", int64_t{1});
  json.Key("items").BeginObject().Key("anyOf").BeginArray();
  for (const ToolFunction& f : tools.functions) {
    if (tools.choice == ToolOptions::Choice::kFunction && f.name != tools.function) continue;
    json.BeginObject().Field("type", "object").Key("properties").BeginObject();
    json.Key("name").BeginObject().Key("enum").BeginArray().String(f.name).EndArray().EndObject();
    json.Key("arguments");
    if (f.parameters.empty()) {
      json.BeginObject().Field("type", "object").EndObject();
    } else {
      json.Raw(f.parameters);
    }
    json.EndObject().Key("required").BeginArray().String("name").String("arguments").EndArray();
    json.Field("additionalProperties", false).EndObject();
  }
  json.EndArray().EndObject().EndObject();
  return json.str();
}

// The JSON Schema of a function's arguments under auto: its own where it is strict, any object
// where not.
void WriteArguments(JsonWriter& json, const ToolFunction& f) {
  if (f.strict && !f.parameters.empty()) {
    json.Raw(f.parameters);
  } else {
    json.BeginObject().Field("type", "object").EndObject();
  }
}

// Under tool_choice auto with a strict function: XGrammar's structural tag for the template's
// call format. The reply is free until it opens a call (the format's marker: "<tool_call>",
// Llama 3's and the JSON fallback's '{"name": "', Mistral's "[TOOL_CALLS]"); then the call names
// one of the functions and its arguments follow that function's schema (any object for a
// function that is not strict). One call at most without parallel_tool_calls.
std::string StrictCallsTag(const ToolOptions& tools, ToolCallFormat format,
                           std::string_view template_source) {
  const bool mistral = format == ToolCallFormat::kMistral;
  const bool named = mistral && template_source.find("[ARGS]") != std::string_view::npos;
  const bool deepseek = format == ToolCallFormat::kDeepSeek;
  // DeepSeek R1's form puts the arguments in a ```json fence after "function" and the name.
  const bool fenced = deepseek && template_source.find("```json") != std::string_view::npos;
  std::string_view trigger = format == ToolCallFormat::kHermes ? "<tool_call>"
                             : mistral                         ? "[TOOL_CALLS]"
                             : deepseek                        ? "<｜tool▁calls▁begin｜>"
                                                               : "{\"name\": \"";
  JsonWriter json;
  json.BeginObject().Field("type", "structural_tag").Key("format").BeginObject();
  json.Field("type", "triggered_tags").Key("triggers").BeginArray().String(trigger).EndArray();
  json.Key("tags").BeginArray();
  if (mistral && !named) {
    // [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]: one tag, an array of calls.
    json.BeginObject().Field("type", "tag").Field("begin", "[TOOL_CALLS]");
    json.Key("content").BeginObject().Field("type", "json_schema").Key("json_schema");
    json.BeginObject().Field("type", "array").Field("minItems", int64_t{1});
    if (!tools.parallel) json.Field("maxItems", int64_t{1});
    json.Key("items").BeginObject().Key("anyOf").BeginArray();
    for (const ToolFunction& f : tools.functions) {
      json.BeginObject().Field("type", "object").Key("properties").BeginObject();
      json.Key("name").BeginObject().Key("enum").BeginArray().String(f.name).EndArray();
      json.EndObject().Key("arguments");
      WriteArguments(json, f);
      json.EndObject().Key("required").BeginArray().String("name").String("arguments");
      json.EndArray().Field("additionalProperties", false).EndObject();
    }
    json.EndArray().EndObject().EndObject().EndObject().Field("end", "").EndObject();
  } else {
    for (const ToolFunction& f : tools.functions) {
      JsonWriter name;
      name.String(f.name);
      std::string begin, end;
      switch (format) {
        case ToolCallFormat::kHermes:
          begin = "<tool_call>\n{\"name\": " + name.str() + ", \"arguments\": ";
          end = "}\n</tool_call>";
          break;
        case ToolCallFormat::kMistral:
          begin = "[TOOL_CALLS]" + f.name + "[ARGS]";
          break;
        case ToolCallFormat::kLlama3Json:
          begin = "{\"name\": " + name.str() + ", \"parameters\": ";
          end = "}";
          break;
        case ToolCallFormat::kDeepSeek:
          begin = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" +
                  (fenced ? "function<｜tool▁sep｜>" + f.name + "\n```json\n"
                          : f.name + "<｜tool▁sep｜>");
          end = std::string(fenced ? "\n```" : "") + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
          break;
        default:
          begin = "{\"name\": " + name.str() + ", \"arguments\": ";
          end = "}";
          break;
      }
      json.BeginObject().Field("type", "tag").Field("begin", begin);
      json.Key("content").BeginObject().Field("type", "json_schema").Key("json_schema");
      WriteArguments(json, f);
      json.EndObject().Field("end", end).EndObject();
    }
  }
  // Llama 3's call, the JSON fallback's and Mistral's array are the whole reply: it ends with them.
  const bool several = format == ToolCallFormat::kHermes || named;  // DeepSeek's: one, closed.
  json.EndArray().Field("at_least_one", false);
  json.Field("stop_after_first", !several || !tools.parallel).EndObject().EndObject();
  return json.str();
}

// A thinking template's reply under a JSON schema: the thinking block free (to its "</think>"; a
// block the prompt opened, or one the model may open), then a document of `schema`. XGrammar's
// structural tag, as vLLM constrains a reasoning model's output after its reasoning ends.
std::string AfterReasoningTag(const std::string& schema, bool opened) {
  JsonWriter json;
  json.BeginObject().Field("type", "structural_tag").Key("format").BeginObject();
  json.Field("type", "sequence").Key("elements").BeginArray();
  if (!opened) json.BeginObject().Field("type", "optional").Key("content");
  json.BeginObject().Field("type", "tag").Field("begin", opened ? "" : "<think>");
  json.Key("content").BeginObject().Field("type", "any_text").EndObject();
  json.Field("end", "</think>").EndObject();
  if (!opened) json.EndObject();
  json.BeginObject().Field("type", "json_schema").Key("json_schema").Raw(schema).EndObject();
  json.EndArray().EndObject().EndObject();
  return json.str();
}

bool AnyStrict(const ToolOptions& tools) {
  return std::any_of(tools.functions.begin(), tools.functions.end(),
                     [](const ToolFunction& f) { return f.strict; });
}

// A harmony reply's grammar (HarmonyReplyTag): a forced call of the functions (the named one),
// their arguments under their schemas; under auto with a strict function, the final message
// free or a call (strict functions' arguments under their schemas, the others' any object); a
// response format's document as the final message. Empty where the reply takes no grammar; an
// error where the vocabulary lacks one of harmony's markers as a token.
Result<std::string> HarmonyTag(const LlmEngine& engine, const GenerateRequest& request,
                               bool forced_calls, bool parse_calls) {
  const ToolOptions& tools = request.tools;
  std::optional<std::string> answer;
  std::vector<HarmonyCallSchema> calls;
  if (forced_calls || (parse_calls && AnyStrict(tools))) {
    for (const ToolFunction& f : tools.functions) {
      if (tools.choice == ToolOptions::Choice::kFunction && f.name != tools.function) continue;
      JsonWriter arguments;
      if (forced_calls && !f.parameters.empty()) {
        arguments.Raw(f.parameters);
      } else {
        WriteArguments(arguments, f);
      }
      calls.push_back({f.name, arguments.str()});
    }
    if (!forced_calls) answer = "";
  } else if (request.response_format.type == ResponseFormat::Type::kJsonObject) {
    answer = R"({"type":"object"})";
  } else if (request.response_format.type == ResponseFormat::Type::kJsonSchema) {
    answer = request.response_format.schema;
  } else {
    return std::string();
  }
  const Tokenizer& tokenizer = engine.tokenizer();
  std::array<int32_t, kHarmonyMarkers.size()> ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = tokenizer.TokenId(kHarmonyMarkers[i]);
    if (ids[i] < 0) {
      return Status::InvalidArgument(fmt::format(
          "this model's chat format is harmony (gpt-oss's), but its vocabulary has no token {}: "
          "its replies cannot be constrained",
          kHarmonyMarkers[i]));
    }
  }
  std::vector<int32_t> special;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) special.push_back(id);
  }
  return HarmonyReplyTag(ids, special, answer, calls);
}

// What tool calling asks of the model's template, checked before anything runs.
std::optional<Refusal> CheckTools(const LlmEngine& engine, const GenerateRequest& request,
                                  ToolCallFormat& format) {
  const ToolOptions& tools = request.tools;
  if (tools.functions.empty()) return std::nullopt;
  const ChatTemplate* chat_template = engine.chat_template();
  if (chat_template == nullptr) {
    return Refusal{Status::InvalidArgument("this model has no chat template to render tools"),
                   "tools"};
  }
  if (tools.choice == ToolOptions::Choice::kNone) return std::nullopt;
  if (request.response_format.type != ResponseFormat::Type::kText) {
    return Refusal{Status::InvalidArgument("'response_format' cannot be combined with 'tools' "
                                           "unless 'tool_choice' is \"none\""),
                   "response_format"};
  }
  if (tools.choice != ToolOptions::Choice::kAuto) return std::nullopt;
  // A template that renders no tools is given them in the conversation, in the JSON fallback's
  // form (ToolsInConversation).
  format = chat_template->renders_tools() ? ToolCallFormatOf(chat_template->source())
                                          : ToolCallFormat::kJson;
  if (format == ToolCallFormat::kUnknown) {
    return Refusal{
        Status::InvalidArgument("no tool-call format is known for this model's chat template; use "
                                "'tool_choice' \"required\" or a named function, whose calls are "
                                "constrained"),
        "tool_choice"};
  }
  return std::nullopt;
}

// An embeddings request's inputs under way: one engine request each, queued together. Holds its
// engine weakly, as Run does.
class EmbeddingRun final : public Generation {
 public:
  EmbeddingRun(const std::shared_ptr<LlmEngine>& engine, size_t inputs, EmbeddingsCallback done)
      : owner_(engine), ids_(inputs), done_(std::move(done)) {
    result_.vectors.resize(inputs);
    left_ = inputs;
  }

  void Cancel() override {
    if (cancelled_.exchange(true)) return;
    CancelAll();
    Finish(Status::Cancelled("the client disconnected"));
  }

  // All inputs queued at once (so they share steps), or none.
  void Launch(const std::shared_ptr<EmbeddingRun>& self, LlmEngine& engine,
              std::vector<std::vector<int32_t>> prompts) {
    std::vector<GenerationRequest> requests(prompts.size());
    std::vector<EventCallback> callbacks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      requests[i].prompt = std::move(prompts[i]);
      callbacks.push_back([self, i](const GenerationEvent& e) { self->OnEvent(i, e); });
    }
    auto submitted = engine.SubmitAll(std::move(requests), std::move(callbacks));
    if (!submitted.ok()) return Finish(submitted.status());
    for (size_t i = 0; i < submitted->size(); ++i) ids_[i] = (*submitted)[i];
    if (cancelled_.load()) CancelAll();  // Cancelled while they were queued.
  }

 private:
  void CancelAll() {
    const std::shared_ptr<LlmEngine> engine = owner_.lock();
    if (engine == nullptr) return;
    for (const auto& id : ids_) {
      if (const uint64_t request = id.load()) engine->Cancel(request);
    }
  }

  // Exactly one call of done_, whichever comes first.
  void Finish(Result<Embeddings> result) {
    if (finished_.exchange(true)) return;
    done_(std::move(result));
  }

  void OnEvent(size_t index, const GenerationEvent& event) {  // Engine thread.
    if (cancelled_.load()) return;
    if (event.finish == FinishReason::kError) {
      cancelled_ = true;
      CancelAll();
      return Finish(event.error);
    }
    if (event.finish == FinishReason::kNone) return;
    result_.vectors[index] = event.embedding;
    result_.prompt_tokens += event.prompt_tokens;
    if (--left_ == 0) Finish(std::move(result_));
  }

  const std::weak_ptr<LlmEngine> owner_;
  std::vector<std::atomic<uint64_t>> ids_;
  EmbeddingsCallback done_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
  // Engine thread only.
  Embeddings result_;
  size_t left_ = 0;
};

}  // namespace

GenerationService::GenerationService(std::map<std::string, std::shared_ptr<LlmEngine>> models)
    : models_(std::move(models)) {}

GenerationService::~GenerationService() = default;

std::map<std::string, std::shared_ptr<LlmEngine>> GenerationService::models() const {
  MutexLock lock(mu_);
  return models_;
}

std::shared_ptr<LlmEngine> GenerationService::Add(const std::string& name,
                                                  std::shared_ptr<LlmEngine> engine) {
  MutexLock lock(mu_);
  std::shared_ptr<LlmEngine>& slot = models_[name];
  std::shared_ptr<LlmEngine> old = std::move(slot);
  slot = std::move(engine);
  if (kv_events_ != nullptr) {
    // The old engine's last events go out before the topic is cleared for the new one.
    if (old != nullptr) old->SetKvEvents(nullptr, "");
    if (slot != nullptr) slot->SetKvEvents(kv_events_, kv_events_->TopicOf(name));
  }
  return old;
}

std::shared_ptr<LlmEngine> GenerationService::Remove(const std::string& name) {
  MutexLock lock(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return nullptr;
  std::shared_ptr<LlmEngine> engine = std::move(it->second);
  models_.erase(it);
  if (kv_events_ != nullptr && engine != nullptr) {
    engine->SetKvEvents(nullptr, "");
    kv_events_->Publish(
        ClearedKvEventBatch(kv_events_->TopicOf(name), engine->model().kv_block_size()));
  }
  return engine;
}

void GenerationService::SetKvEvents(std::shared_ptr<KvEventPublisher> publisher) {
  MutexLock lock(mu_);
  kv_events_ = std::move(publisher);
  for (const auto& [name, engine] : models_) {
    engine->SetKvEvents(kv_events_, kv_events_ ? kv_events_->TopicOf(name) : "");
  }
}

Result<std::shared_ptr<LlmEngine>> GenerationService::Find(
    std::string& model, std::shared_ptr<const LoraAdapter>* adapter) const {
  Autoloader autoloader;
  {
    MutexLock lock(mu_);
    if (model.empty() && models_.size() == 1) model = models_.begin()->first;
    if (model.empty()) {
      return Status::InvalidArgument(fmt::format(
          "'model' is required: this server serves {} language models", models_.size()));
    }
    auto it = models_.find(model);
    if (it != models_.end()) return it->second;
    if (adapter != nullptr) {
      for (const auto& [name, engine] : models_) {
        if (auto found = engine->FindAdapter(model)) {
          *adapter = std::move(found);
          return engine;
        }
      }
    }
    autoloader = autoloader_;
  }
  if (autoloader) {
    if (std::optional<Status> answer = autoloader(model)) return std::move(*answer);
  }
  return Status::NotFound(fmt::format("The model '{}' does not exist", model));
}

void GenerationService::SetAutoloader(Autoloader autoloader) {
  MutexLock lock(mu_);
  autoloader_ = std::move(autoloader);
}

void GenerationService::SetCatalog(Catalog catalog) {
  MutexLock lock(mu_);
  catalog_ = std::move(catalog);
}

std::vector<std::pair<std::string, std::string>> GenerationService::Unloaded() const {
  Catalog catalog;
  {
    MutexLock lock(mu_);
    catalog = catalog_;
  }
  // Called unlocked: the catalog asks the service which models it serves.
  return catalog ? catalog() : std::vector<std::pair<std::string, std::string>>{};
}

void GenerationService::SetLoadWaiter(LoadWaiter waiter) {
  MutexLock lock(mu_);
  load_waiter_ = std::move(waiter);
}

bool GenerationService::WhenLoaded(const std::string& model, std::function<void()> resume) const {
  LoadWaiter waiter;
  {
    MutexLock lock(mu_);
    waiter = load_waiter_;
  }
  return waiter && waiter(model, std::move(resume));
}

Result<std::string> GenerationService::RenderChat(
    const LlmEngine& engine, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
    const std::map<std::string, TemplateArgument>& arguments) {
  const ChatTemplate* chat_template = engine.chat_template();
  if (chat_template == nullptr) {
    return Status::InvalidArgument("this model has no chat template; use /v1/completions");
  }
  const Tokenizer& tokenizer = engine.tokenizer();
  return chat_template->Render(
      messages, add_generation_prompt,
      {{"bos_token", tokenizer.bos_token()}, {"eos_token", tokenizer.eos_token()}}, arguments);
}

Result<std::string> GenerationService::RenderRequest(const LlmEngine& engine,
                                                     const GenerateRequest& request) {
  std::map<std::string, TemplateArgument> arguments = request.template_arguments;
  const ToolOptions& tools = request.tools;
  const ChatTemplate* chat_template = engine.chat_template();
  const bool tools_in_text = chat_template != nullptr && !chat_template->renders_tools();
  const bool has_history =
      std::any_of(request.messages.begin(), request.messages.end(),
                  [](const ChatMessage& m) { return m.role == "tool" || !m.tool_calls.empty(); });
  if (!tools_in_text || (tools.functions.empty() && !has_history)) {
    if (!tools.functions.empty()) arguments["tools"] = TemplateJson{tools.definitions};
    return RenderChat(engine, request.messages, /*add_generation_prompt=*/true, arguments);
  }
  // Offered (not under "none"), the tools lead the conversation; the history's calls and results
  // are text either way.
  const std::string definitions =
      tools.functions.empty() || tools.choice == ToolOptions::Choice::kNone ? std::string()
                                                                            : tools.definitions;
  auto rendered = RenderChat(engine,
                             ToolsInConversation(request.messages, definitions, tools.parallel,
                                                 ToolPreamblePlace::kSystem),
                             /*add_generation_prompt=*/true, arguments);
  if (rendered.ok()) return rendered;
  // A template that refuses a system role: the first user turn carries them.
  auto in_user = RenderChat(engine,
                            ToolsInConversation(request.messages, definitions, tools.parallel,
                                                ToolPreamblePlace::kFirstUser),
                            /*add_generation_prompt=*/true, arguments);
  return in_user.ok() ? in_user : rendered;
}

Result<PreparedPrompt> GenerationService::PreparePrompt(const LlmEngine& engine,
                                                        const GenerateRequest& request,
                                                        std::string* param) {
  auto refuse = [&](Status status, std::string_view at) {
    *param = std::string(at);
    return status;
  };
  if (engine.config().pooling != Pooling::kNone) {
    return refuse(Status::InvalidArgument("this model is an embedding model: use /v1/embeddings"),
                  "model");
  }
  PreparedPrompt prepared;
  if (auto refusal = CheckTools(engine, request, prepared.tool_format)) {
    return refuse(refusal->status, refusal->param);
  }
  std::string prompt = request.prompt;
  if (request.chat) {
    auto rendered = RenderRequest(engine, request);
    if (!rendered.ok()) {
      return refuse(rendered.status(),
                    request.template_arguments.empty() ? "messages" : "chat_template_kwargs");
    }
    prompt = std::move(*rendered);
  }
  prepared.opens_thinking =
      request.chat && engine.chat_template()->thinks() && PromptOpensThinking(prompt);
  if (!request.prompt_tokens.empty()) {
    const int64_t vocab = engine.model().architecture().vocab_size;
    for (const int64_t id : request.prompt_tokens) {
      if (id < 0 || id >= vocab) {
        return refuse(Status::InvalidArgument(
                          fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab)),
                      "prompt");
      }
      prepared.tokens.push_back(static_cast<int32_t>(id));
    }
  } else {
    prepared.tokens = engine.tokenizer().Encode(prompt, /*add_special_tokens=*/!request.chat);
  }
  prepared.max_tokens = request.max_tokens;
  if (Status length =
          engine.CheckLength(static_cast<int>(prepared.tokens.size()), prepared.max_tokens);
      !length.ok()) {
    return refuse(length, request.chat ? "messages" : "prompt");
  }
  return prepared;
}

std::shared_ptr<Generation> GenerationService::Start(const std::shared_ptr<LlmEngine>& engine,
                                                     GenerateRequest request,
                                                     std::shared_ptr<GenerationObserver> observer) {
  auto run = std::make_shared<Run>(engine, observer, request.n);
  std::string param;
  Result<PreparedPrompt> prepared = PreparePrompt(*engine, request, &param);
  if (!prepared.ok()) {
    observer->OnRejected(prepared.status(), param, 0);
    return run;
  }
  const ToolCallFormat format = prepared->tool_format;
  GenerationRequest generation;
  generation.prompt = std::move(prepared->tokens);
  generation.max_tokens = prepared->max_tokens;
  generation.sampling = request.sampling;
  generation.ignore_eos = request.ignore_eos;
  generation.top_logprobs = request.top_logprobs;
  generation.adapter = request.adapter;

  const ToolOptions::Choice choice = request.tools.choice;
  const bool has_tools = !request.tools.functions.empty();
  const bool parse_calls = has_tools && choice == ToolOptions::Choice::kAuto;
  const bool forced_calls = has_tools && (choice == ToolOptions::Choice::kRequired ||
                                          choice == ToolOptions::Choice::kFunction);
  // Llama 3's <|python_tag|> and Mistral's [TOOL_CALLS] are special tokens: kept in the text
  // for the parser to find; so are harmony's markers, which tell its reasoning from its answer.
  const bool harmony = request.chat && IsHarmonyTemplate(engine->chat_template()->source());
  // A forced call's reply is a JSON array of calls, but harmony's is a harmony message.
  const bool constrained_calls = forced_calls && !harmony;
  const bool skip_special = !harmony && (!parse_calls || format == ToolCallFormat::kHermes);
  const bool thinks = request.chat && engine->chat_template()->thinks() && !harmony;
  const bool opened = prepared->opens_thinking;
  run->choices.reserve(static_cast<size_t>(request.n));
  for (int i = 0; i < request.n; ++i) {
    ChoiceText& text = run->choices.emplace_back(engine->tokenizer(), skip_special, request.stop);
    // Each choice's reasoning apart from its answer, inside the block the prompt may have opened.
    if (harmony) text.harmony.emplace(parse_calls || forced_calls);
    if (thinks) text.reasoning.emplace(opened);
    if (parse_calls && !harmony) text.tool_parser.emplace(format);
    text.constrained_calls = constrained_calls;
    if (has_tools && !request.tools.parallel) text.max_calls = 1;
    if (has_tools) text.id_format = ToolCallFormatOf(engine->chat_template()->source());
  }

  std::string schema, tag;
  if (harmony) {
    Result<std::string> harmony_tag = HarmonyTag(*engine, request, forced_calls, parse_calls);
    if (!harmony_tag.ok()) {
      observer->OnRejected(harmony_tag.status(),
                           request.response_format.type != ResponseFormat::Type::kText
                               ? "response_format"
                           : forced_calls ? "tool_choice"
                                          : "tools",
                           0);
      return run;
    }
    tag = std::move(*harmony_tag);
    if (tag.empty()) {
      run->Launch(run, generation);
      return run;
    }
  } else if (constrained_calls) {
    schema = ToolCallSchema(request.tools);
  } else if (parse_calls && AnyStrict(request.tools)) {
    tag = StrictCallsTag(request.tools, format, engine->chat_template()->source());
  } else if (request.response_format.type == ResponseFormat::Type::kText) {
    run->Launch(run, generation);
    return run;
  }
  if (thinks && tag.empty()) {
    // The JSON follows the reasoning, not the thinking block's text.
    tag = AfterReasoningTag(!schema.empty() ? schema
                            : request.response_format.type == ResponseFormat::Type::kJsonObject
                                ? std::string(R"({"type":"object"})")
                                : request.response_format.schema,
                            opened);
  }
  // A schema's first compilation takes milliseconds to seconds: off the caller's thread. Later
  // requests with the same schema find it cached.
  // Holds the engine (on the compiler's thread, not the engine's) until the choices are queued.
  // What a schema that cannot compile is refused as: the response format, or the tools.
  const char* grammar_param =
      request.response_format.type != ResponseFormat::Type::kText ? "response_format" : "tools";
  auto compile = [run, engine, generation = std::move(generation), schema = std::move(schema),
                  tag = std::move(tag), format = std::move(request.response_format),
                  grammar_param]() mutable {
    if (run->cancelled()) return run->Launch(run, generation);  // Tells of the cancel.
    Result<std::shared_ptr<const Grammar>> grammar =
        !tag.empty()      ? engine->grammars().StructuralTag(tag)
        : !schema.empty() ? engine->grammars().CompactJsonSchema(schema)
        : format.type == ResponseFormat::Type::kJsonObject
            ? engine->grammars().JsonObject()
            : engine->grammars().JsonSchema(format.schema);
    if (!grammar.ok()) return run->observer().OnRejected(grammar.status(), grammar_param, 0);
    generation.grammar = std::move(*grammar);
    run->Launch(run, generation);
  };
  if (!grammar_pool_.TrySubmit(std::move(compile))) {
    observer->OnRejected(
        Status::Unavailable("too many response formats are waiting to be compiled; retry later"),
        "", 1);
  }
  return run;
}

}  // namespace sluice::llm

namespace sluice::llm {

std::shared_ptr<Generation> GenerationService::Embed(const std::shared_ptr<LlmEngine>& engine,
                                                     const std::vector<EmbeddingInput>& inputs,
                                                     EmbeddingsCallback done) {
  auto run = std::make_shared<EmbeddingRun>(engine, inputs.size(), done);
  if (engine->config().pooling == Pooling::kNone) {
    done(
        Status::InvalidArgument("this model generates text and gives no embeddings; name an "
                                "embedding model (config.yaml's llm.embedding)"));
    return run;
  }
  if (inputs.empty()) {
    done(Status::InvalidArgument("'input' must not be empty"));
    return run;
  }
  const int64_t vocab = engine->model().architecture().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const EmbeddingInput& input = inputs[i];
    std::vector<int32_t> prompt;
    if (input.is_tokens) {
      for (const int64_t id : input.tokens) {
        if (id < 0 || id >= vocab) {
          done(Status::InvalidArgument(fmt::format(
              "input {}: token id {} is outside the vocabulary [0, {})", i, id, vocab)));
          return run;
        }
        prompt.push_back(static_cast<int32_t>(id));
      }
    } else {
      prompt = engine->tokenizer().Encode(input.text, /*add_special_tokens=*/true);
    }
    int max_tokens = 1;
    if (Status length = engine->CheckLength(static_cast<int>(prompt.size()), max_tokens);
        !length.ok()) {
      done(Status::InvalidArgument(fmt::format("input {}: {}", i, length.message())));
      return run;
    }
    prompts.push_back(std::move(prompt));
  }
  run->Launch(run, *engine, std::move(prompts));
  return run;
}

}  // namespace sluice::llm
