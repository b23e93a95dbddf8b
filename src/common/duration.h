// Durations as people write them in configs and request bodies.
#pragma once

#include <chrono>
#include <string_view>

#include "sluice/status.h"

namespace sluice {

// A Go-style duration ("10m", "1h30m", "45s", "500ms", "1.5h", "-1m"; units h, m, s, ms, us, ns)
// or a bare number of seconds ("300", "-1"), as Ollama reads keep_alive; rounded to
// milliseconds, and negative where written so. kInvalidArgument naming what is wrong.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

}  // namespace sluice
