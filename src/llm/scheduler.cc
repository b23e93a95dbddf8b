#include "llm/scheduler.h"

#include <algorithm>
#include <utility>

namespace sluice::llm {

struct Scheduler::Sequence {
  ScheduledRequest request;
  // The prompt and the tokens generated so far. Once decoding, the last one is not in the cache
  // yet: it is the next step's input, at position tokens.size() - 1.
  std::vector<int32_t> tokens;
  int slot = -1;
  int prefilled = 0;   // Prompt tokens in the cache.
  int prefix_hit = 0;  // Of the prompt, tokens found in cached blocks at admission (not run).
  int generated = 0;
  std::vector<int32_t> blocks;  // Its block table, for prompt + max_tokens.
  std::vector<int32_t> copied;  // Cached blocks its first step copies into its own (then let go).
  uint64_t parent = BlockPool::kRootHash;  // The hash of its last published block.
  int published = 0;                       // Its leading blocks published.
  bool decoding() const { return generated > 0; }
  int prompt_size() const { return static_cast<int>(request.prompt.size()); }
  // Tokens whose keys and values the cache holds.
  int cached() const { return decoding() ? static_cast<int>(tokens.size()) - 1 : prefilled; }
};

namespace {

int PoolBlocks(const SchedulerOptions& o) {
  if (o.blocks > 0) return o.blocks;
  return o.slots * ((o.context_length + o.block_size - 1) / o.block_size);
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options)
    : options_(std::move(options)),
      pool_(PoolBlocks(options_), options_.block_size),
      slots_(static_cast<size_t>(options_.slots)) {}

Scheduler::~Scheduler() = default;

void Scheduler::Add(ScheduledRequest request) {
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->parent = BlockPool::SaltedRoot(request.cache_salt);
  seq->request = std::move(request);
  waiting_.push_back(std::move(seq));
}

void Scheduler::Finish(size_t slot) {
  pool_.Release(slots_[slot]->copied);
  pool_.Release(slots_[slot]->blocks);
  slots_[slot].reset();
}

void Scheduler::Publish(Sequence& seq) {
  if (!options_.prefix_caching) return;
  const int block = options_.block_size;
  while ((seq.published + 1) * block <= seq.cached()) {
    const size_t b = static_cast<size_t>(seq.published);
    seq.parent = pool_.Publish(seq.blocks[b], seq.parent, seq.tokens.data() + b * block, b == 0,
                               seq.request.adapter);
    ++seq.published;
  }
}

bool Scheduler::AwaitsSharedPrompt(const Sequence& seq) const {
  const uint64_t other = seq.request.shares_prompt_of;
  if (other == 0 || !options_.prefix_caching) return false;
  for (const auto& running : slots_) {
    if (running && running->request.id == other) return !running->decoding();
  }
  return std::any_of(waiting_.begin(), waiting_.end(), [other](const auto& waiting) {
    return waiting != nullptr && waiting->request.id == other;  // (Null: admitted this step.)
  });
}

bool Scheduler::admitted(uint64_t id) const {
  return std::any_of(slots_.begin(), slots_.end(),
                     [id](const auto& seq) { return seq && seq->request.id == id; });
}

bool Scheduler::Remove(uint64_t id) {
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    if (slots_[slot] && slots_[slot]->request.id == id) {
      Finish(slot);
      return true;
    }
  }
  const auto it = std::find_if(waiting_.begin(), waiting_.end(),
                               [id](const auto& seq) { return seq->request.id == id; });
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

int Scheduler::running() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const auto& seq) { return seq != nullptr; }));
}

int Scheduler::waiting() const { return static_cast<int>(waiting_.size()); }

StepPlan Scheduler::Schedule() {
  // Free slots (lowest first) to the oldest waiting requests while blocks for their prompt and
  // max_tokens can be had, the cached blocks of their prompts' prefixes first; the oldest that
  // cannot get them waits, and the rest behind it.
  const int block = options_.block_size;
  StepPlan plan;
  size_t next_waiting = 0;
  std::vector<std::unique_ptr<Sequence>> deferred;  // Choices waiting for their shared prompt.
  for (size_t slot = 0; slot < slots_.size() && next_waiting < waiting_.size(); ++slot) {
    if (slots_[slot]) continue;
    if (AwaitsSharedPrompt(*waiting_[next_waiting])) {
      deferred.push_back(std::move(waiting_[next_waiting++]));
      --slot;  // The slot is still free.
      continue;
    }
    Sequence& seq = *waiting_[next_waiting];
    const std::vector<int32_t>& prompt = seq.request.prompt;
    std::vector<int32_t> blocks;
    if (options_.prefix_caching) {
      blocks = pool_.Match(prompt, (seq.prompt_size() - 1) / block, seq.parent);
    }
    const int matched = static_cast<int>(blocks.size());
    const int tokens =
        std::min(seq.prompt_size() + seq.request.max_tokens, options_.context_length);
    const int need = (tokens + block - 1) / block;
    if (need - matched > pool_.available()) {  // It waits: nothing more is looked up for it.
      pool_.Release(blocks);
      break;
    }
    // The disk tier: the prompt's next blocks (short of its last token), while found there with
    // the same parent and tokens.
    std::vector<DiskBlock> from_disk;
    uint64_t after_memory = seq.parent;
    for (int b = 0; b < matched; ++b) {
      after_memory = pool_.Hash(after_memory, prompt.data() + static_cast<size_t>(b) * block);
    }
    // Not for a LoRA adapter's sequences: an adapter's id, which salts its blocks' hashes, is
    // the process's own, and another adapter may take it after a restart.
    if (options_.prefix_caching && disk_lookup_ && seq.request.adapter == 0) {
      uint64_t parent = after_memory;
      for (int b = matched; b < (seq.prompt_size() - 1) / block; ++b) {
        const int32_t* want = prompt.data() + static_cast<size_t>(b) * block;
        const uint64_t hash = pool_.Hash(parent, want);
        std::optional<DiskBlock> found = disk_lookup_(hash);
        if (!found || found->parent != parent ||
            found->tokens.size() != static_cast<size_t>(block) ||
            !std::equal(found->tokens.begin(), found->tokens.end(), want)) {
          break;
        }
        from_disk.push_back(std::move(*found));
        parent = hash;
      }
    }
    const int loaded = static_cast<int>(from_disk.size());
    // Consecutive blocks are read in place; others are gathered every step. So a newcomer takes
    // a consecutive run where there is one, its cached prefix copied in (once, before its first
    // chunk: far cheaper than computing it, or than gathering it at every step), and else
    // shares the cached blocks where they lie.
    std::vector<int32_t> run;
    if (pool_.AllocateRun(need, &run)) {
      for (int b = 0; b < matched; ++b) plan.copies.emplace_back(blocks[b], run[b]);
      seq.copied = std::move(blocks);
      blocks = std::move(run);
    } else if (!pool_.Allocate(need - matched, &blocks)) {
      pool_.Release(blocks);
      break;
    }
    slots_[slot] = std::move(waiting_[next_waiting++]);
    seq.slot = static_cast<int>(slot);
    seq.blocks = std::move(blocks);
    seq.prefilled = (matched + loaded) * block;
    seq.prefix_hit = seq.prefilled;
    seq.parent = after_memory;
    seq.published = matched;
    // Blocks read from disk are set before the step runs, and published at once: cached in
    // memory from now on, for others too.
    for (int b = matched; b < matched + loaded; ++b) {
      const auto at = static_cast<size_t>(b);
      plan.loads.emplace_back(seq.blocks[at], std::move(from_disk[at - matched].data));
      seq.parent = pool_.Publish(seq.blocks[at], seq.parent, prompt.data() + at * block, b == 0,
                                 seq.request.adapter);
      ++seq.published;
    }
    prefix_queries_ += seq.prompt_size();
    prefix_hits_ += seq.prefilled;
  }
  // Those passed over keep their places, ahead of the ones not reached.
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(next_waiting));
  waiting_.insert(waiting_.begin(), std::make_move_iterator(deferred.begin()),
                  std::make_move_iterator(deferred.end()));

  auto add = [&plan](const Sequence& seq, SequenceChunk chunk, bool samples) {
    plan.rows.push_back(chunk.all_logits ? static_cast<int>(chunk.tokens.size()) : 1);
    plan.chunks.push_back(std::move(chunk));
    plan.ids.push_back(seq.request.id);
    plan.samples.push_back(samples);
  };
  std::vector<Sequence*> prefilling;
  for (auto& seq : slots_) {
    if (!seq) continue;
    if (!seq->decoding()) {
      prefilling.push_back(seq.get());
      continue;
    }
    const int position = static_cast<int>(seq->tokens.size()) - 1;
    SequenceChunk chunk{seq->slot, position, {seq->tokens.back()}, false, seq->blocks};
    chunk.prompt_length = seq->prompt_size();
    // Drafts and the token sampled after them must fit max_tokens and the context.
    const int room = std::min(seq->request.max_tokens - seq->generated - 1,
                              options_.context_length - position - 1);
    const int max_drafts = std::min(options_.speculative_tokens, room);
    if (max_drafts > 0) {
      const std::vector<int32_t> drafts =
          PromptLookup(seq->tokens, options_.speculative_ngram, max_drafts);
      chunk.tokens.insert(chunk.tokens.end(), drafts.begin(), drafts.end());
      chunk.all_logits = !drafts.empty();
    }
    add(*seq, std::move(chunk), true);
    ++plan.decoding;
  }
  // Prompt work, oldest request first, within the step's budget.
  int budget = plan.empty() ? options_.prefill_chunk : options_.max_step_tokens;
  std::sort(prefilling.begin(), prefilling.end(),
            [](const Sequence* a, const Sequence* b) { return a->request.id < b->request.id; });
  for (Sequence* seq : prefilling) {
    if (budget <= 0) break;
    const int left = seq->prompt_size() - seq->prefilled;
    if (options_.whole_prompts && left > budget && plan.prompt_tokens > 0) break;
    const int n = options_.whole_prompts ? left : std::min(budget, left);
    SequenceChunk chunk{seq->slot, seq->prefilled, {}, options_.all_prompt_rows, seq->blocks};
    chunk.prompt_length = seq->prompt_size();
    chunk.tokens.assign(seq->request.prompt.begin() + seq->prefilled,
                        seq->request.prompt.begin() + seq->prefilled + n);
    add(*seq, std::move(chunk), seq->prefilled + n == seq->prompt_size());
    plan.prompt_tokens += n;
    budget -= n;
  }
  return plan;
}

std::vector<TokenUpdate> Scheduler::Update(const StepPlan& plan,
                                           const std::vector<std::vector<int32_t>>& tokens) {
  std::vector<TokenUpdate> updates;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const SequenceChunk& chunk = plan.chunks[i];
    std::unique_ptr<Sequence>& owner = slots_[static_cast<size_t>(chunk.slot)];
    if (!owner || owner->request.id != plan.ids[i]) continue;  // Removed during the step.
    Sequence& seq = *owner;
    pool_.Release(seq.copied);  // The step copied them.
    seq.copied.clear();
    if (!seq.decoding()) seq.prefilled += static_cast<int>(chunk.tokens.size());
    if (!plan.samples[i] || i >= tokens.size()) {
      Publish(seq);
      continue;
    }
    const std::vector<int32_t>& sampled = tokens[i];
    for (size_t j = 0; j < sampled.size(); ++j) {
      seq.tokens.push_back(sampled[j]);
      ++seq.generated;
      TokenUpdate update;
      update.id = seq.request.id;
      update.token = sampled[j];
      update.generated = seq.generated;
      update.cached_prompt_tokens = seq.prefix_hit;
      if (j == 0) update.drafts_accepted = static_cast<int>(sampled.size()) - 1;
      update.eos = !seq.request.ignore_eos &&
                   std::find(options_.eos_ids.begin(), options_.eos_ids.end(), sampled[j]) !=
                       options_.eos_ids.end();
      update.length = seq.generated >= seq.request.max_tokens ||
                      static_cast<int>(seq.tokens.size()) > options_.context_length;
      updates.push_back(update);
      if (update.eos || update.length) break;
    }
    Publish(seq);
    if (!updates.empty() && updates.back().id == seq.request.id &&
        (updates.back().eos || updates.back().length)) {
      Finish(static_cast<size_t>(chunk.slot));
    }
  }
  return updates;
}

std::vector<int32_t> Scheduler::PromptLookup(const std::vector<int32_t>& tokens, int ngram,
                                             int max_drafts) {
  const int size = static_cast<int>(tokens.size());
  if (max_drafts <= 0) return {};
  for (int n = std::min(ngram, size - 1); n >= std::min(2, ngram); --n) {
    const auto suffix = tokens.end() - n;
    // The most recent earlier occurrence: it best predicts what comes next.
    for (int start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, tokens.end(), tokens.begin() + start)) continue;
      const int from = start + n;
      const int count = std::min(max_drafts, size - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace sluice::llm
