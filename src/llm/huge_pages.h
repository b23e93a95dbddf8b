// Memory for a model's weights and KV cache in 2 MiB pages, where the kernel gives them.
//
// Every decoding step streams through all of a model's weights (~100 MB for a 135M-parameter
// model in Q4_1): in 4 KiB pages that is a TLB miss every 4 KiB and a hardware prefetcher that
// stops at each page's end. Debian's kernels hand out transparent huge pages only where asked
// (transparent_hugepage "madvise"), so the memory comes from mappings aligned to 2 MiB and
// advised with MADV_HUGEPAGE. Where the kernel has none to give, the pages are ordinary ones.
#pragma once

#include <cstdint>
#include <memory>

#include "common/mutex.h"

namespace sluice::llm {

// A block of memory from HugePageArena: `data` stays valid while `owner` (or a copy) lives.
struct HugePageBlock {
  uint8_t* data = nullptr;
  std::shared_ptr<void> owner;
};

// Hands out blocks carved from large mappings advised for huge pages: small blocks share a
// mapping of `chunk_bytes`, a block of more than a quarter of that gets a mapping of its own. A
// released block gives back the pages it alone covers (its space is not handed out again); a
// mapping is unmapped when the last block carved from it is released. Thread-safe.
class HugePageArena {
 public:
  static constexpr int64_t kHugePage = int64_t{2} << 20;
  static constexpr int64_t kAlignment = 64;  // Of every block: a cache line.

  explicit HugePageArena(int64_t chunk_bytes = int64_t{64} << 20) : chunk_bytes_(chunk_bytes) {}

  // `bytes` (> 0) of uninitialised memory; data is null when the system has no memory to map.
  HugePageBlock Allocate(int64_t bytes);

  // The arena of a process's model weights and KV caches.
  static HugePageArena& Shared();

 private:
  struct Mapping;
  static std::shared_ptr<Mapping> Map(int64_t bytes);

  const int64_t chunk_bytes_;
  Mutex mu_;
  std::weak_ptr<Mapping> current_ GUARDED_BY(mu_);  // Alive while a block of it is.
  int64_t used_ GUARDED_BY(mu_) = 0;                // Bytes of `current_` handed out.
};

// Gives back the whole pages inside [data, data + bytes) (MADV_DONTNEED: private memory reads as
// zeros afterwards, a private file mapping reads the file again); with `no_huge_pages`, they are
// first advised against huge pages, so that khugepaged does not fill the hole back in.
void ReleasePages(const void* data, int64_t bytes, bool no_huge_pages = false);

}  // namespace sluice::llm
