// Test helpers for StepModel implementations (tests only: includes GoogleTest).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "llm/step_model.h"

namespace sluice::llm::testing {

// Prefills `prompt` in chunks of 8 (every row's logits) on `blocks` (a slot's static blocks when
// empty), then decodes `steps` greedy tokens: every logit, in order.
inline std::vector<float> PagedRun(StepModel& model, int slot, const std::vector<int32_t>& blocks,
                                   const std::vector<int32_t>& prompt, int start, int steps) {
  const int vocab = model.architecture().vocab_size;
  std::vector<float> logits;
  // Chunks of 8 from 0: a start at a block boundary keeps the same chunks (fp32 products go
  // through ATen, whose results may depend on the rows multiplied together).
  for (int begin = start; begin < static_cast<int>(prompt.size()); begin += 8) {
    const int end = std::min<int>(begin + 8, static_cast<int>(prompt.size()));
    SequenceChunk c{slot, begin, {prompt.begin() + begin, prompt.begin() + end}, true, blocks};
    EXPECT_TRUE(model.Run({c}, &logits).ok());
  }
  int position = static_cast<int>(prompt.size());
  for (int i = 0; i < steps; ++i) {
    const float* last = logits.data() + logits.size() - vocab;
    const auto next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    SequenceChunk c{slot, position++, {next}, false, blocks};
    EXPECT_TRUE(model.Run({c}, &logits).ok());
  }
  return logits;
}

}  // namespace sluice::llm::testing
