// Log-probabilities against a double-precision log-softmax, and the sampler's greedy choice.
#include "llm/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace sluice::llm {
namespace {

TEST(LogProbabilitiesTest, EqualALogSoftmaxOfTheRawLogits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 4);
  const int vocab = 1000;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  logits[17] = logits[18] = 30;  // A tie at the top: the lower id first.
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - 30);
  auto reference = [&](int id) { return static_cast<double>(logits[id]) - 30 - std::log(sum); };
  const TokenLogprobs out = LogProbabilities(logits.data(), vocab, 500, 5);
  EXPECT_EQ(out.chosen.token, 500);
  EXPECT_NEAR(out.chosen.logprob, reference(500), 1e-4);
  ASSERT_EQ(out.top.size(), 5u);
  EXPECT_EQ(out.top[0].token, 17);
  EXPECT_EQ(out.top[1].token, 18);
  for (size_t i = 0; i < out.top.size(); ++i) {
    EXPECT_NEAR(out.top[i].logprob, reference(out.top[i].token), 1e-4);
    if (i > 0) {
      EXPECT_GE(out.top[i - 1].logprob, out.top[i].logprob);
    }
  }
  // No logit outside the top five is higher than the fifth.
  for (int id = 0; id < vocab; ++id) {
    bool in_top = false;
    for (const TokenLogprob& t : out.top) in_top |= t.token == id;
    if (!in_top) {
      EXPECT_LE(logits[id], logits[out.top[4].token]) << id;
    }
  }
  EXPECT_TRUE(LogProbabilities(logits.data(), vocab, 3, 0).top.empty());
}

// PenaltyEdits are the edits Next makes to a row: applied to a copy in their order (repeated
// tokens divided by the penalty, or multiplied where negative; then the counted tokens less
// their amounts), the copy equals the row Next left, bit for bit, after tokens Record counted
// as Next would have.
TEST(SamplerTest, PenaltyEditsAreWhatNextDoesToTheRow) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 3);
  const int vocab = 300;
  SamplingParams params;
  params.temperature = 0.9;
  params.seed = 3;
  params.repetition_penalty = 1.3;
  params.frequency_penalty = 0.4;
  params.presence_penalty = 0.25;
  const std::vector<int32_t> prompt = {4, 9, 9, 250, 400};  // 400: past the vocabulary.
  Sampler sampler(params, prompt), twin(params, prompt);
  for (const int32_t token : {9, 17, 17, 120}) {
    sampler.Record(token);
    twin.Record(token);
  }
  std::vector<float> row(vocab);
  for (float& x : row) x = normal(rng);
  row[9] = -2.0f;  // A negative repeated logit: multiplied.
  std::vector<int32_t> repeated, counted;
  std::vector<float> amounts;
  twin.PenaltyEdits(&repeated, &counted, &amounts);
  EXPECT_EQ(repeated.size(), 6u);  // 4, 9, 250, 400 and the generated 17, 120.
  EXPECT_EQ(counted.size(), 3u);   // 9, 17, 120.
  std::vector<float> edited = row;
  for (const int32_t t : repeated) {
    if (t >= vocab) continue;
    float& x = edited[static_cast<size_t>(t)];
    x = x > 0 ? x / 1.3f : x * 1.3f;
  }
  for (size_t i = 0; i < counted.size(); ++i) edited[static_cast<size_t>(counted[i])] -= amounts[i];
  EXPECT_NE(edited, row);
  sampler.Next(row.data(), vocab);
  EXPECT_EQ(edited, row);
}

TEST(LogProbabilitiesTest, GreedyChoosesTheMostLikelyToken) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f};
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler(params, {});
  std::vector<float> row = logits;
  const int32_t token = sampler.Next(row.data(), 4);
  const TokenLogprobs out = LogProbabilities(logits.data(), 4, token, 2);
  EXPECT_EQ(token, 1);
  EXPECT_EQ(out.top[0].token, token);
  EXPECT_FLOAT_EQ(out.top[0].logprob, out.chosen.logprob);
  double total = 0;
  for (int id = 0; id < 4; ++id)
    total += std::exp(LogProbabilities(logits.data(), 4, id, 0).chosen.logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
}

}  // namespace
}  // namespace sluice::llm
