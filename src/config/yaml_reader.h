// Internal helpers for reading YAML configuration with precise error locations.
//
// MapReader walks one mapping, remembers the keys it was asked for, and reports any other key as
// unknown; every error carries the dotted key path ("instances.threads").
#pragma once

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::config_internal {

// Carries the first error out of the nested readers below.
struct ConfigError {
  std::string key;
  std::string message;
};

inline std::string Join(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

// Reads one YAML mapping, remembering which keys were used so leftovers can be reported.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {
    if (!node_.IsMap()) {
      throw ConfigError{path_.empty() ? "(top level)" : path_, "must be a mapping"};
    }
  }

  // Node for `key`, or an undefined node when absent.
  YAML::Node Get(const std::string& key) {
    used_.insert(key);
    return node_[key];
  }

  template <typename T>
  void Read(const std::string& key, T& out) {
    YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return;
    out = Convert<T>(n, Join(path_, key));
  }

  template <typename T>
  static T Convert(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) throw ConfigError{path, "must be a scalar value"};
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      throw ConfigError{path, fmt::format("cannot read '{}' as {}", n.Scalar(), TypeName<T>())};
    }
  }

  // Throws for any key that no Get()/Read() asked for.
  void RejectUnknownKeys() const {
    for (const auto& item : node_) {
      std::string key = item.first.as<std::string>();
      if (!used_.count(key)) throw ConfigError{Join(path_, key), "unknown key"};
    }
  }

  const std::string& path() const { return path_; }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean";
    if constexpr (std::is_integral_v<T>) return "an integer";
    if constexpr (std::is_floating_point_v<T>) return "a number";
    return "a string";
  }

  YAML::Node node_;  // A handle: copies share the document.
  std::string path_;
  std::set<std::string> used_;
};

template <typename T>
std::vector<T> ReadList(const YAML::Node& n, const std::string& path) {
  std::vector<T> out;
  if (!n.IsDefined() || n.IsNull()) return out;
  if (!n.IsSequence()) throw ConfigError{path, "must be a list"};
  for (size_t i = 0; i < n.size(); ++i) {
    out.push_back(MapReader::Convert<T>(n[i], fmt::format("{}[{}]", path, i)));
  }
  return out;
}

}  // namespace sluice::config_internal
