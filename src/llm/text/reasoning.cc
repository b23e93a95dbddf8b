#include "llm/text/reasoning.h"

#include <algorithm>

namespace sluice::llm {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view TrimLeft(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && IsSpace(text[i])) ++i;
  return text.substr(i);
}

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

bool PromptOpensThinking(std::string_view prompt) {
  while (!prompt.empty() && IsSpace(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kOpen);
}

ReasoningSplitter::Pieces ReasoningSplitter::Add(std::string_view text) {
  Pieces out;
  held_ += text;
  while (!held_.empty()) {
    switch (state_) {
      case State::kStart: {
        // Leading whitespace, then "<think>" or not.
        const std::string_view rest = TrimLeft(held_);
        if (rest.starts_with(kOpen)) {
          held_.erase(0, held_.size() - rest.size() + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (kOpen.starts_with(rest)) return out;  // Maybe the tag: wait (rest may be empty).
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          out.reasoning += held_.substr(0, close);
          held_.erase(0, close + kClose.size());
          state_ = State::kAfterReasoning;
          continue;
        }
        const size_t keep = PartialTag(held_, kClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::kAfterReasoning: {
        const std::string_view rest = TrimLeft(held_);
        if (rest.empty()) {
          held_.clear();
          return out;
        }
        held_.erase(0, held_.size() - rest.size());
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
  return out;
}

ReasoningSplitter::Pieces ReasoningSplitter::Finish() {
  Pieces out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(held_);
  } else if (state_ != State::kAfterReasoning) {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace sluice::llm
