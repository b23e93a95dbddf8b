// The blocks of a paged KV cache: a fixed number of fixed-size blocks handed to sequences by
// reference count, so concurrency is bounded by the tokens sequences hold, not by a slot of the
// whole context each. A full block can be published under a hash of its tokens and of all the
// tokens before it (chained through its parent's hash); a later sequence whose prompt starts the
// same way takes the published blocks instead of computing them again (vLLM's automatic prefix
// caching). A published block nobody holds stays cached until the pool needs it: blocks never
// published are handed out first, then cached ones, least recently released first. Matches
// compare the stored tokens too, so a hash collision cannot hand out the wrong keys and values.
// With recording on, the pool also keeps what a cache-aware router needs to know (vLLM's KV
// events): the blocks published, and the published blocks evicted, in order.
// Thread-compatible (the scheduler's thread alone uses it); no model, no torch.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace sluice::llm {

// A change to the published blocks: blocks published (`hashes` in order, each the next one's
// parent; `tokens` theirs, block_size each), published blocks evicted, or every one dropped.
struct KvEvent {
  enum class Kind { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  std::vector<uint64_t> hashes;
  // kStored: the hash of the block before the first; none where the first starts its sequence.
  std::optional<uint64_t> parent;
  std::vector<int32_t> tokens;  // kStored.
  uint64_t adapter = 0;         // kStored: the LoRA adapter's id of the sequence; 0: none.
};

// A block just published, for the disk tier: where it is, and what it holds.
struct StoredBlock {
  int32_t id = -1;
  uint64_t hash = 0, parent = 0;
  std::vector<int32_t> tokens;
  uint64_t adapter = 0;  // The sequence's LoRA adapter (0: none).
};

class BlockPool {
 public:
  static constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;  // The parent of a first block.

  BlockPool(int blocks, int block_size);  // Both >= 1.
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int blocks() const { return static_cast<int>(refs_.size()); }
  int block_size() const { return block_size_; }
  // Blocks Allocate() can hand out now: never published, or cached and held by no one.
  int available() const { return static_cast<int>(unused_.size() + evictable_.size()); }
  int held() const { return blocks() - available(); }  // Blocks with at least one holder.
  int published() const { return static_cast<int>(by_hash_.size()); }

  // The hash of a full block of `tokens` (block_size of them) after the block hashed `parent`.
  uint64_t Hash(uint64_t parent, const int32_t* tokens) const;

  // The published blocks that hold the longest prefix of `tokens` in whole blocks, at most
  // `max_blocks` of them, in order; one reference is taken on each. `root`: the parent of the
  // first block (kRootHash, or a salted root where the same tokens give other keys and values).
  std::vector<int32_t> Match(const std::vector<int32_t>& tokens, int max_blocks,
                             uint64_t root = kRootHash);
  // The root of sequences whose cache differs from the plain model's (a LoRA adapter's): 0 gives
  // kRootHash.
  static uint64_t SaltedRoot(uint64_t salt);
  // Appends `n` blocks no one holds to `out`, one reference each, reusing cached blocks (which
  // stop being published) only when unpublished ones run out. False, and nothing taken, when
  // fewer than `n` are available.
  bool Allocate(int n, std::vector<int32_t>* out);
  // As Allocate(), but `n` blocks with consecutive ids (a sequence whose blocks are consecutive is
  // read in place; else its rows are gathered every step): the lowest run of blocks no one holds
  // that evicts no cached block, else the run whose most recently released cached block was
  // released longest ago. False, and nothing taken, when there is none.
  bool AllocateRun(int n, std::vector<int32_t>* out);
  // Block `id` (held) now holds the full block `tokens` (block_size of them) after the block
  // hashed `parent`: later Match() calls can take it. Returns its hash (the next block's parent).
  // Where another block already holds the same hash, `id` stays unpublished. `first`: the block
  // starts its sequence (`parent` is a root); `adapter`: the sequence's LoRA adapter (events).
  uint64_t Publish(int32_t id, uint64_t parent, const int32_t* tokens, bool first = false,
                   uint64_t adapter = 0);
  // Drops one reference on each of `ids`; a block no one holds becomes available (and stays
  // cached if it is published).
  void Release(const std::vector<int32_t>& ids);

  // Records KvEvents from now on (off: none, and those recorded are dropped).
  void RecordEvents(bool on);
  // The events recorded since the last call, oldest first; consecutive blocks of one chain are
  // one kStored event, consecutive evictions one kRemoved.
  std::vector<KvEvent> TakeEvents();

  // Keeps the blocks published from now on (off: none, and those kept are dropped).
  void RecordStored(bool on);
  std::vector<StoredBlock> TakeStored();  // Those since the last call, oldest first.

  int refs(int32_t id) const { return refs_[static_cast<size_t>(id)]; }
  bool is_published(int32_t id) const { return published_[static_cast<size_t>(id)]; }
  // Every count and list agree (for tests); else `why` says what does not.
  bool Consistent(std::string* why) const;

 private:
  void Unpublish(int32_t id);

  const int block_size_;
  std::vector<int> refs_;
  std::vector<bool> published_;
  std::vector<uint64_t> hash_, parent_;       // Of published blocks.
  std::vector<std::vector<int32_t>> tokens_;  // Of published blocks.
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<int32_t> unused_;                      // Never published and held by no one.
  std::list<int32_t> evictable_;                     // Published, held by no one; oldest first.
  std::vector<std::list<int32_t>::iterator> where_;  // A block's place in evictable_.
  std::vector<bool> in_evictable_;
  std::vector<uint64_t> released_;  // When each evictable block was last released (releases_).
  uint64_t releases_ = 0;
  bool recording_ = false;
  std::vector<KvEvent> events_;
  bool recording_stored_ = false;
  std::vector<StoredBlock> stored_;
};

}  // namespace sluice::llm
