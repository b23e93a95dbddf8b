// The reasoning and the answer of a thinking model's reply, however the text is cut into pieces.
#include "llm/text/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::llm {
namespace {

// Every way of cutting `text` into pieces of `size` characters gives the same split.
ReasoningSplitter::Pieces Split(const std::string& text, bool in_reasoning, size_t size) {
  ReasoningSplitter splitter(in_reasoning);
  ReasoningSplitter::Pieces all;
  for (size_t i = 0; i < text.size(); i += size) {
    auto pieces = splitter.Add(std::string_view(text).substr(i, size));
    all.reasoning += pieces.reasoning;
    all.content += pieces.content;
  }
  auto rest = splitter.Finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  return all;
}

TEST(ReasoningSplitterTest, SplitsAtTheTagsWhateverThePieces) {
  struct Case {
    std::string text;
    bool in_reasoning;
    std::string reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>\nadd 2 and 2\n</think>\n\nIt is 4.", false, "\nadd 2 and 2\n", "It is 4."},
      {"add 2 and 2</think>\n\nIt is 4.", true, "add 2 and 2", "It is 4."},
      {"It is 4.", false, "", "It is 4."},
      {"  It is <4>.", false, "", "  It is <4>."},
      {"<thinking is fun", false, "", "<thinking is fun"},
      {"still thinking </thin", true, "still thinking </thin", ""},
      {"a < b </think>", true, "a < b ", ""},
      {"<think>x</think>", false, "x", ""},
      {"", true, "", ""},
  };
  for (const Case& c : cases) {
    for (size_t size : {1, 2, 3, 7, 100}) {
      const auto pieces = Split(c.text, c.in_reasoning, size);
      EXPECT_EQ(pieces.reasoning, c.reasoning) << c.text << " in pieces of " << size;
      EXPECT_EQ(pieces.content, c.content) << c.text << " in pieces of " << size;
    }
  }
}

TEST(ReasoningSplitterTest, TextIsGivenAsSoonAsItIsSettled) {
  ReasoningSplitter splitter(/*in_reasoning=*/true);
  EXPECT_EQ(splitter.Add("first, ").reasoning, "first, ");
  auto held = splitter.Add("then </th");
  EXPECT_EQ(held.reasoning, "then ");  // "</th" may be the tag.
  auto closed = splitter.Add("ink>\n\nDone");
  EXPECT_EQ(closed.reasoning, "");
  EXPECT_EQ(closed.content, "Done");
}

TEST(ReasoningSplitterTest, APromptOpensThinkingWhenItEndsInTheTag) {
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptOpensThinking("<think>"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace sluice::llm
