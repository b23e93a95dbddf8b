// A Hugging Face config.json (or the nested text_config of a multimodal one) as typed fields,
// each error naming the file and the key. No torch here.
#pragma once

#include <simdjson.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

// Thread-compatible; refers to the parser's document, which must outlive it.
class JsonConfig {
 public:
  JsonConfig(simdjson::dom::element object, std::string path)
      : object_(object), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  simdjson::dom::element object() const { return object_; }
  // Whether `key` is present and not null.
  bool Has(const char* key) const;
  // A non-negative integer; `fallback` when absent or null (an error naming the key without one).
  Result<int> Int(const char* key, std::optional<int> fallback) const;
  Result<double> Number(const char* key, double fallback) const;
  Result<bool> Bool(const char* key, bool fallback) const;
  Result<std::string> String(const char* key, const std::string& fallback) const;
  // An object field as a config of its own (same file); nullopt when absent.
  std::optional<JsonConfig> Object(const char* key) const;
  // A list of numbers; an error when absent or of another kind.
  Result<std::vector<double>> Numbers(const char* key) const;
  // InvalidArgument "<path>: '<key>' <why>".
  Status Bad(std::string_view key, std::string_view why) const;

 private:
  simdjson::dom::element object_;
  std::string path_;
};

}  // namespace sluice::llm
