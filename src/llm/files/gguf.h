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
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
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
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// True when `path` starts with GGUF's magic.
bool LooksLikeGguf(const std::string& path);

}  // namespace sluice::llm
