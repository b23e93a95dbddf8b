// A thinking model's reply split into its reasoning and its answer, as OpenAI-style servers give
// them (`reasoning_content` beside `content`): the text inside <think> ... </think> is reasoning,
// the rest the answer. Templates open the block in the prompt (DeepSeek-R1; Qwen3 with thinking
// on) or the model opens it itself; a closed block in the prompt (Qwen3 with enable_thinking
// false) leaves the whole reply an answer.
#pragma once

#include <string>
#include <string_view>

namespace sluice::llm {

// Whether a rendered prompt ends inside a thinking block the template opened: its last
// non-whitespace text is "<think>".
bool PromptOpensThinking(std::string_view prompt);

// Fed a reply's text as it is generated, gives back what can already be told apart; text that may
// be the start of a tag is held until the next piece (or Finish) settles it. The tags themselves
// are dropped, and so is the whitespace between </think> and the answer. Not thread-safe: one
// per reply, fed from the one thread that sees its text.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool in_reasoning)
      : state_(in_reasoning ? State::kReasoning : State::kStart) {}

  struct Pieces {
    std::string reasoning, content;
  };
  Pieces Add(std::string_view text);
  Pieces Finish();  // The text held back, as what it was.

 private:
  enum class State { kStart, kReasoning, kAfterReasoning, kContent };
  State state_;
  std::string held_;
};

}  // namespace sluice::llm
