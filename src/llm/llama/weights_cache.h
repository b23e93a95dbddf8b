// A GGUF file's repacked weights kept in a file of their own (llm.weights_cache), so that a later
// load maps them instead of repacking (start-up reads the file, with no work on it) and every
// process serving the same GGUF file maps the same pages: its weights are in memory once, however
// many servers use them.
//
// The file, <dir>/<GGUF file's stem>-<16 hex digits>.repacked, is named and headed by the GGUF
// file's identity (its path, size, modification time, inode and device) and the layout's version:
// a changed GGUF file or a new layout gets a new file, never a stale one. It is written whole
// under a temporary name and renamed into place, so a reader sees a complete file or none; two
// servers that load at once each write one and the last rename wins (both stay valid: each
// maps what it wrote). Every step reads all the weights, so they should sit in 2 MiB pages as the
// private copies do (llm/huge_pages.h): the file is written 2 MiB a write and mapped at a 2 MiB
// boundary, advised for huge pages before it is read, which the kernel maps as huge pages where
// the page cache holds 2 MiB folios (ext4 on recent kernels; a tmpfs mounted with huge=). Where
// it does not (ext4 on Linux 6.1), the mapping is in 4 KiB pages and decoding slows (26% on a 1B
// model); a folder on a tmpfs mounted huge=within_size avoids that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "llm/files/gguf.h"
#include "sluice/status.h"

namespace sluice::llm::llama {

// Not thread-safe: one load uses it. The mapping it hands out is read-only and lives while any
// owner() copy does, so the weights viewing it may be read from any thread.
class WeightsCache {
 public:
  // Bumped whenever RepackQuant's layout or this file's changes.
  static constexpr uint32_t kVersion = 2;

  // The cache of `file` in `dir`: mapped when a valid one is there; otherwise empty (a file that
  // is there but not valid, truncated or of another identity, is ignored and later replaced).
  // Errors: `file`'s identity cannot be read.
  static Result<std::unique_ptr<WeightsCache>> Open(const std::string& dir, const GgufFile& file);
  ~WeightsCache();
  WeightsCache(const WeightsCache&) = delete;
  WeightsCache& operator=(const WeightsCache&) = delete;

  const std::string& path() const { return path_; }
  bool mapped() const { return base_ != nullptr; }
  // A tensor's repacked bytes in the mapping: nullptr when it is not there or was stored with
  // another type, row count or size.
  const uint8_t* Find(std::string_view name, uint32_t type, int64_t rows, int64_t bytes) const;
  // Keeps the mapping alive while a copy lives (tensors viewing it hold one).
  std::shared_ptr<void> owner() const { return owner_; }

  struct Tensor {
    std::string name;  // At most 63 bytes (GGUF's own bound).
    uint32_t type = 0;
    int64_t rows = 0;
    const void* data = nullptr;  // `bytes` of RepackQuant's layout.
    int64_t bytes = 0;
  };
  // Writes `tensors` as this cache's file (replacing any there) and maps it. Errors name the file.
  Status Write(const std::vector<Tensor>& tensors);

 private:
  struct Entry {
    std::string name;
    uint32_t type = 0;
    int64_t rows = 0, offset = 0, bytes = 0;
  };
  WeightsCache() = default;
  // Maps path_ when it is a valid cache of identity_; false (and nothing mapped) otherwise.
  bool Map();

  std::string path_;
  std::vector<uint64_t> identity_;  // Size, mtime (ns), inode, device.
  const uint8_t* base_ = nullptr;
  std::shared_ptr<void> owner_;  // Unmaps.
  std::vector<Entry> entries_;
};

}  // namespace sluice::llm::llama
