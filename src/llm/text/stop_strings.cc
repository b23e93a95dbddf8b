#include "llm/text/stop_strings.h"

#include <algorithm>

namespace sluice::llm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

StopStringMatcher::Released StopStringMatcher::Add(std::string_view text) {
  Released out;
  if (stopped_) return out;
  held_ += text;
  // The earliest stop string ends the text before it.
  size_t stop_at = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at < stop_at) {
      stop_at = at;
      out.stop = stop;
    }
  }
  if (stop_at != std::string::npos) {
    out.text = held_.substr(0, stop_at);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest tail that could begin a stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > hold; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string rest = std::move(held_);
  held_.clear();
  return rest;
}

}  // namespace sluice::llm
