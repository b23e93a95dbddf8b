// How closely a model at one precision follows the same model at another (int8 against bf16, say)
// on a fixed prompt set: the two run side by side, greedy, and their logits and choices are
// compared. No torch here: it drives two StepModels.
#pragma once

#include <cstdint>
#include <vector>

#include "llm/step_model.h"
#include "sluice/status.h"

namespace sluice::llm {

struct PrecisionAgreement {
  int prompts = 0;
  // Teacher-forced: both models read the reference's greedy continuation, and at each of its
  // positions their next-token logits are compared.
  int positions = 0;
  int same_next_token = 0;  // Positions where both would choose the same token.
  double mean_cosine = 0;   // Cosine similarity of the two logit vectors, over the positions.
  double min_cosine = 1;
  // Free-running: each model's own greedy continuation of the prompt.
  int identical_completions = 0;  // Prompts whose continuations are equal throughout.
  double mean_common_prefix = 0;  // Tokens the continuations share before they first differ.
};

// Runs every prompt through both models for `new_tokens` greedy tokens. `reference` needs one KV
// slot, `candidate` two (one teacher-forced, one free-running); prompts plus new_tokens must fit
// their context.
Result<PrecisionAgreement> ComparePrecisions(StepModel& reference, StepModel& candidate,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int new_tokens);

}  // namespace sluice::llm
