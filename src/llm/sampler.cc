#include "llm/sampler.h"

#include <algorithm>
#include <cmath>

#include "llm/kernels/kernels.h"

namespace sluice::llm {

Sampler::Sampler(const SamplingParams& params, const std::vector<int32_t>& prompt)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  if (params_.repetition_penalty != 1.0) {
    for (int32_t token : prompt) {
      if (token < 0) continue;
      if (static_cast<size_t>(token) >= seen_mask_.size())
        seen_mask_.resize(static_cast<size_t>(token) + 1);
      if (!seen_mask_[static_cast<size_t>(token)]) {
        seen_mask_[static_cast<size_t>(token)] = true;
        seen_.push_back(token);
      }
    }
  }
}

TokenLogprobs LogProbabilities(const float* logits, int vocab, int32_t chosen, int top) {
  float max = logits[0];
  for (int i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const double log_z = static_cast<double>(max) + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_z); };
  TokenLogprobs out;
  out.chosen = {chosen, logprob(chosen)};
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) ids[static_cast<size_t>(i)] = i;
  const auto keep = static_cast<long>(std::clamp(top, 0, vocab));
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (long i = 0; i < keep; ++i) {
    out.top.push_back({ids[static_cast<size_t>(i)], logprob(ids[static_cast<size_t>(i)])});
  }
  return out;
}

int32_t Sampler::Next(float* logits, int vocab) {
  if (params_.repetition_penalty != 1.0) {
    const auto penalty = static_cast<float>(params_.repetition_penalty);
    for (int32_t token : seen_) {
      if (token >= vocab) continue;
      float& logit = logits[token];
      logit = logit > 0 ? logit / penalty : logit * penalty;
    }
  }
  if (params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) {
    for (const auto& [token, count] : generated_) {
      if (token >= vocab) continue;
      logits[token] -=
          static_cast<float>(count * params_.frequency_penalty + params_.presence_penalty);
    }
  }
  int32_t chosen = 0;
  if (params_.temperature <= 0.0 || params_.top_k == 1) {
    chosen = static_cast<int32_t>(ArgMax(logits, vocab));
  } else {
    candidates_.clear();
    const auto inverse = static_cast<float>(1.0 / params_.temperature);
    for (int32_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i] * inverse, i);
    size_t keep = candidates_.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep)
      keep = static_cast<size_t>(params_.top_k);
    // Sorted by logit, highest first (ties by id, so a seed reproduces exactly).
    auto higher = [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    if (keep < candidates_.size()) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<long>(keep),
                        candidates_.end(), higher);
      candidates_.resize(keep);
    } else if (params_.top_p < 1.0) {
      std::sort(candidates_.begin(), candidates_.end(), higher);
    }  // Else every candidate stays in id order: the draw needs no ranking (the default case).
    float max = candidates_.front().first;
    for (const auto& c : candidates_) max = std::max(max, c.first);
    double total = 0;
    probs_.resize(candidates_.size());
    std::vector<double>& probs = probs_;
    for (size_t i = 0; i < candidates_.size(); ++i)
      total += probs[i] = std::exp(static_cast<double>(candidates_[i].first - max));
    size_t cut = candidates_.size();
    if (params_.top_p < 1.0) {
      double mass = 0;
      for (size_t i = 0; i < candidates_.size(); ++i) {
        mass += probs[i] / total;
        if (mass >= params_.top_p) {
          cut = i + 1;
          break;
        }
      }
    }
    double kept = 0;
    for (size_t i = 0; i < cut; ++i) kept += probs[i];
    double draw = std::uniform_real_distribution<double>(0.0, kept)(rng_);
    chosen = candidates_[cut - 1].second;
    for (size_t i = 0; i < cut; ++i) {
      draw -= probs[i];
      if (draw < 0) {
        chosen = candidates_[i].second;
        break;
      }
    }
  }
  Record(chosen);
  return chosen;
}

void Sampler::Record(int32_t token) {
  ++generated_[token];
  if (params_.repetition_penalty != 1.0) {
    if (static_cast<size_t>(token) >= seen_mask_.size())
      seen_mask_.resize(static_cast<size_t>(token) + 1);
    if (!seen_mask_[static_cast<size_t>(token)]) {
      seen_mask_[static_cast<size_t>(token)] = true;
      seen_.push_back(token);
    }
  }
}

void Sampler::PenaltyEdits(std::vector<int32_t>* repeated, std::vector<int32_t>* counted,
                           std::vector<float>* amounts) const {
  if (params_.repetition_penalty != 1.0) *repeated = seen_;
  if (params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) {
    for (const auto& [token, count] : generated_) {
      counted->push_back(token);
      amounts->push_back(
          static_cast<float>(count * params_.frequency_penalty + params_.presence_penalty));
    }
  }
}

}  // namespace sluice::llm
