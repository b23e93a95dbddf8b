// A reader for the safetensors format (an 8-byte header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data), mapped into memory read-only.
// No torch here: the model wraps the mapped bytes in tensors without copying them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

struct SafetensorsEntry {
  std::string dtype;           // As written: "F32", "BF16", "F16", "I8", "I64", ...
  std::vector<int64_t> shape;  // Row-major.
  const void* data = nullptr;  // Inside the mapping; valid while the file object lives.
  size_t bytes = 0;
};

// Immutable after Open(); thread-safe to read.
class SafetensorsFile {
 public:
  // Maps `path` and validates the header: every tensor's range lies inside the data section,
  // matches its dtype and shape, and no two ranges overlap.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // A Hugging Face checkpoint's weights in `dir`: model.safetensors, or the shards a sharded
  // checkpoint's model.safetensors.index.json maps its tensors to (every shard mapped, each
  // tensor found in the shard the index names); a missing shard, or a tensor missing from its
  // shard, is an error naming it.
  static Result<std::unique_ptr<SafetensorsFile>> OpenCheckpoint(const std::string& dir);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr when absent.
  const SafetensorsEntry* Find(const std::string& name) const;
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Bytes per element of a safetensors dtype; 0 when unknown.
  static size_t DtypeSize(const std::string& dtype);

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;  // A sharded checkpoint's files.
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace sluice::llm
