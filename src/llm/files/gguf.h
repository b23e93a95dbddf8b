// A reader for GGUF, llama.cpp's model file: a header, typed key-value metadata (the architecture's
// hyperparameters, the tokenizer's vocabulary and merges, the chat template), tensor descriptions,
// then the tensors' data, aligned, in ggml's types (plain floats or quantised blocks). The file is
// mapped read-only and its tensors are read where they lie: nothing is converted on disk.
// No torch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/kernels/ggml_blocks.h"
#include "sluice/status.h"

namespace sluice::llm {

// One metadata value: a scalar, a string, or an array of one of them.
struct GgufValue {
  enum Kind { kInteger, kFloat, kBool, kString, kArray } kind = kInteger;
  int64_t integer = 0;  // Every integer type (uint64 above INT64_MAX is refused at load).
  double number = 0;    // float32, float64.
  bool boolean = false;
  std::string text;
  Kind element_kind = kInteger;  // Arrays: of integers, floats, bools or strings.
  std::vector<int64_t> integers;
  std::vector<double> numbers;
  std::vector<std::string> texts;
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;           // GgmlType; any value the file holds (checked by the reader).
  std::vector<int64_t> shape;  // Outermost first, as torch writes it: [rows, columns].
  const void* data = nullptr;  // Inside the mapping; valid while the file object lives.
  size_t bytes = 0;
  int64_t elements() const;
};

// Immutable after Open(); thread-safe to read.
class GgufFile {
 public:
  // Maps `path` and validates it: magic and version (2 or 3), every string and array inside the
  // file, each tensor of a known type with whole blocks a row, its data aligned and inside the
  // file, no two tensors overlapping. Errors name the file and what is wrong.
  // A split model (llama.cpp's gguf-split or its converter's --split-max-*: split.count parts
  // named <prefix>-00001-of-0000N.gguf) opens from its first part: every part is mapped and its
  // tensors listed here; the metadata is the first part's. A missing or foreign part is an error
  // naming it, and so is opening a later part.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // Every file the model is in: path() first, then a split model's later parts.
  std::vector<std::string> part_paths() const;
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensor* FindTensor(std::string_view name) const;
  const GgufValue* Find(std::string_view key) const;

  // Typed reads; an error names the key when it is absent or of another kind.
  Result<std::string> String(std::string_view key) const;
  Result<int64_t> Integer(std::string_view key) const;
  Result<double> Number(std::string_view key) const;  // Integers are accepted too.
  // With a default when the key is absent (still an error when present with another kind).
  Result<int64_t> Integer(std::string_view key, int64_t fallback) const;
  Result<double> Number(std::string_view key, double fallback) const;
  Result<bool> Bool(std::string_view key, bool fallback) const;
  Result<std::string> String(std::string_view key, const std::string& fallback) const;
  Result<const std::vector<std::string>*> Strings(std::string_view key) const;
  Result<const std::vector<int64_t>*> Integers(std::string_view key) const;
  Result<const std::vector<double>*> Numbers(std::string_view key) const;  // Float arrays.

 private:
  GgufFile() = default;
  static Result<std::unique_ptr<GgufFile>> OpenOne(const std::string& path);
  Status OpenLaterParts();
  std::string path_;
  std::vector<std::unique_ptr<GgufFile>> parts_;  // A split model's parts after the first.
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// True when `path` starts with GGUF's magic.
bool LooksLikeGguf(const std::string& path);

// A split model's part, as llama.cpp names them: "<prefix>-00002-of-00003.gguf" gives
// {prefix, 2, 3}; nullopt for any other name.
struct GgufSplitName {
  std::string prefix;
  int part = 0;
  int count = 0;
};
std::optional<GgufSplitName> ParseGgufSplitName(const std::string& path);
std::string GgufSplitPath(const std::string& prefix, int part, int count);

}  // namespace sluice::llm
