// Generation as every front asks for it (the OpenAI routes; any later front): a prompt, or a
// conversation through the model's chat template, in; for each of n choices, text, reasoning and
// tool-call events out. The engine (llm_engine.h) deals in tokens only; this turns them into text
// (whole UTF-8 characters), ends a choice at a stop string (text/stop_strings.h), tells reasoning
// from the answer (text/reasoning.h) and finds tool calls (text/tool_calls.h). Response formats
// and constrained tool calls compile to grammars off the caller's thread. No JSON of a protocol
// here: fronts parse requests into GenerateRequest and write ChoiceEvents in their own shape.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/thread_pool.h"
#include "llm/llm_engine.h"
#include "llm/text/tool_calls.h"

namespace sluice::llm {

// `response_format`: free text, any JSON object (JSON mode), or documents of a JSON schema.
struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  std::string schema;  // kJsonSchema: the schema, as JSON text.
};

// A function the model may call (OpenAI's tools[i].function).
struct ToolFunction {
  std::string name;
  std::string parameters;  // Its arguments' JSON Schema, as JSON text ("": takes none).
  bool strict = false;
};

struct ToolOptions {
  enum class Choice {
    kAuto,      // The model decides; calls are found in its text in the template's format.
    kNone,      // No calls: the reply is text.
    kRequired,  // At least one call: the reply is constrained to a JSON array of calls.
    kFunction,  // A call of `function`, constrained alike.
  };
  std::vector<ToolFunction> functions;  // Empty: no tools.
  std::string definitions;              // The request's tools, as JSON text, for the template.
  Choice choice = Choice::kAuto;
  std::string function;  // kFunction.
  bool parallel = true;  // More than one call in a reply.
};

struct GenerateRequest {
  bool chat = false;
  std::vector<ChatMessage> messages;                           // Chat.
  std::map<std::string, TemplateArgument> template_arguments;  // Chat.
  std::string prompt;                                          // Completions ...
  std::vector<int64_t> prompt_tokens;  // ... or its token ids, where given as ids (not empty).
  int n = 1;                           // Choices, each sampled from the prompt on its own.
  int max_tokens = 0;                  // 0: the model's default.
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int top_logprobs = -1;  // -1: none; else alternatives per token (0-20).
  ResponseFormat response_format;
  ToolOptions tools;
  std::shared_ptr<const LoraAdapter> adapter;  // The LoRA adapter `model` named (Find()).
};

// A request's prompt as the engine runs it (GenerationService::PreparePrompt).
struct PreparedPrompt {
  std::vector<int32_t> tokens;
  int max_tokens = 0;  // The request's, or the model's default where it gave none.
  ToolCallFormat tool_format = ToolCallFormat::kUnknown;  // How the model writes its tool calls.
  bool opens_thinking = false;  // The rendered prompt ends inside a thinking block.
};

// An update on one choice. A choice's events come in order and its last has `finish` set.
struct ChoiceEvent {
  size_t index = 0;
  std::string content;
  std::string reasoning;                // Thinking templates: text inside the thinking block.
  std::vector<ToolCall> tool_calls;     // Calls completed with this event, each whole ...
  int first_tool_call = 0;              // ... numbered from this index within the choice.
  std::vector<TokenLogprobs> logprobs;  // Of the tokens this event covers.
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // Of those, found in the prefix cache.
  int completion_tokens = 0;     // Generated so far.
  FinishReason finish = FinishReason::kNone;
  std::string stop_string;  // The stop string that ended the choice (Anthropic's stop_sequence).
};

// What a front is told of a generation. Exactly one of OnRejected and OnAccepted is called (from
// Start's thread or the grammar compiler's); OnChoice and OnFailed come from the engine's loop
// thread and may come before OnAccepted (the first choices run while later ones are queued).
// After OnRejected, OnFailed or Cancel(), nothing more is delivered but calls under way. The
// generation holds its observer until its last event: an observer keeps the Generation only
// weakly, or neither is ever freed.
class GenerationObserver {
 public:
  virtual ~GenerationObserver() = default;
  // Nothing ran: a bad request (the parameter at fault in `param`), a full queue
  // (kUnavailable, with the wait a retry should leave), or Cancel() before every choice queued.
  virtual void OnRejected(const Status& status, std::string_view param,
                          double retry_after_seconds) = 0;
  virtual void OnAccepted() = 0;  // Every choice is queued.
  virtual void OnChoice(const ChoiceEvent& event) = 0;
  virtual void OnFailed(const Status& error) = 0;  // The model failed: every choice ends.
};

// A generation under way. Thread-safe.
class Generation {
 public:
  virtual ~Generation() = default;
  // Drops every choice (a client that left). No event follows but those under way.
  virtual void Cancel() = 0;
};

// One input of an embeddings request: text (tokenized as the model's tokenizer does, with its
// special tokens) or token ids.
struct EmbeddingInput {
  std::string text;
  std::vector<int64_t> tokens;
  bool is_tokens = false;
};

struct Embeddings {
  std::vector<std::vector<float>> vectors;  // One per input, in order.
  int prompt_tokens = 0;                    // Over all inputs.
};
// Called exactly once: the embeddings, or why there are none (kInvalidArgument naming the input
// at fault; kUnavailable for a full queue; kCancelled).
using EmbeddingsCallback = std::function<void(Result<Embeddings>)>;

// Thread-safe. Models come and go at run time (the repository API): a request holds its engine,
// so one removed finishes what it accepted.
class GenerationService {
 public:
  explicit GenerationService(std::map<std::string, std::shared_ptr<LlmEngine>> models);
  ~GenerationService();

  std::map<std::string, std::shared_ptr<LlmEngine>> models() const;
  // Serves `engine` as `name`; returns the engine it replaces (null if none).
  std::shared_ptr<LlmEngine> Add(const std::string& name, std::shared_ptr<LlmEngine> engine);
  // Stops serving `name`; returns its engine (null if none), for the caller to stop.
  std::shared_ptr<LlmEngine> Remove(const std::string& name);
  // The engine serving `model`; an empty name is the only model where there is one (and is set
  // to its name). A LoRA adapter's name gives its base model's engine, and the adapter in
  // `adapter` (where given; else kNotFound). kNotFound naming an unknown model;
  // kInvalidArgument for no name among several.
  Result<std::shared_ptr<LlmEngine>> Find(
      std::string& model, std::shared_ptr<const LoraAdapter>* adapter = nullptr) const;

  // Asked by Find() for a model it does not serve: nullopt where the name is no model it could
  // load (Find's kNotFound stands), else the answer (kUnavailable with a retry-after while the
  // model loads, or why it could not load). Set once, before requests come.
  using Autoloader = std::function<std::optional<Status>(const std::string& model)>;
  void SetAutoloader(Autoloader autoloader);
  // The language models it could load on demand and does not serve, each with its state
  // ("loading", "unloaded", or "error": its last load failed), for listings. Set once, with the
  // autoloader.
  using Catalog = std::function<std::vector<std::pair<std::string, std::string>>()>;
  void SetCatalog(Catalog catalog);
  // The catalog's entries (none where no catalog is set).
  std::vector<std::pair<std::string, std::string>> Unloaded() const;
  // Asked for a request whose model Find() answered kUnavailable: true where `model` is loading
  // and the request may wait for it, `resume` then run once (from another thread) when the load
  // has run or the wait has passed; false where it is answered now. Set once, with the
  // autoloader.
  using LoadWaiter = std::function<bool(const std::string& model, std::function<void()> resume)>;
  void SetLoadWaiter(LoadWaiter waiter);
  bool WhenLoaded(const std::string& model, std::function<void()> resume) const;
  // Publishes every served model's KV events (kv_events.h) from now on, each under its topic: the
  // models served now and those added later; a model removed or replaced publishes no more, and
  // its topic an AllBlocksCleared. Set once, at start.
  void SetKvEvents(std::shared_ptr<KvEventPublisher> publisher);

  // The conversation through the model's chat template (kInvalidArgument where it has none).
  static Result<std::string> RenderChat(
      const LlmEngine& engine, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
      const std::map<std::string, TemplateArgument>& arguments = {});

  // A chat request's prompt: its conversation and tools through the model's template. A template
  // that renders no tools is given them, and the history's calls and results, in the
  // conversation's text (ToolsInConversation).
  static Result<std::string> RenderRequest(const LlmEngine& engine, const GenerateRequest& request);

  // What Start runs of `request`: the model checked to generate and to take its tools, a chat
  // rendered through the template, the prompt tokenized (or its ids checked against the
  // vocabulary), max_tokens checked against the context. On failure `param` names the request's
  // parameter at fault.
  static Result<PreparedPrompt> PreparePrompt(const LlmEngine& engine,
                                              const GenerateRequest& request, std::string* param);

  // Starts `request` on `engine` (from Find). With a seed, choice i samples with seed + i, so the
  // choices differ and the same seed gives the same n texts.
  std::shared_ptr<Generation> Start(const std::shared_ptr<LlmEngine>& engine,
                                    GenerateRequest request,
                                    std::shared_ptr<GenerationObserver> observer);

  // Embeds `inputs` on `engine`, an embedding model (LlmServeConfig::pooling), each input a
  // request of its own, batched with the others into the engine's steps (all queued or none).
  std::shared_ptr<Generation> Embed(const std::shared_ptr<LlmEngine>& engine,
                                    const std::vector<EmbeddingInput>& inputs,
                                    EmbeddingsCallback done);

 private:
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<LlmEngine>> models_ GUARDED_BY(mu_);
  std::shared_ptr<KvEventPublisher> kv_events_ GUARDED_BY(mu_);
  Autoloader autoloader_ GUARDED_BY(mu_);
  Catalog catalog_ GUARDED_BY(mu_);
  LoadWaiter load_waiter_ GUARDED_BY(mu_);
  // Compiles response formats' grammars (last: its thread stops first, before the models go).
  ThreadPool grammar_pool_{1, 64};
};

}  // namespace sluice::llm
