// Decides what each generation step runs, and applies what it produced, without threads, clocks
// or a model (vLLM v1's split): Schedule() admits the oldest waiting requests while a slot (a
// place among the sequences run together) and blocks of the paged KV cache for their prompt and
// max_tokens are free, each taking the cached blocks of its prompt's longest cached prefix
// (block_pool.h), which it then skips, and returns the step's plan (every decoding sequence, plus
// prompt chunks within the token budget, plus prompt-lookup drafts); Update() takes the tokens
// sampled from the step's logits and advances, finishes (EOS, max_tokens, the context) and frees
// sequences. The engine (llm_engine.cc) runs plans on the model and keeps text, stop strings and
// events outside.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llm/block_pool.h"
#include "llm/kv_disk_store.h"
#include "llm/step_model.h"

namespace sluice::llm {

struct SchedulerOptions {
  int slots = 8;              // Sequences run together, at most; >= 1.
  int context_length = 2048;  // Tokens a sequence holds, prompt + generated.
  int block_size = 16;        // Tokens per block of the KV cache.
  int blocks = 0;             // Blocks in the pool; 0: slots x ceil(context / block_size).
  // Prompt tokens per step beside decoding sequences (vLLM's chunked prefill): a newcomer's
  // prompt is spread over steps, so the decoding streams' inter-token latency stays bounded.
  int max_step_tokens = 32;
  // Prompt tokens per step while no sequence decodes: nobody waits on the step, so chunks may be
  // larger (larger products, fewer steps, sooner first tokens).
  int prefill_chunk = 512;
  // Prompt-lookup speculative decoding: up to this many draft tokens per decoding sequence and
  // step, copied from where the latest n-gram last occurred in its prompt or output; 0: off.
  int speculative_tokens = 0;
  int speculative_ngram = 3;  // The longest n-gram matched (then shorter ones, down to 2).
  std::vector<int32_t> eos_ids;
  // Full blocks are published as they fill and stay cached after their sequence ends; a newcomer
  // takes those holding the longest prefix of its prompt (short of its last token, which must run
  // for logits) and runs only the rest.
  bool prefix_caching = true;
  // An embedding model's steps: every prompt token's row (its hidden state) is wanted, so every
  // prompt chunk yields all its rows.
  bool all_prompt_rows = false;
  // An encoder's steps: a prompt runs whole in one chunk (its attention sees every token), never
  // split; one larger than the step's budget runs alone.
  bool whole_prompts = false;
};

struct ScheduledRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;  // Non-empty, shorter than the context.
  int max_tokens = 1;           // >= 1.
  bool ignore_eos = false;
  // Another request with the same prompt (`n` choices): with prefix caching, this one is admitted
  // once that one's prompt is in the cache, and shares its full blocks instead of computing them.
  uint64_t shares_prompt_of = 0;
  // Nonzero where the same tokens give other keys and values (a LoRA adapter): cached blocks are
  // shared only among requests with the same salt.
  uint64_t cache_salt = 0;
  uint64_t adapter = 0;  // Its LoRA adapter's id (0: none), for the KV events of its blocks.
};

// What one step runs: chunks[i] belongs to sequence ids[i].
struct StepPlan {
  std::vector<SequenceChunk> chunks;
  std::vector<uint64_t> ids;
  // Logit rows chunk i yields (1; with drafts, 1 + drafts) and whether tokens are sampled from
  // them (false for a prompt chunk that is not the prompt's last).
  std::vector<int> rows;
  std::vector<bool> samples;
  // Blocks to copy (every layer's rows, first to second) before the chunks run: a newcomer's
  // cached prefix copied into a consecutive run of its own.
  std::vector<std::pair<int32_t, int32_t>> copies;
  // Blocks to set from the disk tier's bytes before the copies and the chunks run: a newcomer's
  // prefix found on disk past what memory held.
  std::vector<std::pair<int32_t, std::shared_ptr<const std::string>>> loads;
  int decoding = 0;       // Chunks of decoding sequences (they come first).
  int prompt_tokens = 0;  // Prompt work in this step.
  bool empty() const { return chunks.empty() && copies.empty() && loads.empty(); }
};

// One token appended to a sequence by Update(), in order.
struct TokenUpdate {
  uint64_t id = 0;
  int32_t token = -1;
  int generated = 0;        // The sequence's generated tokens, this one included.
  bool eos = false;         // An end-of-sequence token (not ignored): the sequence is done.
  bool length = false;      // max_tokens or the context reached: the sequence is done.
  int drafts_accepted = 0;  // With the first update of a verified chunk: its drafts taken.
  int cached_prompt_tokens = 0;  // Of its prompt, tokens the prefix cache held (not run).
};

// Thread-compatible: the engine's loop thread alone calls it.
class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request behind the others (the caller checked its lengths).
  void Add(ScheduledRequest request);
  // Drops a waiting or running sequence; its slot is free for the next Schedule(). False when
  // `id` is unknown (already finished).
  bool Remove(uint64_t id);

  // The next step. Sequences in it must not be Add()ed or Remove()d until Update(); an empty
  // plan means nothing to run.
  StepPlan Schedule();
  // Applies the step's results: tokens[i] are those sampled from chunk i's rows in order, the
  // first that differs from its draft included and none after it (empty when !samples[i]).
  // Sequences that finish are freed. Returns every appended token, in chunk order.
  std::vector<TokenUpdate> Update(const StepPlan& plan,
                                  const std::vector<std::vector<int32_t>>& tokens);

  int running() const;               // Sequences admitted (holding a slot and their blocks).
  bool admitted(uint64_t id) const;  // Whether request `id` holds a slot.
  int waiting() const;               // Sequences waiting for them.
  int kv_blocks() const { return pool_.blocks(); }
  int kv_blocks_used() const { return pool_.held(); }  // Held by running sequences.
  // Prompt tokens of the sequences admitted so far, and of those the ones found cached.
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }
  const SchedulerOptions& options() const { return options_; }
  // The prefix cache's disk tier: a newcomer's prompt blocks past those cached in memory are
  // looked up with `lookup` (by hash; its parent and tokens are checked) and loaded instead of
  // computed; blocks published are kept for TakeStoredBlocks(), to be written there. Null: off.
  // Sequences of a LoRA adapter do not look up (their salt holds for this process only).
  using DiskLookup = std::function<std::optional<DiskBlock>(uint64_t hash)>;
  void SetDiskTier(DiskLookup lookup) {
    disk_lookup_ = std::move(lookup);
    pool_.RecordStored(disk_lookup_ != nullptr);
  }
  std::vector<StoredBlock> TakeStoredBlocks() { return pool_.TakeStored(); }
  // KV events (block_pool.h): recorded from now on, or not; those since the last call.
  void RecordKvEvents(bool on) { pool_.RecordEvents(on); }
  std::vector<KvEvent> TakeKvEvents() { return pool_.TakeEvents(); }

  // Draft tokens for a sequence `tokens` (its prompt and output so far): what followed the most
  // recent earlier occurrence of its last n tokens, n from `ngram` down to 2 (to 1 only when
  // `ngram` is 1: one token's match is right too rarely to pay for its verification, measured
  // in benchmarks/llm_speculative.py); at most `max_drafts`.
  static std::vector<int32_t> PromptLookup(const std::vector<int32_t>& tokens, int ngram,
                                           int max_drafts);

 private:
  struct Sequence;
  // Frees `slot` and its sequence's blocks (the published ones stay cached).
  void Finish(size_t slot);
  // Publishes the sequence's blocks that filled.
  void Publish(Sequence& seq);
  // Whether `seq` waits for another request's prompt to be cached (shares_prompt_of).
  bool AwaitsSharedPrompt(const Sequence& seq) const;

  SchedulerOptions options_;
  BlockPool pool_;
  DiskLookup disk_lookup_;
  std::vector<std::unique_ptr<Sequence>> waiting_;  // Oldest first.
  std::vector<std::unique_ptr<Sequence>> slots_;    // Indexed by slot; null when free.
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace sluice::llm
