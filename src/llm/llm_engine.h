// The generation loop: requests wait for a KV-cache slot, then every step runs all decoding slots
// as one batch plus prompt chunks within a token budget (iteration-level, "continuous" batching).
// What a step runs is the Scheduler's (scheduler.h); this loop runs it on the model, samples and
// delivers each token as an event. It deals in tokens only: text, stop strings, reasoning and
// tool calls are the generation service's (generation_service.h). A new request joins at the
// next step; a slot is freed on EOS, max_tokens, Cancel() (a client that disconnected), EndEarly()
// (the caller has what it needs: a stop string), or an error. No torch here: the model is a
// StepModel.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "llm/grammar.h"
#include "llm/kv_disk_store.h"
#include "llm/kv_events.h"
#include "llm/lora.h"
#include "llm/sampler.h"
#include "llm/scheduler.h"
#include "llm/step_model.h"
#include "llm/text/chat_template.h"
#include "llm/text/tokenizer.h"

namespace sluice::llm {

// kStop: an end-of-sequence token (or, from the generation service, a stop string); kToolCalls:
// the generation service's, for a reply that called tools.
enum class FinishReason { kNone, kStop, kLength, kError, kToolCalls };
// "stop", "length", "error", "tool_calls".
std::string_view FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 0;  // >= 1; the caller applies defaults and context checks (CheckLength()).
  SamplingParams sampling;
  bool ignore_eos = false;  // Benchmarks: generate max_tokens whatever the model says.
  // -1: no log-probabilities. 0-20: each generated token's, and this many most likely tokens'.
  int top_logprobs = -1;
  // With a grammar (from grammars()), every token is sampled among those the grammar allows, and
  // the sequence can end only on an end-of-sequence token once the document is complete.
  std::shared_ptr<const Grammar> grammar;
  // The id (from Submit) of a request with the same prompt, e.g. another of `n` choices: this one
  // starts once that one's prompt is cached, and shares its blocks.
  uint64_t shares_prompt_of = 0;
  // A LoRA adapter (from FindAdapter()) applied to this request's products; null: the base.
  std::shared_ptr<const LoraAdapter> adapter;
};

// One update on a request, delivered in order on the engine's thread; must not block.
struct GenerationEvent {
  // The token generated: with kStop, the end-of-sequence token; -1 on an error event.
  int32_t token = -1;
  int completion_tokens = 0;  // Generated so far.
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // Of those, found in the prefix cache (OpenAI's cached_tokens).
  FinishReason finish = FinishReason::kNone;  // Set on the last event of the request.
  Status error;                               // With kError.
  // With top_logprobs >= 0: the token's and the most likely alternatives'.
  std::optional<TokenLogprobs> logprobs;
  // An embedding model's (config().pooling set): on the final event, the prompt's pooled (and,
  // with normalize, unit-length) hidden state; its one token is a placeholder.
  std::vector<float> embedding;
};
using EventCallback = std::function<void(const GenerationEvent&)>;

struct LlmStats {
  int slots = 0;
  int slots_busy = 0;
  int waiting = 0;
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  int64_t draft_tokens = 0;           // Prompt-lookup drafts proposed.
  int64_t accepted_draft_tokens = 0;  // Of those, verified and kept.
  int64_t prefix_cache_queries = 0;   // Prompt tokens of requests given a slot.
  int64_t prefix_cache_hits = 0;      // Of those, found in cached blocks (not run).
  int kv_blocks = 0;                  // Blocks of the paged KV cache ...
  int kv_blocks_used = 0;             // ... and those running sequences hold.
  int max_loras = 0;
  // Adapters of requests holding a slot, and of requests waiting for one (names, each once).
  std::vector<std::string> running_adapters, waiting_adapters;
  HistogramSnapshot time_to_first_token;  // Seconds, submit to first generated token.
  HistogramSnapshot inter_token;          // Seconds between a sequence's tokens.
};

// Thread-safe. Submit() and Cancel() from any thread; one loop thread runs the model.
class LlmEngine {
 public:
  LlmEngine(std::unique_ptr<StepModel> model, std::unique_ptr<Tokenizer> tokenizer,
            std::unique_ptr<ChatTemplate> chat_template, LlmServeConfig config,
            Clock& clock = Clock::Real());
  ~LlmEngine();  // Stop().
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // kInvalidArgument when prompt + max_tokens cannot fit the context (naming both lengths).
  // Fills a missing max_tokens (0) with the default, capped by the room left.
  Status CheckLength(int prompt_tokens, int& max_tokens) const;

  // Queues `request`. On OK, `on_event` receives every update and exactly one final event;
  // returns an id for Cancel(). kUnavailable when max_waiting requests already wait. On an
  // embedding model a request runs its prompt only (max_tokens, sampling and grammar unused) and
  // its one event carries the embedding; its prompts are batched into steps as any others.
  Result<uint64_t> Submit(GenerationRequest request, EventCallback on_event);
  // Queues `requests` (callbacks[i] for requests[i]) together, so they join the same step, or
  // none of them: the first error is returned.
  Result<std::vector<uint64_t>> SubmitAll(std::vector<GenerationRequest> requests,
                                          std::vector<EventCallback> callbacks);

  // Drops the request wherever it is: its slot is freed before the next step, and no event
  // follows but those of a step already under way.
  void Cancel(uint64_t id);
  // As Cancel(), for a request its caller ends because it has what it needs (a stop string in
  // its text): counted as finished. Safe from within the request's own callback.
  void EndEarly(uint64_t id);

  // Finishes every accepted request (they run to completion), then stops the loop.
  void Stop();

  LlmStats stats() const;

  // LoRA adapters (lora.h), config().max_loras at most, which requests name by their own name.
  // kInvalidArgument naming what is wrong (the adapter, a name in use, the table full, a model
  // that takes none).
  Status LoadAdapter(const std::string& name, const std::string& dir);
  // kNotFound for an unknown name. Requests under way finish with it; new ones cannot name it.
  Status UnloadAdapter(const std::string& name);
  std::shared_ptr<const LoraAdapter> FindAdapter(const std::string& name) const;
  std::vector<std::string> AdapterNames() const;
  // Publishes the events of this engine's prefix cache (kv_events.h) to `publisher` under
  // `topic` from now on, first an AllBlocksCleared (a router forgets what the topic held before:
  // another process's, or a reloaded model's, blocks); null: publishes no more.
  void SetKvEvents(std::shared_ptr<KvEventPublisher> publisher, std::string topic);
  // The prefix cache's disk tier (kv_disk_store.h): prompt blocks found there are loaded instead
  // of computed, and every block published is written there. Null: off.
  void SetKvDisk(std::shared_ptr<KvDiskStore> store);

  // Seconds a new request would wait for a slot, from the current load (for Retry-After).
  double EstimatedWaitSeconds() const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The tokenizer, for what outlives the engine (a reply's events rendered after it unloads).
  std::shared_ptr<const Tokenizer> shared_tokenizer() const { return tokenizer_; }
  const ChatTemplate* chat_template() const { return chat_template_.get(); }
  const StepModel& model() const { return *model_; }
  const LlmServeConfig& config() const { return config_; }
  // A request's keep_alive (Ollama's): how long this engine's model stays loaded once idle, over
  // its config's and the server's; nullopt until a request gives one.
  void SetKeepAlive(std::chrono::milliseconds keep_alive) {
    keep_alive_ms_.store(keep_alive.count(), std::memory_order_relaxed);
  }
  std::optional<std::chrono::milliseconds> keep_alive() const {
    const int64_t ms = keep_alive_ms_.load(std::memory_order_relaxed);
    if (ms == kNoKeepAlive) return std::nullopt;
    return std::chrono::milliseconds(ms);
  }
  // Compiles response formats against this model's vocabulary (thread-safe, cached).
  GrammarCompiler& grammars() const { return *grammars_; }

 private:
  struct Sequence;
  // A checked request as the loop keeps it (not yet queued).
  Result<std::unique_ptr<Sequence>> Prepare(GenerationRequest request, EventCallback on_event);
  void Loop();
  // Runs `plan` on the model and samples from its logits: tokens per chunk, for Update().
  Status RunStep(const StepPlan& plan, std::vector<std::vector<int32_t>>* tokens);
  // An embedding model's step: pools its rows into each sequence's embedding; a placeholder
  // token for each prompt that is done.
  void PoolStep(const StepPlan& plan, std::vector<std::vector<int32_t>>* tokens);
  // Turns `update`'s token into `seq`'s next event (finish set when it is done).
  GenerationEvent Advance(Sequence& seq, const TokenUpdate& update, Clock::time_point now);
  void PublishCounts();  // The scheduler's counts, for stats() and admission.
  // Sends the KV events the last step recorded, where they are published.
  void PublishKvEvents();
  // Queues the blocks the last step published for the disk tier, where there is one.
  void WriteThrough();
  // Sets each chunk's LoRA adapter and orders the chunks by adapter (a step's order is free).
  void GroupByAdapter(StepPlan& plan) const;
  // Sets how the model picks each chunk's tokens where it picks them itself
  // (StepModel::picks_tokens): greedy or sampled, with their penalties, grammar's mask and
  // log-probabilities (sampled: its draw from the sequence's generator; anything but plain
  // greedy, one row), greedy for prompt chunks whose logits are not sampled; the rest (drafts
  // that are not plain greedy) on the host.
  void MarkPicks(StepPlan& plan);

  // Destroyed last: gives back to the system what the engine and its threads freed (glibc keeps
  // free pages inside its arenas resident; a model reloaded under traffic left its predecessors'
  // step buffers there, megabytes a reload).
  struct TrimOnDestruction {
    ~TrimOnDestruction();
  } trim_;
  std::unique_ptr<StepModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  const LlmServeConfig config_;
  Clock& clock_;

  mutable Mutex mu_;
  CondVar wake_;
  std::deque<std::unique_ptr<Sequence>> incoming_ GUARDED_BY(mu_);  // Not yet scheduled.
  // Requests to drop before the next step, and whether each counts as finished (EndEarly).
  std::vector<std::pair<uint64_t, bool>> cancelled_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  int busy_slots_ GUARDED_BY(mu_) = 0;          // The scheduler's running().
  int scheduled_waiting_ GUARDED_BY(mu_) = 0;   // The scheduler's waiting().
  double step_seconds_ GUARDED_BY(mu_) = 0.05;  // Smoothed duration of a decode step.
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapters_ GUARDED_BY(mu_);
  std::vector<std::string> running_adapters_ GUARDED_BY(mu_), waiting_adapters_ GUARDED_BY(mu_);
  std::shared_ptr<KvEventPublisher> kv_events_ GUARDED_BY(mu_);
  std::string kv_topic_ GUARDED_BY(mu_);
  std::shared_ptr<KvDiskStore> kv_disk_ GUARDED_BY(mu_);

  // Loop thread only.
  Scheduler scheduler_;
  // Any thread (it is thread-safe); after scheduler_, whose end-of-sequence tokens end documents.
  const std::unique_ptr<GrammarCompiler> grammars_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences_;  // Scheduled ones.
  std::shared_ptr<KvDiskStore> disk_in_use_;  // kv_disk_ as the loop last took it.
  std::vector<float> logits_;
  std::vector<int32_t> picked_;                 // Tokens the model picked itself (RunPicking),
  std::vector<TokenLogprobs> picked_logprobs_;  // and their log-probabilities where asked.
  std::vector<float> raw_row_;  // A row of logits before sampling, for log-probabilities.

  static constexpr int64_t kNoKeepAlive = INT64_MIN;
  std::atomic<int64_t> keep_alive_ms_{kNoKeepAlive};
  std::atomic<int64_t> finished_{0}, prompt_tokens_{0}, generated_tokens_{0}, steps_{0};
  std::atomic<int64_t> draft_tokens_{0}, accepted_draft_tokens_{0};
  std::atomic<int64_t> prefix_queries_{0}, prefix_hits_{0};
  std::atomic<int> kv_blocks_used_{0};
  Histogram ttft_;
  Histogram inter_token_;
  std::thread loop_;
};

}  // namespace sluice::llm
