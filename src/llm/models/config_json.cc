#include "llm/models/config_json.h"

#include <fmt/format.h>

namespace sluice::llm {

using simdjson::dom::element;

bool JsonConfig::Has(const char* key) const {
  element value;
  return object_[key].get(value) == simdjson::SUCCESS && !value.is_null();
}

Status JsonConfig::Bad(std::string_view key, std::string_view why) const {
  return Status::InvalidArgument(fmt::format("{}: '{}' {}", path_, key, why));
}

Result<int> JsonConfig::Int(const char* key, std::optional<int> fallback) const {
  element value;
  if (object_[key].get(value) != simdjson::SUCCESS || value.is_null()) {
    if (fallback) return *fallback;
    return Bad(key, "is missing");
  }
  int64_t number = 0;
  if (value.get(number) != simdjson::SUCCESS || number < 0 || number > (1 << 30)) {
    return Bad(key, "must be a non-negative integer");
  }
  return static_cast<int>(number);
}

Result<double> JsonConfig::Number(const char* key, double fallback) const {
  element value;
  if (object_[key].get(value) != simdjson::SUCCESS || value.is_null()) return fallback;
  double number = 0;
  if (value.get(number) == simdjson::SUCCESS) return number;
  int64_t integer = 0;
  if (value.get(integer) == simdjson::SUCCESS) return static_cast<double>(integer);
  return Bad(key, "must be a number");
}

Result<bool> JsonConfig::Bool(const char* key, bool fallback) const {
  element value;
  if (object_[key].get(value) != simdjson::SUCCESS || value.is_null()) return fallback;
  bool flag = false;
  if (value.get(flag) != simdjson::SUCCESS) return Bad(key, "must be true or false");
  return flag;
}

Result<std::string> JsonConfig::String(const char* key, const std::string& fallback) const {
  element value;
  if (object_[key].get(value) != simdjson::SUCCESS || value.is_null()) return fallback;
  std::string_view text;
  if (value.get(text) != simdjson::SUCCESS) return Bad(key, "must be a string");
  return std::string(text);
}

std::optional<JsonConfig> JsonConfig::Object(const char* key) const {
  element value;
  if (object_[key].get(value) != simdjson::SUCCESS || !value.is_object()) return std::nullopt;
  return JsonConfig(value, path_);
}

Result<std::vector<double>> JsonConfig::Numbers(const char* key) const {
  simdjson::dom::array list;
  if (object_[key].get(list) != simdjson::SUCCESS) return Bad(key, "must be a list of numbers");
  std::vector<double> out;
  for (element item : list) {
    double number = 0;
    int64_t integer = 0;
    if (item.get(number) == simdjson::SUCCESS) {
      out.push_back(number);
    } else if (item.get(integer) == simdjson::SUCCESS) {
      out.push_back(static_cast<double>(integer));
    } else {
      return Bad(key, "must be a list of numbers");
    }
  }
  return out;
}

}  // namespace sluice::llm
