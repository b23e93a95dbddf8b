// The step planner with fake steps: the token budget, slot and block assignment, finishing,
// removal, prefix reuse by blocks, prompt-lookup drafts and their verification, and a randomised
// run checked against a model of what each block of the cache holds.
#include "llm/scheduler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace sluice::llm {
namespace {

ScheduledRequest Request(uint64_t id, int prompt_tokens, int max_tokens) {
  ScheduledRequest r;
  r.id = id;
  // Prompts of different requests share no prefix (see PrefixCaching* for those that do).
  for (int i = 0; i < prompt_tokens; ++i) r.prompt.push_back(static_cast<int32_t>(1000 * id) + i);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// A request for `prompt` exactly (prefix-cache tests), 2 tokens, EOS ignored.
ScheduledRequest PromptRequest(uint64_t id, std::vector<int32_t> prompt) {
  ScheduledRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = 2;
  r.ignore_eos = true;
  return r;
}

// Each sampling chunk gives `token` (once; drafts are all rejected).
std::vector<std::vector<int32_t>> Sample(const StepPlan& plan, int32_t token = 7) {
  std::vector<std::vector<int32_t>> tokens(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.samples[i]) tokens[i] = {token};
  }
  return tokens;
}

TEST(SchedulerTest, PromptWorkBesideDecodingStaysWithinTheBudget) {
  SchedulerOptions options;
  options.slots = 4;
  options.max_step_tokens = 64;
  options.prefill_chunk = 256;
  Scheduler scheduler(options);
  scheduler.Add(Request(1, 10, 100));
  scheduler.Add(Request(2, 10, 100));
  StepPlan first = scheduler.Schedule();
  // Nothing decodes yet: both prompts whole, under the larger idle chunk.
  ASSERT_EQ(first.chunks.size(), 2u);
  EXPECT_EQ(first.prompt_tokens, 20);
  EXPECT_TRUE(first.samples[0] && first.samples[1]);
  scheduler.Update(first, Sample(first));

  scheduler.Add(Request(3, 200, 5));
  std::vector<int> prompt_steps;
  for (int step = 0; step < 4; ++step) {
    StepPlan plan = scheduler.Schedule();
    ASSERT_EQ(plan.chunks.size(), 3u) << "two decoding sequences and the newcomer's chunk";
    EXPECT_EQ(plan.chunks[0].tokens.size(), 1u);
    EXPECT_EQ(plan.chunks[1].tokens.size(), 1u);
    EXPECT_EQ(plan.chunks[2].slot, 2);
    EXPECT_EQ(plan.chunks[2].start, 64 * step);
    prompt_steps.push_back(plan.prompt_tokens);
    EXPECT_EQ(plan.samples[2], step == 3) << "a token only after the prompt's last chunk";
    const auto updates = scheduler.Update(plan, Sample(plan));
    EXPECT_EQ(updates.size(), step == 3 ? 3u : 2u);
  }
  EXPECT_EQ(prompt_steps, (std::vector<int>{64, 64, 64, 8}));
  EXPECT_EQ(scheduler.Schedule().decoding, 3);
}

TEST(SchedulerTest, SlotsGoLowestFirstToTheOldestAndFreeOnFinish) {
  SchedulerOptions options;
  options.slots = 2;
  Scheduler scheduler(options);
  for (uint64_t id = 1; id <= 4; ++id) scheduler.Add(Request(id, 4, id == 1 ? 1 : 3));
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(plan.chunks[0].slot, 0);
  EXPECT_EQ(plan.chunks[1].slot, 1);
  EXPECT_EQ(scheduler.running(), 2);
  EXPECT_EQ(scheduler.waiting(), 2);
  auto updates = scheduler.Update(plan, Sample(plan));
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_TRUE(updates[0].length) << "max_tokens 1";
  EXPECT_FALSE(updates[1].length);
  EXPECT_EQ(scheduler.running(), 1);
  plan = scheduler.Schedule();  // Request 3 takes slot 0 and prefills beside 2's decode.
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(plan.chunks[0].slot, 1);
  EXPECT_EQ(plan.chunks[0].start, 4);
  EXPECT_EQ(plan.chunks[1].slot, 0);
  EXPECT_EQ(plan.chunks[1].start, 0);
  EXPECT_EQ(scheduler.waiting(), 1);
}

TEST(SchedulerTest, EosEndsUnlessIgnoredAndTheContextEndsGeneration) {
  SchedulerOptions options;
  options.slots = 3;
  options.context_length = 8;
  options.eos_ids = {2};
  Scheduler scheduler(options);
  ScheduledRequest stops = Request(1, 3, 10);
  stops.ignore_eos = false;
  scheduler.Add(stops);
  scheduler.Add(Request(2, 3, 10));  // Ignores EOS; the context (8) ends it.
  StepPlan plan = scheduler.Schedule();
  auto updates = scheduler.Update(plan, Sample(plan, 2));
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_TRUE(updates[0].eos);
  EXPECT_FALSE(updates[1].eos);
  int generated = 1;
  while (scheduler.running() > 0) {
    plan = scheduler.Schedule();
    ASSERT_EQ(plan.ids, (std::vector<uint64_t>{2}));
    updates = scheduler.Update(plan, Sample(plan, 2));
    ++generated;
    EXPECT_EQ(updates.back().length, generated == 6) << generated;
  }
  EXPECT_EQ(generated, 6);  // 3 prompt + 6 generated: the 9th token has no room in 8.
}

TEST(SchedulerTest, RemovedSequencesLeaveTheirSlotsAndTheirResultsAreDropped) {
  SchedulerOptions options;
  options.slots = 1;
  Scheduler scheduler(options);
  scheduler.Add(Request(1, 4, 50));
  scheduler.Add(Request(2, 4, 50));
  scheduler.Add(Request(3, 4, 2));
  EXPECT_TRUE(scheduler.Remove(2));  // Waiting.
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(scheduler.Remove(1));  // Running, its step under way.
  EXPECT_TRUE(scheduler.Update(plan, Sample(plan)).empty());
  EXPECT_FALSE(scheduler.Remove(1));
  plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{3}));
  EXPECT_EQ(plan.chunks[0].slot, 0);
  EXPECT_EQ(plan.chunks[0].start, 0);
}

// A finished sequence's full blocks stay cached: a newcomer sharing a prefix takes the blocks of
// its longest cached run and starts after them, always running its last prompt token for logits.
TEST(SchedulerTest, PrefixCachingReusesTheLongestCachedRunOfFullBlocks) {
  SchedulerOptions options;
  options.slots = 3;
  options.block_size = 2;
  Scheduler scheduler(options);
  scheduler.Add(PromptRequest(1, {1, 2, 3}));
  scheduler.Add(PromptRequest(2, {5, 6, 7, 8, 9}));
  while (scheduler.running() + scheduler.waiting() > 0) {
    const StepPlan plan = scheduler.Schedule();
    scheduler.Update(plan, Sample(plan, 40));
  }
  // Cached: 1 2 | 3 40 from the first (its last 40 never ran), 5 6 | 7 8 | 9 40 from the second.
  scheduler.Add(PromptRequest(3, {5, 6, 7, 8, 9, 40, 41, 42}));
  scheduler.Add(PromptRequest(4, {1, 2, 3}));  // Short of its last token: the block 1 2 only.
  scheduler.Add(PromptRequest(5, {5, 6, 99}));
  scheduler.Add(PromptRequest(6, {7, 8, 9}));  // 7 8 follows 5 6 in the cache: not a prefix of this.
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(plan.chunks[0].start, 6);
  EXPECT_EQ(plan.chunks[0].tokens, (std::vector<int32_t>{41, 42}));
  EXPECT_EQ(plan.chunks[1].start, 2);
  EXPECT_EQ(plan.chunks[1].tokens, (std::vector<int32_t>{3}));
  EXPECT_EQ(plan.chunks[2].start, 2);
  EXPECT_EQ(plan.chunks[2].tokens, (std::vector<int32_t>{99}));
  // The cached blocks are copied into each newcomer's own consecutive run before the step: the
  // block 5 6 into both 3's and 5's first blocks.
  std::map<int32_t, int32_t> source;  // Destination -> source.
  for (const auto& [from, to] : plan.copies) source[to] = from;
  ASSERT_EQ(plan.copies.size(), 3u + 1u + 1u);
  for (const SequenceChunk& chunk : plan.chunks) {
    for (size_t b = 1; b < chunk.blocks.size(); ++b)
      EXPECT_EQ(chunk.blocks[b], chunk.blocks[0] + b);
  }
  EXPECT_EQ(source.at(plan.chunks[0].blocks[0]), source.at(plan.chunks[2].blocks[0]));
  EXPECT_NE(source.at(plan.chunks[0].blocks[0]), source.at(plan.chunks[1].blocks[0]));
  EXPECT_TRUE(source.count(plan.chunks[0].blocks[2]) && !source.count(plan.chunks[0].blocks[3]));
  EXPECT_EQ(scheduler.prefix_queries(), 3 + 5 + 8 + 3 + 3);
  EXPECT_EQ(scheduler.prefix_hits(), 6 + 2 + 2);
  scheduler.Update(plan, Sample(plan, 40));
  ASSERT_TRUE(scheduler.Remove(3));
  plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids.back(), 6u);
  EXPECT_EQ(plan.chunks.back().start, 0);
}

// The disk tier: blocks published by one scheduler (written out), found by a new one (a restart)
// past what its memory holds, loaded into the newcomer's own blocks and skipped; a block whose
// parent does not match ends the prefix there.
TEST(SchedulerTest, ADiskTierGivesBackPublishedBlocksAfterARestart) {
  SchedulerOptions options;
  options.slots = 2;
  options.block_size = 2;
  std::map<uint64_t, DiskBlock> disk;
  int lookups = 0;
  auto lookup = [&](uint64_t hash) -> std::optional<DiskBlock> {
    ++lookups;
    auto it = disk.find(hash);
    if (it == disk.end()) return std::nullopt;
    return it->second;
  };
  auto write_out = [&](Scheduler& scheduler) {
    for (StoredBlock& stored : scheduler.TakeStoredBlocks()) {
      disk[stored.hash] = DiskBlock{stored.parent, stored.tokens,
                                    std::make_shared<const std::string>(fmt::format(
                                        "{},{}", stored.tokens[0], stored.tokens[1]))};
    }
  };
  std::vector<uint64_t> chain;  // The hashes of 1 2 | 3 4 | 5 6.
  {
    Scheduler first(options);
    first.SetDiskTier(lookup);
    first.Add(PromptRequest(1, {1, 2, 3, 4, 5, 6, 7}));
    while (first.running() + first.waiting() > 0) {
      const StepPlan plan = first.Schedule();
      EXPECT_TRUE(plan.loads.empty());  // Nothing on disk yet.
      first.Update(plan, Sample(plan, 40));
      write_out(first);
    }
  }
  ASSERT_EQ(disk.size(), 4u);  // 1 2 | 3 4 | 5 6 | 7 40.
  Scheduler restarted(options);
  restarted.SetDiskTier(lookup);
  restarted.Add(PromptRequest(2, {1, 2, 3, 4, 5, 6, 8}));
  StepPlan plan = restarted.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 6);  // Three blocks from disk, the last token to run.
  EXPECT_EQ(plan.chunks[0].tokens, (std::vector<int32_t>{8}));
  ASSERT_EQ(plan.loads.size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(plan.loads[b].first, plan.chunks[0].blocks[b]);
    EXPECT_EQ(*plan.loads[b].second, fmt::format("{},{}", 2 * b + 1, 2 * b + 2));
  }
  EXPECT_EQ(restarted.prefix_hits(), 6);
  restarted.Update(plan, Sample(plan, 41));
  // Loaded blocks are published: the next prompt with that prefix finds them in memory.
  const int before = lookups;
  restarted.Add(PromptRequest(3, {1, 2, 3, 4, 9}));
  plan = restarted.Schedule();
  EXPECT_EQ(plan.chunks.back().start, 4);
  EXPECT_TRUE(plan.loads.empty());
  EXPECT_EQ(lookups, before);  // (4 tokens, short of the last: both blocks in memory.)

  // A block on disk whose parent is not the prompt's previous block is not taken.
  Scheduler third(options);
  third.SetDiskTier(lookup);
  for (auto& [hash, block] : disk) {
    if (block.tokens == std::vector<int32_t>{3, 4}) block.parent ^= 1;
  }
  third.Add(PromptRequest(4, {1, 2, 3, 4, 5, 6, 8}));
  plan = third.Schedule();
  ASSERT_EQ(plan.loads.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 2);

  // A LoRA adapter's sequence neither looks up nor keeps its blocks for the disk.
  Scheduler fourth(options);
  fourth.SetDiskTier(lookup);
  ScheduledRequest adapted = PromptRequest(5, {1, 2, 3, 4, 5, 6, 8});
  adapted.adapter = 3;
  const int looked = lookups;
  fourth.Add(adapted);
  plan = fourth.Schedule();
  EXPECT_TRUE(plan.loads.empty());
  EXPECT_EQ(lookups, looked);
  fourth.Update(plan, Sample(plan, 40));
  for (const StoredBlock& stored : fourth.TakeStoredBlocks()) EXPECT_EQ(stored.adapter, 3u);
}

// n choices of one prompt: the others wait for the first's prompt to be cached, then share its
// full blocks and run only the last, partial one.
TEST(SchedulerTest, ChoicesOfOnePromptShareItsBlocks) {
  SchedulerOptions options;
  options.slots = 4;
  options.block_size = 4;
  Scheduler scheduler(options);
  for (uint64_t id = 1; id <= 3; ++id) {
    ScheduledRequest r = Request(1, 42, 5);
    r.id = id;
    r.shares_prompt_of = id == 1 ? 0 : 1;
    scheduler.Add(r);
  }
  scheduler.Add(Request(4, 6, 5));  // Not held back by the choices.
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(scheduler.waiting(), 2);
  scheduler.Update(plan, Sample(plan));
  plan = scheduler.Schedule();
  ASSERT_EQ(plan.ids, (std::vector<uint64_t>{1, 4, 2, 3}));
  const std::vector<int32_t>& first = plan.chunks[0].blocks;
  std::set<std::pair<int32_t, int32_t>> copies(plan.copies.begin(), plan.copies.end());
  EXPECT_EQ(copies.size(), 20u);
  for (size_t i : {2u, 3u}) {
    EXPECT_EQ(plan.chunks[i].start, 40);
    EXPECT_EQ(plan.chunks[i].tokens.size(), 2u);
    for (size_t b = 0; b < 10; ++b) {
      EXPECT_TRUE(copies.count({first[b], plan.chunks[i].blocks[b]})) << i << " " << b;
    }
  }
  EXPECT_EQ(scheduler.prefix_hits(), 80);
}

// More sequences run than there are blocks for at their full context, since each holds blocks
// for its own prompt and max_tokens; the next waits until blocks free.
TEST(SchedulerTest, BlocksNotSlotsBoundWhatRunsTogether) {
  SchedulerOptions options;
  options.slots = 8;
  options.context_length = 64;
  options.block_size = 4;
  options.blocks = 16;  // One sequence of the full context.
  options.prefix_caching = false;
  Scheduler scheduler(options);
  for (uint64_t id = 1; id <= 6; ++id) scheduler.Add(Request(id, 6, 6));  // 3 blocks each.
  StepPlan plan = scheduler.Schedule();
  EXPECT_EQ(plan.ids, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  scheduler.Update(plan, Sample(plan));
  EXPECT_EQ(scheduler.kv_blocks_used(), 15);
  EXPECT_EQ(scheduler.waiting(), 1);
  std::set<int32_t> distinct;
  for (const SequenceChunk& chunk : plan.chunks) {
    ASSERT_EQ(chunk.blocks.size(), 3u);
    distinct.insert(chunk.blocks.begin(), chunk.blocks.end());
  }
  EXPECT_EQ(distinct.size(), 15u);
  ASSERT_TRUE(scheduler.Remove(2));
  EXPECT_EQ(scheduler.kv_blocks_used(), 12);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.ids.back(), 6u);
  EXPECT_EQ(scheduler.waiting(), 0);
}

TEST(SchedulerTest, PrefixCachingOffStartsEveryPromptAtZero) {
  SchedulerOptions options;
  options.slots = 1;
  options.prefix_caching = false;
  Scheduler scheduler(options);
  ScheduledRequest r = Request(1, 6, 1);
  scheduler.Add(r);
  StepPlan plan = scheduler.Schedule();
  scheduler.Update(plan, Sample(plan));
  r.id = 2;
  scheduler.Add(r);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.chunks[0].start, 0);
  EXPECT_EQ(scheduler.prefix_hits(), 0);
}

// A sequence removed while its prompt was half run leaves the full blocks it ran.
TEST(SchedulerTest, ARemovedPromptLeavesItsRunBlocksCached) {
  SchedulerOptions options;
  options.slots = 1;
  options.prefill_chunk = 6;
  options.block_size = 4;
  Scheduler scheduler(options);
  ScheduledRequest r = Request(1, 10, 5);
  scheduler.Add(r);
  StepPlan plan = scheduler.Schedule();
  scheduler.Update(plan, Sample(plan));  // 6 of 10 prompt tokens in the cache: one full block.
  ASSERT_TRUE(scheduler.Remove(1));
  r.id = 2;
  scheduler.Add(r);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.chunks[0].start, 4);
}

TEST(SchedulerTest, PromptLookupTakesWhatFollowedTheLatestLongestMatch) {
  using V = std::vector<int32_t>;
  // "1 2 3" occurred twice before; the later one was followed by 9 8.
  EXPECT_EQ(Scheduler::PromptLookup(V{1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 1, 2, 3}, 3, 4),
            (V{9, 8, 1, 2}));
  EXPECT_EQ(Scheduler::PromptLookup(V{1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 1, 2, 3}, 3, 1), (V{9}));
  // No 3-gram match; the 2-gram "4 5" was followed by 6.
  EXPECT_EQ(Scheduler::PromptLookup(V{4, 5, 6, 7, 5, 9, 4, 5}, 3, 2), (V{6, 7}));
  // A single token's match is too weak a guess: no drafts, unless n-grams of 1 are asked for.
  EXPECT_TRUE(Scheduler::PromptLookup(V{5, 6, 7, 5, 9, 4, 5}, 3, 2).empty());
  EXPECT_EQ(Scheduler::PromptLookup(V{5, 6, 7, 5, 9, 4, 5}, 1, 2), (V{9, 4}));
  EXPECT_TRUE(Scheduler::PromptLookup(V{1, 2, 3, 4}, 3, 4).empty());
  EXPECT_TRUE(Scheduler::PromptLookup(V{1, 1, 1}, 2, 0).empty());
  EXPECT_TRUE(Scheduler::PromptLookup(V{1}, 2, 3).empty());
}

TEST(SchedulerTest, DraftsAreVerifiedAndTheCacheAdvancesByWhatWasKept) {
  SchedulerOptions options;
  options.slots = 1;
  options.speculative_tokens = 3;
  options.speculative_ngram = 2;
  Scheduler scheduler(options);
  ScheduledRequest r;
  r.id = 1;
  r.prompt = {10, 11, 12, 13, 10, 11};  // "10 11" was followed by 12 13 10.
  r.max_tokens = 20;
  r.ignore_eos = true;
  scheduler.Add(r);
  StepPlan plan = scheduler.Schedule();
  scheduler.Update(plan, {{12}});  // The prompt's token: 12.
  plan = scheduler.Schedule();
  // Input 12 at position 6, then drafts for "11 12": 13 10 11.
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 6);
  EXPECT_EQ(plan.chunks[0].tokens, (std::vector<int32_t>{12, 13, 10, 11}));
  EXPECT_TRUE(plan.chunks[0].all_logits);
  EXPECT_EQ(plan.rows[0], 4);
  // Two drafts kept (13, 10), the third replaced by 40.
  auto updates = scheduler.Update(plan, {{13, 10, 40}});
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].drafts_accepted, 2);
  EXPECT_EQ(updates[2].token, 40);
  EXPECT_EQ(updates[2].generated, 4);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.chunks[0].start, 9) << "12, 13, 10 are in the cache; 40 is the next input";
  EXPECT_EQ(plan.chunks[0].tokens.front(), 40);
}

TEST(SchedulerTest, DraftsStopShortOfMaxTokensAndTheContext) {
  SchedulerOptions options;
  options.slots = 1;
  options.speculative_tokens = 8;
  options.context_length = 64;
  Scheduler scheduler(options);
  ScheduledRequest r;
  r.id = 1;
  r.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3};
  r.max_tokens = 4;
  r.ignore_eos = true;
  scheduler.Add(r);
  StepPlan plan = scheduler.Schedule();
  scheduler.Update(plan, {{4}});
  plan = scheduler.Schedule();
  // 1 generated, 3 to go: 2 drafts and the token sampled after them.
  EXPECT_EQ(plan.chunks[0].tokens, (std::vector<int32_t>{4, 5, 6}));
  auto updates = scheduler.Update(plan, {{5, 6, 7}});
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_TRUE(updates.back().length);
  EXPECT_EQ(scheduler.running(), 0);
}

// Random admissions, removals, drafts and acceptance; a fake model tracks each slot's cached
// length and owner. No chunk may skip or rewrite a cached position of its sequence, share a
// slot, or exceed the budget, and every request ends exactly once with what it asked for.
// Admissions, removals, drafts kept at random and shared prompt prefixes over 3,000 steps, with
// a pool too small for every slot's full context, checked against a fake cache that records the
// token each row of each block holds: a chunk starts where its sequence's cached rows end, every
// row before it holds the sequence's own token (a matched prefix included), and no chunk writes
// into a block another running sequence holds.
TEST(SchedulerTest, RandomisedRunKeepsEveryBlockConsistent) {
  std::mt19937 rng(7);
  SchedulerOptions options;
  options.slots = 4;
  options.context_length = 96;
  options.block_size = 4;
  options.blocks = 40;  // Fewer than 4 x 24: requests wait for blocks, cached ones are evicted.
  options.max_step_tokens = 16;
  options.prefill_chunk = 40;
  options.speculative_tokens = 3;
  options.speculative_ngram = 2;
  options.eos_ids = {0};
  Scheduler scheduler(options);
  const int block = options.block_size;
  std::vector<int32_t> cells(static_cast<size_t>(options.blocks * block), -1);
  std::map<uint64_t, std::vector<int32_t>> confirmed;  // Prompt + generated tokens.
  std::map<uint64_t, std::vector<int32_t>> tables;     // Of the sequences seen running.
  std::map<uint64_t, size_t> prompts;                  // Prompt lengths.
  std::map<uint64_t, int> max_tokens, generated;
  std::set<uint64_t> ended, removed;
  uint64_t next_id = 1;
  int drafts_kept = 0, copied = 0, scattered = 0;
  int64_t reused = 0;
  for (int step = 0; step < 3000; ++step) {
    if (rng() % 3 == 0 && next_id <= 400) {
      ScheduledRequest r;
      r.id = next_id++;
      // Half the prompts open with one of two shared prefixes, so blocks get reused.
      const int prompt = 1 + static_cast<int>(rng() % 60);
      const int shared = rng() % 2 ? static_cast<int>(rng() % 20) : 0;
      const int32_t family = 10 + static_cast<int32_t>(rng() % 2);
      for (int i = 0; i < prompt; ++i) {
        r.prompt.push_back(i < shared ? family + i : 1 + static_cast<int32_t>(rng() % 4));
      }
      if (r.id > 1 && rng() % 5 == 0) {  // Another choice of the previous request's prompt.
        r.prompt = confirmed[r.id - 1];
        r.prompt.resize(prompts[r.id - 1]);
        r.shares_prompt_of = r.id - 1;
      }
      r.max_tokens = 1 + static_cast<int>(rng() % 30);
      r.ignore_eos = rng() % 2 == 0;
      max_tokens[r.id] = r.max_tokens;
      confirmed[r.id] = r.prompt;
      prompts[r.id] = r.prompt.size();
      scheduler.Add(r);
    }
    if (rng() % 17 == 0 && next_id > 1) {
      const uint64_t id = 1 + rng() % (next_id - 1);
      if (scheduler.Remove(id)) {
        removed.insert(id);
        tables.erase(id);
      }
    }
    const StepPlan plan = scheduler.Schedule();
    for (const auto& [from, to] : plan.copies) {
      for (const auto& [other, table] : tables) {
        ASSERT_EQ(std::count(table.begin(), table.end(), to), 0) << "a copy over a held block";
      }
      std::copy_n(cells.begin() + from * block, block, cells.begin() + to * block);
      ++copied;
    }
    std::vector<std::vector<int32_t>> tokens(plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const SequenceChunk& chunk = plan.chunks[i];
      const uint64_t id = plan.ids[i];
      const std::vector<int32_t>& own = confirmed[id];
      auto seen = tables.find(id);
      if (seen == tables.end()) {
        ASSERT_EQ(chunk.start % block, 0) << "a matched prefix is whole blocks";
        reused += chunk.start;
        for (size_t b = 1; b < chunk.blocks.size(); ++b) {
          if (chunk.blocks[b] != chunk.blocks[b - 1] + 1) {
            ++scattered;
            break;
          }
        }
        seen = tables.emplace(id, chunk.blocks).first;
      }
      ASSERT_EQ(chunk.blocks, seen->second) << "sequence " << id << "'s table changed";
      const int end = chunk.start + static_cast<int>(chunk.tokens.size());
      ASSERT_GE(static_cast<int>(chunk.blocks.size()) * block, end);
      ASSERT_LE(end, options.context_length);
      auto row = [&](int position) {
        return static_cast<size_t>(chunk.blocks[static_cast<size_t>(position / block)] * block +
                                   position % block);
      };
      for (int p = 0; p < chunk.start; ++p) {
        ASSERT_EQ(cells[row(p)], own[static_cast<size_t>(p)])
            << "sequence " << id << " reads another token's row at " << p;
      }
      ASSERT_EQ(chunk.tokens[0], own[static_cast<size_t>(chunk.start)]);
      for (int b = chunk.start / block; b < (end + block - 1) / block; ++b) {
        for (const auto& [other, table] : tables) {
          if (other == id) continue;
          ASSERT_EQ(std::count(table.begin(), table.end(), chunk.blocks[static_cast<size_t>(b)]), 0)
              << "sequence " << id << " writes into a block sequence " << other << " holds";
        }
      }
      for (int p = chunk.start; p < end; ++p) {
        cells[row(p)] = chunk.tokens[static_cast<size_t>(p - chunk.start)];
      }
      if (!plan.samples[i]) continue;
      // Keep a random number of the drafts, then one token of our own (or EOS now and then).
      const int kept = static_cast<int>(rng() % static_cast<unsigned>(plan.rows[i]));
      for (int j = 0; j < kept; ++j) tokens[i].push_back(chunk.tokens[static_cast<size_t>(j) + 1]);
      tokens[i].push_back(rng() % 40 == 0 ? 0 : 5);
    }
    ASSERT_LE(plan.prompt_tokens,
              plan.decoding > 0 ? options.max_step_tokens : options.prefill_chunk);
    for (const TokenUpdate& u : scheduler.Update(plan, tokens)) {
      ASSERT_FALSE(ended.count(u.id)) << "sequence " << u.id << " went on after its end";
      ASSERT_EQ(u.generated, ++generated[u.id]);
      ASSERT_LE(u.generated, max_tokens[u.id]);
      confirmed[u.id].push_back(u.token);
      if (u.eos || u.length) {
        ended.insert(u.id);
        tables.erase(u.id);
      }
      if (u.length && !u.eos) {
        ASSERT_EQ(u.generated, max_tokens[u.id]);
      }
      drafts_kept += u.drafts_accepted;
    }
  }
  while (scheduler.running() + scheduler.waiting() > 0) {
    const StepPlan plan = scheduler.Schedule();
    for (const TokenUpdate& u : scheduler.Update(plan, Sample(plan, 5))) {
      if (u.eos || u.length) ended.insert(u.id);
    }
  }
  for (const auto& [id, limit] : max_tokens) {
    EXPECT_TRUE(ended.count(id) + removed.count(id) == 1) << "sequence " << id;
  }
  EXPECT_GT(ended.size(), 300u);
  EXPECT_GT(drafts_kept, 100);
  EXPECT_GT(reused, 200);
  EXPECT_EQ(scheduler.prefix_hits(), reused);
  EXPECT_EQ(scheduler.kv_blocks_used(), 0);
  EXPECT_GT(copied, 50);
  EXPECT_GT(scattered, 10) << "the pool was never too fragmented for a run";
}

}  // namespace
}  // namespace sluice::llm
