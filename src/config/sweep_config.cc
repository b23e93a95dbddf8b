// Sweep files.
#include "config/sweep_config.h"

#include <fstream>
#include <sstream>

#include "config/yaml_reader.h"

namespace sluice {

using config_internal::ConfigError;
using config_internal::MapReader;
using config_internal::ReadList;

Result<SweepFileConfig> ParseSweepConfig(std::string_view yaml_text, std::string_view source) {
  try {
    YAML::Node root = YAML::Load(std::string(yaml_text));
    SweepFileConfig c;
    if (!root.IsDefined() || root.IsNull()) return c;
    MapReader r(root, "");
    auto read = [&](const char* key, auto& field) {
      typename std::remove_reference_t<decltype(field)>::value_type value{};
      YAML::Node n = r.Get(key);
      if (!n.IsDefined() || n.IsNull()) return;
      r.Read(key, value);
      field = value;
    };
    read("model", c.model);
    read("model_repository", c.model_repository);
    read("iterations", c.iterations);
    read("workers", c.workers);
    read("threads", c.threads);
    read("results_dir", c.results_dir);
    if (YAML::Node n = r.Get("batch_sizes"); n.IsDefined()) {
      c.batch_sizes = ReadList<int>(n, "batch_sizes");
    }
    if (YAML::Node n = r.Get("compile"); n.IsDefined()) c.compile = ReadList<bool>(n, "compile");
    if (YAML::Node n = r.Get("backends"); n.IsDefined()) {
      std::vector<BackendVariant> backends;
      std::vector<std::string> names = ReadList<std::string>(n, "backends");
      for (size_t i = 0; i < names.size(); ++i) {
        auto b = ParseBackendVariant(names[i]);
        if (!b) {
          throw ConfigError{fmt::format("backends[{}]", i),
                            fmt::format("must be torchscript, torchscript+freeze or aotinductor "
                                        "(got '{}')",
                                        names[i])};
        }
        backends.push_back(*b);
      }
      c.backends = backends;
    }
    if (YAML::Node n = r.Get("precisions"); n.IsDefined()) {
      std::vector<Precision> precisions;
      std::vector<std::string> names = ReadList<std::string>(n, "precisions");
      for (size_t i = 0; i < names.size(); ++i) {
        auto p = ParsePrecision(names[i]);
        if (!p) {
          throw ConfigError{fmt::format("precisions[{}]", i),
                            fmt::format("must be fp32, bf16, fp16 or int8 (got '{}')", names[i])};
        }
        precisions.push_back(*p);
      }
      c.precisions = precisions;
    }
    r.RejectUnknownKeys();
    return c;
  } catch (const ConfigError& e) {
    return Status::InvalidArgument(fmt::format("{}: {}: {}", source, e.key, e.message));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("{}:{}:{}: invalid YAML: {}", source,
                                               e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

Result<SweepFileConfig> LoadSweepConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseSweepConfig(text.str(), path);
}

}  // namespace sluice
