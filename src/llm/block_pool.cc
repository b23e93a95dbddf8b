#include "llm/block_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <deque>

namespace sluice::llm {

namespace {

uint64_t Mix(uint64_t h, uint64_t x) {
  // splitmix64's finaliser over the running hash and the next word.
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace

BlockPool::BlockPool(int blocks, int block_size)
    : block_size_(block_size),
      refs_(static_cast<size_t>(blocks), 0),
      published_(static_cast<size_t>(blocks), false),
      hash_(static_cast<size_t>(blocks), 0),
      parent_(static_cast<size_t>(blocks), 0),
      tokens_(static_cast<size_t>(blocks)),
      where_(static_cast<size_t>(blocks)),
      in_evictable_(static_cast<size_t>(blocks), false),
      released_(static_cast<size_t>(blocks), 0) {
  unused_.reserve(static_cast<size_t>(blocks));
  // Handed out lowest first.
  for (int id = blocks - 1; id >= 0; --id) unused_.push_back(id);
}

uint64_t BlockPool::Hash(uint64_t parent, const int32_t* tokens) const {
  uint64_t h = Mix(parent, static_cast<uint64_t>(block_size_));
  for (int i = 0; i < block_size_; ++i) h = Mix(h, static_cast<uint32_t>(tokens[i]));
  return h;
}

uint64_t BlockPool::SaltedRoot(uint64_t salt) {
  if (salt == 0) return kRootHash;
  // splitmix64's finaliser: salts that differ in one bit give unrelated roots.
  uint64_t z = kRootHash ^ (salt + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<int32_t> BlockPool::Match(const std::vector<int32_t>& tokens, int max_blocks,
                                      uint64_t root) {
  std::vector<int32_t> out;
  const int full = std::min(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  uint64_t parent = root;
  for (int b = 0; b < full; ++b) {
    const int32_t* block = tokens.data() + static_cast<size_t>(b) * block_size_;
    const uint64_t hash = Hash(parent, block);
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    const auto id = static_cast<size_t>(it->second);
    if (parent_[id] != parent || !std::equal(tokens_[id].begin(), tokens_[id].end(), block)) {
      break;  // A hash collision: not these tokens.
    }
    if (refs_[id] == 0) {
      evictable_.erase(where_[id]);
      in_evictable_[id] = false;
    }
    ++refs_[id];
    out.push_back(it->second);
    parent = hash;
  }
  return out;
}

bool BlockPool::Allocate(int n, std::vector<int32_t>* out) {
  if (n > available()) return false;
  for (int i = 0; i < n; ++i) {
    int32_t id;
    if (!unused_.empty()) {
      id = unused_.back();
      unused_.pop_back();
    } else {
      id = evictable_.front();
      evictable_.pop_front();
      in_evictable_[static_cast<size_t>(id)] = false;
      Unpublish(id);
    }
    refs_[static_cast<size_t>(id)] = 1;
    out->push_back(id);
  }
  return true;
}

bool BlockPool::AllocateRun(int n, std::vector<int32_t>* out) {
  if (n <= 0) return true;
  // Of the runs of n blocks no one holds, the one whose most recently cached block was released
  // longest ago (a never-published block counts as released before all): the lowest run that
  // evicts nothing where there is one, else the coldest run. (Taking the lowest run whatever it
  // held evicted by block id, not by age: in a pool full of cached blocks, as a busy server's is,
  // it threw out the prefix another conversation had cached a moment before.) A sliding maximum
  // over the run's ages: `window` holds ids of the current run with strictly falling ages.
  const int total = blocks();
  auto age = [this](int id) -> uint64_t {
    const auto i = static_cast<size_t>(id);
    return published_[i] ? released_[i] : 0;
  };
  int best_first = -1;
  uint64_t best_age = 0;
  std::deque<int> window;
  int run = 0;
  for (int id = 0; id < total; ++id) {
    if (refs_[static_cast<size_t>(id)] != 0) {
      run = 0;
      window.clear();
      continue;
    }
    ++run;
    while (!window.empty() && age(window.back()) <= age(id)) window.pop_back();
    window.push_back(id);
    if (run < n) continue;
    const int first = id - n + 1;
    while (window.front() < first) window.pop_front();
    const uint64_t newest = age(window.front());
    if (best_first < 0 || newest < best_age) {
      best_first = first;
      best_age = newest;
      if (best_age == 0) break;
    }
  }
  if (best_first < 0) return false;
  for (int b = best_first; b < best_first + n; ++b) {
    const auto j = static_cast<size_t>(b);
    if (in_evictable_[j]) {
      evictable_.erase(where_[j]);
      in_evictable_[j] = false;
      Unpublish(b);
    }
    refs_[j] = 1;
    out->push_back(b);
  }
  unused_.erase(std::remove_if(unused_.begin(), unused_.end(),
                               [this](int32_t b) { return refs_[static_cast<size_t>(b)] > 0; }),
                unused_.end());
  return true;
}

uint64_t BlockPool::Publish(int32_t id, uint64_t parent, const int32_t* tokens, bool first,
                           uint64_t adapter) {
  const uint64_t hash = Hash(parent, tokens);
  const auto i = static_cast<size_t>(id);
  assert(refs_[i] > 0);
  if (published_[i] || by_hash_.count(hash) != 0) return hash;
  published_[i] = true;
  hash_[i] = hash;
  parent_[i] = parent;
  tokens_[i].assign(tokens, tokens + block_size_);
  by_hash_.emplace(hash, id);
  if (recording_stored_) stored_.push_back({id, hash, parent, tokens_[i], adapter});
  if (recording_) {
    // The chain's previous block was the last one stored: one event holds both.
    if (events_.empty() || events_.back().kind != KvEvent::Kind::kStored || first ||
        events_.back().hashes.back() != parent || events_.back().adapter != adapter) {
      KvEvent& event = events_.emplace_back();
      event.kind = KvEvent::Kind::kStored;
      if (!first) event.parent = parent;
      event.adapter = adapter;
    }
    events_.back().hashes.push_back(hash);
    events_.back().tokens.insert(events_.back().tokens.end(), tokens, tokens + block_size_);
  }
  return hash;
}

void BlockPool::RecordEvents(bool on) {
  recording_ = on;
  if (!on) events_.clear();
}

void BlockPool::RecordStored(bool on) {
  recording_stored_ = on;
  if (!on) stored_.clear();
}

std::vector<StoredBlock> BlockPool::TakeStored() {
  std::vector<StoredBlock> out;
  out.swap(stored_);
  return out;
}

std::vector<KvEvent> BlockPool::TakeEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

void BlockPool::Unpublish(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (!published_[i]) return;
  by_hash_.erase(hash_[i]);
  published_[i] = false;
  tokens_[i].clear();
  if (recording_) {
    if (events_.empty() || events_.back().kind != KvEvent::Kind::kRemoved) {
      events_.emplace_back().kind = KvEvent::Kind::kRemoved;
    }
    events_.back().hashes.push_back(hash_[i]);
  }
}

void BlockPool::Release(const std::vector<int32_t>& ids) {
  for (const int32_t id : ids) {
    const auto i = static_cast<size_t>(id);
    assert(refs_[i] > 0);
    if (--refs_[i] > 0) continue;
    if (published_[i]) {
      where_[i] = evictable_.insert(evictable_.end(), id);
      in_evictable_[i] = true;
      released_[i] = ++releases_;
    } else {
      unused_.push_back(id);
    }
  }
}

bool BlockPool::Consistent(std::string* why) const {
  std::vector<int> seen(refs_.size(), 0);
  for (const int32_t id : unused_) {
    const auto i = static_cast<size_t>(id);
    if (refs_[i] != 0 || published_[i]) {
      *why = fmt::format("unused block {} has {} refs, published {}", id, refs_[i], published_[i]);
      return false;
    }
    ++seen[i];
  }
  for (const int32_t id : evictable_) {
    const auto i = static_cast<size_t>(id);
    if (refs_[i] != 0 || !published_[i] || !in_evictable_[i]) {
      *why =
          fmt::format("evictable block {} has {} refs, published {}", id, refs_[i], published_[i]);
      return false;
    }
    ++seen[i];
  }
  size_t published = 0;
  for (size_t i = 0; i < refs_.size(); ++i) {
    if (refs_[i] < 0 || (refs_[i] > 0) == (seen[i] > 0) || seen[i] > 1) {
      *why = fmt::format("block {}: {} refs, listed {} times as available", i, refs_[i], seen[i]);
      return false;
    }
    if (published_[i]) {
      ++published;
      auto it = by_hash_.find(hash_[i]);
      if (it == by_hash_.end() || it->second != static_cast<int32_t>(i)) {
        *why = fmt::format("published block {} is not found by its hash", i);
        return false;
      }
    }
  }
  if (published != by_hash_.size()) {
    *why = fmt::format("{} published blocks, {} hashes", published, by_hash_.size());
    return false;
  }
  return true;
}

}  // namespace sluice::llm
