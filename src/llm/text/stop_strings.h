// Stop strings over a reply's text as it is generated: the text before the first stop string is
// kept, the stop string and all after it are not, and text that may be the start of one is held
// back until the next piece (or the end) settles it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sluice::llm {

// Not thread-safe: one per reply, fed from the one thread that sees its text.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Released {
    std::string text;      // What can be given out now.
    bool stopped = false;  // A stop string was found: `text` ends before it, and nothing follows.
    std::string stop;      // Which (the earliest found; the first listed of those at one place).
  };
  // Appends `text` (nothing after a stop).
  Released Add(std::string_view text);
  // The text held back, at the end of the reply.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace sluice::llm
