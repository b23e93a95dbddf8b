// HugePageArena: mappings aligned to 2 MiB and advised for transparent huge pages.
#include "llm/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

namespace sluice::llm {

struct HugePageArena::Mapping {
  void* base = nullptr;  // What mmap returned, and its length (both for munmap).
  size_t length = 0;
  uint8_t* aligned = nullptr;  // The first 2 MiB boundary in it.
  int64_t bytes = 0;           // Usable from `aligned`.
  ~Mapping() {
    if (base != nullptr) munmap(base, length);
  }
};

std::shared_ptr<HugePageArena::Mapping> HugePageArena::Map(int64_t bytes) {
  const int64_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // One huge page more than asked, so that a 2 MiB boundary lies inside with `rounded` after it.
  const auto length = static_cast<size_t>(rounded + kHugePage);
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  auto mapping = std::make_shared<Mapping>();
  mapping->base = base;
  mapping->length = length;
  const auto start = reinterpret_cast<uintptr_t>(base);
  const auto huge = static_cast<uintptr_t>(kHugePage);
  mapping->aligned = reinterpret_cast<uint8_t*>((start + huge - 1) & ~(huge - 1));
  mapping->bytes = rounded;
  // Advice only: without transparent huge pages the memory is still there, in small pages.
  madvise(mapping->aligned, static_cast<size_t>(rounded), MADV_HUGEPAGE);
  return mapping;
}

HugePageBlock HugePageArena::Allocate(int64_t bytes) {
  const int64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded > chunk_bytes_ / 4) {
    std::shared_ptr<Mapping> own = Map(rounded);
    if (own == nullptr) return {};
    uint8_t* data = own->aligned;
    return {data, std::move(own)};
  }
  MutexLock lock(mu_);
  std::shared_ptr<Mapping> chunk = current_.lock();
  if (chunk == nullptr || used_ + rounded > chunk->bytes) {
    chunk = Map(chunk_bytes_);
    if (chunk == nullptr) return {};
    current_ = chunk;
    used_ = 0;
  }
  uint8_t* data = chunk->aligned + used_;
  used_ += rounded;
  // Released, a block gives back its whole pages at once (blocks are never reused, and a
  // chunk lives while any block of it does: a reloaded model's weights would otherwise stay
  // resident beside the new ones).
  std::shared_ptr<void> owner(data, [chunk = std::move(chunk), rounded](void* p) {
    // Not advised for huge pages any more: khugepaged would fill the hole back in.
    ReleasePages(p, rounded, /*no_huge_pages=*/true);
  });
  return {data, std::move(owner)};
}

void ReleasePages(const void* data, int64_t bytes, bool no_huge_pages) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end =
      (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) & ~(page - 1);
  if (end <= begin) return;
  if (no_huge_pages) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_NOHUGEPAGE);
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

HugePageArena& HugePageArena::Shared() {
  static HugePageArena arena;
  return arena;
}

}  // namespace sluice::llm
