// config.yaml and sweep files: parse, normalise and validate arbitrary YAML.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "config/model_config.h"
#include "config/sweep_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = sluice::ParseModelConfig(text, "config.yaml");
  if (config.ok()) {
    sluice::NormalizeModelConfig(*config, 4);
    (void)sluice::ValidateModelConfig(*config, 4, "config.yaml");
  } else if (config.status().message().empty()) {
    std::abort();
  }
  (void)sluice::ParseSweepConfig(text, "sweep.yaml");
  return 0;
}
