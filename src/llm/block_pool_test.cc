// The paged cache's block pool: counting, prefix matches, eviction order, and a randomised run of
// admissions, growth, cancellations and evictions against a fake cache that records what each
// block holds.
#include "llm/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace sluice::llm {
namespace {

constexpr int kB = 4;  // Tokens per block.

std::vector<int32_t> Tokens(std::initializer_list<int32_t> t) { return t; }

// Publishes the full blocks of `tokens` held in `ids`, in order.
void PublishAll(BlockPool& pool, const std::vector<int32_t>& ids,
                const std::vector<int32_t>& tokens) {
  uint64_t parent = BlockPool::kRootHash;
  for (size_t b = 0; b < ids.size() && (b + 1) * kB <= tokens.size(); ++b) {
    parent = pool.Publish(ids[b], parent, tokens.data() + b * kB);
  }
}

TEST(BlockPoolTest, AllocatesWhatIsAvailableAndNoMore) {
  BlockPool pool(3, kB);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Allocate(2, &a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(pool.available(), 1);
  EXPECT_FALSE(pool.Allocate(2, &b));  // All or nothing.
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.available(), 1);
  pool.Release(a);
  EXPECT_EQ(pool.available(), 3);
  std::string why;
  EXPECT_TRUE(pool.Consistent(&why)) << why;
}

TEST(BlockPoolTest, APublishedPrefixIsMatchedUpToItsFirstDifference) {
  BlockPool pool(8, kB);
  const auto first = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  std::vector<int32_t> ids;
  ASSERT_TRUE(pool.Allocate(4, &ids));
  PublishAll(pool, ids, first);  // Three full blocks; the fourth holds one token.
  EXPECT_EQ(pool.published(), 3);
  // Held: a second sequence shares them while the first still runs.
  auto shared = pool.Match(Tokens({1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0}), 10);
  EXPECT_EQ(shared, (std::vector<int32_t>{ids[0], ids[1]}));
  EXPECT_EQ(pool.refs(ids[0]), 2);
  pool.Release(ids);
  // Released: cached, still matched; the unpublished fourth block is simply free.
  EXPECT_EQ(pool.available(), 8 - 2);
  auto again = pool.Match(first, 10);
  EXPECT_EQ(again, (std::vector<int32_t>{ids[0], ids[1], ids[2]}));
  EXPECT_EQ(pool.Match(first, 1).size(), 1u);  // At most max_blocks.
  // A prefix that differs in its first block matches nothing.
  EXPECT_TRUE(pool.Match(Tokens({9, 2, 3, 4, 5, 6, 7, 8}), 10).empty());
  // The same block after another first block is another hash.
  EXPECT_TRUE(pool.Match(Tokens({5, 6, 7, 8}), 10).empty());
  std::string why;
  EXPECT_TRUE(pool.Consistent(&why)) << why;
}

TEST(BlockPoolTest, UnpublishedBlocksGoFirstThenTheLeastRecentlyReleased) {
  BlockPool pool(4, kB);
  std::vector<int32_t> a, b, c;
  ASSERT_TRUE(pool.Allocate(1, &a));
  ASSERT_TRUE(pool.Allocate(1, &b));
  pool.Publish(a[0], BlockPool::kRootHash, Tokens({1, 1, 1, 1}).data());
  pool.Publish(b[0], BlockPool::kRootHash, Tokens({2, 2, 2, 2}).data());
  pool.Release(b);  // b cached first, then a: b is the older.
  pool.Release(a);
  ASSERT_TRUE(pool.Allocate(2, &c));  // The two never published.
  EXPECT_EQ(pool.published(), 2);
  std::vector<int32_t> d;
  ASSERT_TRUE(pool.Allocate(1, &d));
  EXPECT_EQ(d[0], b[0]);  // Evicted: no longer found.
  EXPECT_EQ(pool.published(), 1);
  EXPECT_TRUE(pool.Match(Tokens({2, 2, 2, 2}), 1).empty());
  EXPECT_EQ(pool.Match(Tokens({1, 1, 1, 1}), 1), a);
  std::vector<int32_t> e;
  EXPECT_FALSE(pool.Allocate(1, &e));  // a is held again: nothing to evict.
}

TEST(BlockPoolTest, RunsAreConsecutiveAndEvictOnlyWhenTheyMust) {
  BlockPool pool(6, kB);
  std::vector<int32_t> a, b, c, d;
  ASSERT_TRUE(pool.Allocate(6, &a));  // 0-5.
  pool.Publish(a[1], BlockPool::kRootHash, Tokens({1, 1, 1, 1}).data());
  pool.Release({a[1], a[2], a[4]});  // Free: 1 (cached), 2, 4.
  EXPECT_FALSE(pool.AllocateRun(3, &b));
  EXPECT_TRUE(b.empty());
  ASSERT_TRUE(pool.AllocateRun(1, &b));
  EXPECT_EQ(b, std::vector<int32_t>{2}) << "the lowest block that evicts nothing";
  pool.Release({a[3]});  // Free: 1 (cached), 3, 4.
  ASSERT_TRUE(pool.AllocateRun(2, &c));
  EXPECT_EQ(c, (std::vector<int32_t>{3, 4}));
  pool.Release(b);  // Free: 1 (cached), 2.
  ASSERT_TRUE(pool.AllocateRun(2, &d));
  EXPECT_EQ(d, (std::vector<int32_t>{1, 2})) << "a run that must evict the cached block";
  EXPECT_EQ(pool.published(), 0);
  std::string why;
  EXPECT_TRUE(pool.Consistent(&why)) << why;
}

// In a pool whose free blocks are all cached (a busy server's steady state), a run evicts the
// blocks released longest ago, not the lowest ids: a prefix cached a moment before survives.
TEST(BlockPoolTest, AFullPoolsRunEvictsTheColdestBlocks) {
  BlockPool pool(6, kB);
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Allocate(6, &all));  // 0-5.
  for (int32_t id : all) {
    pool.Publish(id, BlockPool::kRootHash, Tokens({id, id, id, id}).data());
  }
  // Released oldest first at the high ids; then 4 is used again and released: the newest.
  pool.Release({4, 5});
  pool.Release({2, 3});
  pool.Release({0, 1});
  ASSERT_EQ(pool.Match(Tokens({4, 4, 4, 4}), 1), std::vector<int32_t>{4});
  pool.Release({4});
  std::vector<int32_t> run;
  ASSERT_TRUE(pool.AllocateRun(2, &run));
  EXPECT_EQ(run, (std::vector<int32_t>{2, 3})) << "the pair released longest ago";
  EXPECT_EQ(pool.Match(Tokens({0, 0, 0, 0}), 1), std::vector<int32_t>{0}) << "0 stays cached";
  std::vector<int32_t> second;
  ASSERT_TRUE(pool.AllocateRun(2, &second));
  EXPECT_EQ(second, (std::vector<int32_t>{4, 5})) << "the only free pair left";
  std::string why;
  EXPECT_TRUE(pool.Consistent(&why)) << why;
}

TEST(BlockPoolTest, ASecondCopyOfAPublishedBlockStaysUnpublished) {
  BlockPool pool(2, kB);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Allocate(1, &a));
  ASSERT_TRUE(pool.Allocate(1, &b));
  const auto t = Tokens({3, 1, 4, 1});
  const uint64_t h1 = pool.Publish(a[0], BlockPool::kRootHash, t.data());
  const uint64_t h2 = pool.Publish(b[0], BlockPool::kRootHash, t.data());
  EXPECT_EQ(h1, h2);
  EXPECT_TRUE(pool.is_published(a[0]));
  EXPECT_FALSE(pool.is_published(b[0]));
  pool.Release(b);
  EXPECT_EQ(pool.available(), 1);
}

// Sequences come and go at random: prompts drawn from a few shared prefixes, admitted with what
// Match() finds and blocks allocated for the rest, growing a block at a time as they decode,
// cancelled or finished at random, their full blocks published as they fill. A fake cache records
// the tokens each block holds: a matched block must hold exactly the prompt's tokens, a fresh one
// must not be held by anyone, and no block is ever held beyond the pool.
TEST(BlockPoolTest, ARandomisedRunNeverOvercommitsOrHandsOutWrongBlocks) {
  std::mt19937 rng(29);
  const int blocks = 40;
  BlockPool pool(blocks, kB);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> prefix;
    for (int i = 0; i < 3 * kB + p; ++i) prefix.push_back(static_cast<int32_t>(rng() % 50));
    prefixes.push_back(prefix);
  }
  struct Seq {
    std::vector<int32_t> tokens;  // Written to the cache so far.
    std::vector<int32_t> ids;     // Its block table.
    uint64_t parent = BlockPool::kRootHash;
    int published = 0;  // Full blocks published.
  };
  std::map<int, Seq> live;
  std::map<int32_t, std::vector<int32_t>> cache;  // Block -> the tokens written into it.
  std::map<int32_t, std::set<int>> holders;
  int next_id = 0, admitted = 0, refused = 0, matched_blocks = 0;
  // A router that follows the pool's events only: the hashes it was told are cached.
  pool.RecordEvents(true);
  std::set<uint64_t> announced;
  int64_t stored_events = 0, removed_blocks = 0;
  auto write = [&](Seq& s, int32_t token) {
    const size_t position = s.tokens.size();
    const int32_t block = s.ids[position / kB];
    ASSERT_EQ(holders[block].size(), 1u) << "a write into a block another sequence holds";
    auto& content = cache[block];
    content.resize(position % kB);
    content.push_back(token);
    s.tokens.push_back(token);
    if (s.tokens.size() % kB == 0) {
      const size_t b = s.tokens.size() / kB - 1;
      s.parent = pool.Publish(s.ids[b], s.parent, s.tokens.data() + b * kB, b == 0);
      ++s.published;
    }
  };
  auto release = [&](int id) {
    Seq& s = live[id];
    for (int32_t b : s.ids) holders[b].erase(id);
    pool.Release(s.ids);
    live.erase(id);
  };
  for (int step = 0; step < 5000; ++step) {
    const int action = static_cast<int>(rng() % 10);
    if (action < 3) {  // Admit a prompt: a shared prefix, then its own tokens.
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const int own = static_cast<int>(rng() % (2 * kB));
      for (int i = 0; i < own; ++i) prompt.push_back(static_cast<int32_t>(50 + rng() % 50));
      const int room = static_cast<int>(rng() % (2 * kB)) + 1;  // Tokens it may generate.
      const int need = (static_cast<int>(prompt.size()) + room + kB - 1) / kB;
      // The block holding the prompt's last token always runs (for its logits): never matched.
      Seq s;
      s.ids = pool.Match(prompt, (static_cast<int>(prompt.size()) - 1) / kB);
      for (size_t b = 0; b < s.ids.size(); ++b) {
        const std::vector<int32_t> want(prompt.begin() + b * kB, prompt.begin() + (b + 1) * kB);
        ASSERT_EQ(cache[s.ids[b]], want) << "a matched block holds other tokens";
      }
      const size_t matched = s.ids.size();
      const int id = next_id++;
      if (!pool.Allocate(need - static_cast<int>(matched), &s.ids)) {
        pool.Release(s.ids);  // Waits (here: gives up) with nothing held.
        ++refused;
        continue;
      }
      ++admitted;
      matched_blocks += static_cast<int>(matched);
      std::set<int32_t> distinct(s.ids.begin(), s.ids.end());
      ASSERT_EQ(distinct.size(), s.ids.size()) << "a block twice in one table";
      for (int32_t b : s.ids) holders[b].insert(id);
      // Its matched blocks are written already; it computes the rest of its prompt.
      s.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(matched * kB));
      for (size_t b = 0; b < matched; ++b) s.parent = pool.Hash(s.parent, prompt.data() + b * kB);
      s.published = static_cast<int>(matched);
      live.emplace(id, std::move(s));
      Seq& added = live[id];
      for (size_t i = added.tokens.size(); i < prompt.size(); ++i) write(added, prompt[i]);
    } else if (action < 8 && !live.empty()) {  // A decoding step for one sequence.
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      Seq& s = it->second;
      if (s.tokens.size() >= s.ids.size() * kB) {
        release(it->first);  // Its reservation is used up: it finishes.
      } else {
        write(s, static_cast<int32_t>(100 + rng() % 20));
      }
    } else if (!live.empty()) {  // A cancellation.
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      release(it->first);
    }
    for (const KvEvent& event : pool.TakeEvents()) {
      if (event.kind == KvEvent::Kind::kStored) {
        ++stored_events;
        ASSERT_EQ(event.tokens.size(), event.hashes.size() * kB);
        // The router can check each hash from the tokens and the parent it was told.
        uint64_t parent = event.parent.value_or(BlockPool::kRootHash);
        for (size_t b = 0; b < event.hashes.size(); ++b) {
          parent = pool.Hash(parent, event.tokens.data() + b * kB);
          ASSERT_EQ(event.hashes[b], parent);
          ASSERT_TRUE(announced.insert(parent).second) << "a block stored twice";
        }
      } else {
        ASSERT_EQ(event.kind, KvEvent::Kind::kRemoved);
        for (const uint64_t hash : event.hashes) {
          ASSERT_EQ(announced.erase(hash), 1u) << "a block removed that was never stored";
          ++removed_blocks;
        }
      }
    }
    ASSERT_EQ(static_cast<int>(announced.size()), pool.published());
    std::string why;
    ASSERT_TRUE(pool.Consistent(&why)) << why;
    int held = 0;
    for (const auto& [block, who] : holders) held += !who.empty();
    ASSERT_EQ(held, pool.held());
    ASSERT_LE(held, blocks);
    for (const auto& [block, who] : holders) {
      if (who.size() > 1) {
        ASSERT_TRUE(pool.is_published(block)) << "an unpublished block shared";
      }
      ASSERT_EQ(pool.refs(block), static_cast<int>(who.size()));
    }
  }
  RecordProperty("admitted", admitted);
  RecordProperty("refused", refused);
  RecordProperty("matched_blocks", matched_blocks);
  EXPECT_GT(admitted, 500);
  EXPECT_GT(refused, 10);  // The pool ran short, and evicted along the way.
  EXPECT_GT(matched_blocks, 100);
  EXPECT_GT(stored_events, 100);
  EXPECT_GT(removed_blocks, 20);
}

TEST(BlockPoolTest, EventsTellWhatWasStoredAndWhatWasEvicted) {
  BlockPool pool(3, kB);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(3, &a));
  const auto tokens = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  PublishAll(pool, a, tokens);
  EXPECT_TRUE(pool.TakeEvents().empty());  // Not recording.

  pool.RecordEvents(true);
  pool.Release(a);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.Allocate(2, &b));  // Evicts the two least recently released: blocks 0, 1.
  const uint64_t h0 = pool.Hash(BlockPool::kRootHash, tokens.data());
  const uint64_t h1 = pool.Hash(h0, tokens.data() + kB);
  const uint64_t h2 = pool.Hash(h1, tokens.data() + 2 * kB);
  // A sequence whose first block is new, then one continuing block 2's chain.
  const auto other = Tokens({20, 21, 22, 23, 24, 25, 26, 27});
  const uint64_t g0 = pool.Publish(b[0], BlockPool::kRootHash, other.data(), true, 7);
  const uint64_t g1 = pool.Publish(b[1], g0, other.data() + kB, false, 7);
  auto events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{h0, h1}));
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{g0, g1}));  // One event for the chain.
  EXPECT_FALSE(events[1].parent.has_value());                      // It starts a sequence.
  EXPECT_EQ(events[1].tokens, other);
  EXPECT_EQ(events[1].adapter, 7u);
  EXPECT_TRUE(pool.TakeEvents().empty());  // Taken once.

  // A block after block 2 (still cached): its event names block 2 as its parent.
  pool.Release(b);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.Allocate(1, &c));  // Evicts the oldest cached block: block 2.
  events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{h2}));
  pool.Publish(c[0], g1, tokens.data(), false, 0);
  events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].parent, g1);
  EXPECT_EQ(events[0].adapter, 0u);

  pool.RecordEvents(false);
  pool.Release(c);
  std::vector<int32_t> d;
  ASSERT_TRUE(pool.Allocate(3, &d));  // Evicts every cached block, unrecorded.
  EXPECT_TRUE(pool.TakeEvents().empty());
}

}  // namespace
}  // namespace sluice::llm
