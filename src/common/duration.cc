#include "common/duration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

namespace sluice {

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is not a duration ({}; e.g. \"10m\", \"1h30m\", \"45s\" or a number of seconds)",
        text, why));
  };
  std::string_view rest = text;
  bool negative = false;
  if (!rest.empty() && (rest.front() == '-' || rest.front() == '+')) {
    negative = rest.front() == '-';
    rest.remove_prefix(1);
  }
  if (rest.empty()) return bad("it is empty");
  double milliseconds = 0;
  bool bare = true;  // A number with no unit: seconds.
  while (!rest.empty()) {
    double value = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec != std::errc() || end == rest.data() || !std::isfinite(value) || value < 0) {
      return bad("a number is expected");
    }
    rest.remove_prefix(static_cast<size_t>(end - rest.data()));
    size_t unit_length = 0;
    while (unit_length < rest.size() &&
           std::isalpha(static_cast<unsigned char>(rest[unit_length]))) {
      ++unit_length;
    }
    const std::string_view unit = rest.substr(0, unit_length);
    rest.remove_prefix(unit_length);
    double scale;
    if (unit.empty()) {
      if (!bare || !rest.empty()) return bad("every number but a lone one needs a unit");
      scale = 1000;
    } else if (unit == "h") {
      scale = 3600e3;
    } else if (unit == "m") {
      scale = 60e3;
    } else if (unit == "s") {
      scale = 1e3;
    } else if (unit == "ms") {
      scale = 1;
    } else if (unit == "us") {
      scale = 1e-3;
    } else if (unit == "ns") {
      scale = 1e-6;
    } else {
      return bad(fmt::format("unknown unit '{}'", unit));
    }
    bare = false;
    milliseconds += value * scale;
  }
  // Beyond ~292 years a count would overflow: kept as that much.
  milliseconds = std::min(std::round(milliseconds), 9.2e18);
  const auto count = static_cast<std::chrono::milliseconds::rep>(milliseconds);
  return std::chrono::milliseconds(negative ? -count : count);
}

}  // namespace sluice
