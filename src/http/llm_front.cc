#include "http/llm_front.h"

#include <fmt/format.h>

#include "service/v2_service.h"

namespace sluice {

std::string SystemFingerprint(const llm::LlmEngine& engine) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a.
  for (const std::string& part :
       {std::string(kServerVersion), engine.model().weight_formats(), engine.model().kernel_paths(),
        engine.model().kv_cache_format()}) {
    for (const char c : part + '\0') {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ull;
    }
  }
  return fmt::format("fp_{:012x}", hash & 0xffffffffffffull);
}

}  // namespace sluice
