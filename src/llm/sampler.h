// Picks the next token from a row of logits: penalties (repetition as in transformers,
// frequency/presence as in OpenAI's API), then greedy, or temperature + top-k + top-p sampling
// from a seeded generator (the same seed gives the same tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

namespace sluice::llm {

struct SamplingParams {
  double temperature = 1.0;         // 0: greedy. >= 0.
  int top_k = 0;                    // Keep the k most likely; 0: all.
  double top_p = 1.0;               // Keep the smallest set with this much probability; (0, 1].
  std::optional<uint64_t> seed;     // None: a random seed.
  double repetition_penalty = 1.0;  // > 0; divides positive logits of seen tokens (prompt too).
  double frequency_penalty = 0.0;   // [-2, 2]; times the count of each generated token.
  double presence_penalty = 0.0;    // [-2, 2]; once for each generated token.
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;  // Natural log of the token's probability.
};
// A chosen token's log-probability and the `top` most likely tokens' (highest first).
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

// Log-probabilities under the model's own distribution: the log-softmax of the raw `logits`
// (before penalties and temperature, as vLLM reports them), ties in the top list by id.
TokenLogprobs LogProbabilities(const float* logits, int vocab, int32_t chosen, int top);

// Thread-compatible: one per sequence.
class Sampler {
 public:
  Sampler(const SamplingParams& params, const std::vector<int32_t>& prompt);
  // Chooses a token from `logits` (vocab floats, modified in place) and records it.
  int32_t Next(float* logits, int vocab);
  // The draw in [0, 1) that Next would scale by the kept mass for a sampled token, taken from the
  // same generator: for a model that samples where the logits are (TokenPick::kSample), so a
  // seed gives the same tokens there (with no penalties, whose counts this does not record).
  double Draw() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  // The penalties Next applies to a row, as edits: the tokens whose logits are divided by the
  // repetition penalty (multiplied, where negative), then the tokens less their amounts
  // (frequency x count + presence), in Next's order and fp32 values. None where none is set.
  void PenaltyEdits(std::vector<int32_t>* repeated, std::vector<int32_t>* counted,
                    std::vector<float>* amounts) const;
  // Records `token` as the next one where another picked it (a model picking on the device), as
  // Next records its own: the counts and seen tokens later penalties read.
  void Record(int32_t token);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> generated_;  // Token -> count.
  std::vector<int32_t> seen_;                   // Prompt + generated, distinct.
  std::vector<bool> seen_mask_;
  std::vector<std::pair<float, int32_t>> candidates_;  // Scratch.
  std::vector<double> probs_;                          // Scratch.
};

}  // namespace sluice::llm
