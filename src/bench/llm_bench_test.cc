#include "bench/llm_bench.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace sluice {
namespace {

TEST(SseReader, ReturnsDataLinesSplitAnywhere) {
  SseReader reader;
  const std::string stream =
      "data: {\"a\":1}\n\n: a comment\r\ndata:{\"b\":2}\r\n\nevent: x\ndata: [DONE]\n\n";
  std::vector<std::string> got;
  // One byte at a time: every split point.
  for (char c : stream) {
    for (std::string& d : reader.Feed(std::string_view(&c, 1))) got.push_back(std::move(d));
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "{\"a\":1}");
  EXPECT_EQ(got[1], "{\"b\":2}");
  EXPECT_EQ(got[2], "[DONE]");
  EXPECT_TRUE(reader.Feed("data: partial").empty());
  EXPECT_EQ(reader.Feed("\n"), std::vector<std::string>{"partial"});
}

TEST(ParseStreamChunk, TextDeltaUsageDoneAndErrors) {
  EXPECT_TRUE(ParseStreamChunk("[DONE]").done);
  EXPECT_TRUE(ParseStreamChunk(R"({"choices":[{"index":0,"text":"Hi"}]})").has_text);
  EXPECT_EQ(ParseStreamChunk(R"({"choices":[{"index":0,"text":"Hi"}]})").text, "Hi");
  EXPECT_EQ(ParseStreamChunk(R"({"choices":[{"delta":{"content":" x"}}]})").text, " x");
  EXPECT_FALSE(ParseStreamChunk(R"({"choices":[{"index":0,"text":""}]})").has_text);
  EXPECT_TRUE(ParseStreamChunk(R"({"choices":[{"delta":{"content":" x"}}]})").has_text);
  EXPECT_FALSE(ParseStreamChunk(R"({"choices":[{"delta":{"role":"assistant"}}]})").has_text);
  const StreamChunk usage =
      ParseStreamChunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34}})");
  EXPECT_FALSE(usage.has_text);
  EXPECT_EQ(usage.prompt_tokens, 12);
  EXPECT_EQ(usage.completion_tokens, 34);
  EXPECT_EQ(ParseStreamChunk(R"({"choices":[{"text":"a"}],"usage":null})").prompt_tokens, -1);
  EXPECT_EQ(ParseStreamChunk(R"({"error":{"message":"slot lost"}})").error, "slot lost");
  EXPECT_NE(ParseStreamChunk("{not json").error, "");
}

LlmRequestRecord Record(double sent, std::vector<double> chunks, int prompt, int completion) {
  LlmRequestRecord r;
  r.sent = sent;
  r.first_token = chunks.empty() ? -1 : chunks.front();
  r.chunk_times = std::move(chunks);
  r.done = r.chunk_times.empty() ? sent : r.chunk_times.back() + 0.001;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  r.ok = true;
  return r;
}

// vLLM's definitions, by hand: TTFT to the first text chunk, TPOT over the tokens after the first,
// ITL between chunks, output tokens/s over the level's span.
TEST(SummarizeLlmLevel, VllmDefinitions) {
  std::vector<LlmRequestRecord> records;
  records.push_back(Record(0.0, {0.100, 0.110, 0.120, 0.130}, 10, 4));  // TTFT 100 ms.
  records.push_back(Record(0.5, {0.800, 0.850}, 20, 3));  // TTFT 300 ms; 3 tokens, 2 chunks.
  LlmRequestRecord failed;
  failed.sent = 0.2;
  failed.done = 0.3;
  failed.error = "HTTP 503: full";
  records.push_back(failed);
  const LlmLevelSummary s = SummarizeLlmLevel(records);
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.ok, 2);
  ASSERT_EQ(s.first_errors.size(), 1u);
  EXPECT_EQ(s.first_errors[0], "HTTP 503: full");
  EXPECT_EQ(s.prompt_tokens, 30);
  EXPECT_EQ(s.completion_tokens, 7);
  EXPECT_NEAR(s.duration, 0.851, 1e-9);
  EXPECT_NEAR(s.output_tokens_per_second, 7 / 0.851, 1e-9);
  EXPECT_NEAR(s.total_tokens_per_second, 37 / 0.851, 1e-9);
  EXPECT_NEAR(s.ttft.mean, 200, 1e-6);
  EXPECT_NEAR(s.ttft.median, 100, 1e-6);  // Nearest rank of two: the lower.
  EXPECT_NEAR(s.ttft.p99, 300, 1e-6);
  // TPOT: (0.131 - 0.100) / 3 and (0.851 - 0.800) / 2.
  EXPECT_NEAR(s.tpot.mean, (31.0 / 3 + 51.0 / 2) / 2, 1e-6);
  // ITL: 10, 10, 10 ms and 50 ms.
  EXPECT_NEAR(s.itl.median, 10, 1e-6);
  EXPECT_NEAR(s.itl.p99, 50, 1e-6);
  EXPECT_NEAR(s.e2el.median, 131, 1e-6);
}

TEST(MakeLlmPrompts, FixedBySeedDistinctAndSized) {
  const auto a = MakeLlmPrompts(5, 40, 7), b = MakeLlmPrompts(5, 40, 7);
  EXPECT_EQ(a, b);
  EXPECT_NE(MakeLlmPrompts(1, 40, 8)[0], a[0]);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = i + 1; j < a.size(); ++j) EXPECT_NE(a[i].substr(0, 12), a[j].substr(0, 12));
    // "Request N:" then 40 words.
    EXPECT_EQ(std::count(a[i].begin(), a[i].end(), ' '), 41) << a[i];
  }
}

TEST(MakeLlmPrompts, ASharedPreambleOpensEveryPromptOfEverySeed) {
  const auto a = MakeLlmPrompts(4, 40, 7, 25), b = MakeLlmPrompts(2, 40, 9, 25);
  const std::string preamble = a[0].substr(0, a[0].find('\n') + 1);
  EXPECT_EQ(std::count(preamble.begin(), preamble.end(), ' '), 24) << preamble;
  for (const auto& prompts : {a, b}) {
    for (const std::string& p : prompts) {
      EXPECT_EQ(p.substr(0, preamble.size()), preamble);
      // The preamble's 25 words, then "Request N:" and the other 15.
      EXPECT_EQ(std::count(p.begin(), p.end(), ' '), 24 + 16) << p;
    }
  }
  EXPECT_NE(a[0].substr(preamble.size(), 12), a[1].substr(preamble.size(), 12));
  EXPECT_EQ(MakeLlmPrompts(3, 40, 7, 0), MakeLlmPrompts(3, 40, 7)) << "no preamble: as before";
}

TEST(PrefixCacheCounters, SluiceAndVllmNamesSummedOverLabels) {
  const auto sluice = PrefixCacheCounters(
      "# HELP sluice_llm_prefix_cache_hits_total x\n"
      "sluice_llm_prefix_cache_queries_total{model=\"a\"} 100\n"
      "sluice_llm_prefix_cache_queries_total{model=\"b\"} 50\n"
      "sluice_llm_prefix_cache_hits_total{model=\"a\"} 30\n"
      "sluice_llm_generated_tokens_total{model=\"a\"} 999\n");
  ASSERT_TRUE(sluice.has_value());
  EXPECT_DOUBLE_EQ(sluice->first, 150);
  EXPECT_DOUBLE_EQ(sluice->second, 30);
  const auto vllm = PrefixCacheCounters(
      "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 2.0e3\n"
      "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 1.5e3\n");
  ASSERT_TRUE(vllm.has_value());
  EXPECT_DOUBLE_EQ(vllm->first, 2000);
  EXPECT_DOUBLE_EQ(vllm->second, 1500);
  EXPECT_FALSE(PrefixCacheCounters("llamacpp:prompt_tokens_total 5\n").has_value());
}

}  // namespace
}  // namespace sluice
