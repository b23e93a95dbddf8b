// The prefix cache's disk tier (llm.kv_cache_disk): full KV blocks kept in files, so a prefix
// computed once is read back instead of computed again, after its blocks left memory and after
// the server restarts.
//
// A block is one file, <dir>/<layout>/<block hash, 16 hex digits>.kv: a header (magic, the
// block's hash and its parent's, its token count and data size, a checksum over tokens and data),
// the block's tokens, then its keys and values as the model lays them out. <layout> is a digest
// of what makes the bytes valid: the model's weight files (sampled content and sizes), the
// precision, the cache's element type and shape, the block size; another model or layout gets
// another folder, never these files. Files are written whole under a temporary name and renamed
// into place (a reader sees a whole file or none). A file whose header, size or checksum does not
// hold is deleted when found, never served. The folder's bytes are bounded: past the bound the
// least recently used files go (recency survives a restart through the files' times).
//
// Thread-safe. Put() only queues: a thread of the store's own writes, so a step never waits on
// the disk; Get() reads in the caller's thread (the engine's, while it plans a step).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "sluice/status.h"

namespace sluice::llm {

struct DiskBlock {
  uint64_t parent = 0;
  std::vector<int32_t> tokens;
  std::shared_ptr<const std::string> data;  // The block's keys and values.
};

class KvDiskStore {
 public:
  // The tier for one layout in `dir` (created where missing): existing files are indexed by
  // their headers, damaged ones deleted. `layout`: what the files' bytes depend on (its digest
  // names the folder, and it is written beside the files for people). kInvalidArgument naming a
  // folder that cannot be made.
  static Result<std::shared_ptr<KvDiskStore>> Open(const std::string& dir,
                                                   const std::string& layout, int64_t max_bytes);
  ~KvDiskStore();  // Writes what is queued, then stops.
  KvDiskStore(const KvDiskStore&) = delete;
  KvDiskStore& operator=(const KvDiskStore&) = delete;

  bool Contains(uint64_t hash) const;
  // The block, read and checked; nullopt when it is not stored, or its file is damaged (then
  // deleted).
  std::optional<DiskBlock> Get(uint64_t hash);
  // Queues the block for writing (dropped where it is stored or queued already, or when the
  // queue holds max_queue blocks: the tier is a cache).
  void Put(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens, std::string data);
  // Waits until the queue is written (tests; the destructor).
  void Flush();

  const std::string& folder() const { return folder_; }
  int64_t bytes() const;
  int64_t blocks() const;
  int64_t hits() const;       // Get()s answered.
  int64_t discarded() const;  // Damaged files deleted.

  // A digest of weight files: their sizes and 64 KiB at 64 places spread over each (a changed
  // file, another fine-tune of the same shape, differs there), as 16 hex digits.
  static std::string FilesDigest(const std::vector<std::string>& files);

 private:
  struct Entry {
    int64_t size = 0;
    std::list<uint64_t>::iterator lru;  // In lru_, most recently used last.
  };
  struct Pending {
    uint64_t hash, parent;
    std::vector<int32_t> tokens;
    std::string data;
  };

  KvDiskStore(std::string folder, int64_t max_bytes);
  std::string PathOf(uint64_t hash) const;
  void Index();  // At Open.
  void Run();    // The writer.
  bool Write(const Pending& block);
  // Drops `hash` from the index (and its file); mu_ held.
  void Forget(uint64_t hash) REQUIRES(mu_);
  void Trim() REQUIRES(mu_);  // Least recently used files out while over max_bytes_.

  const std::string folder_;
  const int64_t max_bytes_;
  static constexpr size_t kMaxQueue = 4096;

  mutable Mutex mu_;
  CondVar wake_, written_;
  std::unordered_map<uint64_t, Entry> index_ GUARDED_BY(mu_);
  std::list<uint64_t> lru_ GUARDED_BY(mu_);
  int64_t bytes_ GUARDED_BY(mu_) = 0;
  int64_t hits_ GUARDED_BY(mu_) = 0;
  int64_t discarded_ GUARDED_BY(mu_) = 0;
  std::deque<Pending> queue_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, bool> queued_ GUARDED_BY(mu_);
  bool writing_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread writer_;
};

}  // namespace sluice::llm
