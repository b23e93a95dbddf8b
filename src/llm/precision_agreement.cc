// Teacher-forced and free-running greedy comparison of two StepModels.
#include "llm/precision_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "llm/kernels/kernels.h"

namespace sluice::llm {
namespace {

double Cosine(const float* a, const float* b, int64_t n) {
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  return aa == 0 || bb == 0 ? (aa == bb ? 1.0 : 0.0) : dot / std::sqrt(aa * bb);
}

}  // namespace

Result<PrecisionAgreement> ComparePrecisions(StepModel& reference, StepModel& candidate,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int new_tokens) {
  const int vocab = reference.architecture().vocab_size;
  if (candidate.architecture().vocab_size != vocab) {
    return Status::InvalidArgument("the two models have different vocabularies");
  }
  if (reference.slots() < 1 || candidate.slots() < 2) {
    return Status::InvalidArgument("the reference needs 1 KV slot and the candidate 2");
  }
  PrecisionAgreement result;
  double cosine_sum = 0, prefix_sum = 0;
  std::vector<float> ref_logits, cand_logits;
  for (const std::vector<int32_t>& prompt : prompts) {
    const int length = static_cast<int>(prompt.size());
    if (length == 0) continue;
    if (length + new_tokens > std::min(reference.context_length(), candidate.context_length())) {
      return Status::InvalidArgument(fmt::format(
          "a prompt of {} tokens plus {} new ones exceeds the context", length, new_tokens));
    }
    ++result.prompts;
    // Step 0: the prompt, on the reference (slot 0) and twice on the candidate (slots 0 and 1).
    ref_logits.clear();
    cand_logits.clear();
    SLUICE_RETURN_IF_ERROR(reference.Run({SequenceChunk{0, 0, prompt, false, {}}}, &ref_logits));
    SLUICE_RETURN_IF_ERROR(candidate.Run(
        {SequenceChunk{0, 0, prompt, false, {}}, SequenceChunk{1, 0, prompt, false, {}}},
        &cand_logits));
    std::vector<int32_t> ref_tokens, own_tokens;
    for (int step = 0; step < new_tokens; ++step) {
      const float* ref = ref_logits.data();
      const float* forced = cand_logits.data();
      const float* own = cand_logits.data() + vocab;
      const auto ref_next = static_cast<int32_t>(ArgMax(ref, vocab));
      const auto forced_next = static_cast<int32_t>(ArgMax(forced, vocab));
      const auto own_next = static_cast<int32_t>(ArgMax(own, vocab));
      const double cosine = Cosine(ref, forced, vocab);
      ++result.positions;
      cosine_sum += cosine;
      result.min_cosine = std::min(result.min_cosine, cosine);
      if (ref_next == forced_next) ++result.same_next_token;
      ref_tokens.push_back(ref_next);
      own_tokens.push_back(own_next);
      if (step + 1 == new_tokens) break;
      const int position = length + step;
      ref_logits.clear();
      cand_logits.clear();
      SLUICE_RETURN_IF_ERROR(
          reference.Run({SequenceChunk{0, position, {ref_next}, false, {}}}, &ref_logits));
      SLUICE_RETURN_IF_ERROR(candidate.Run({SequenceChunk{0, position, {ref_next}, false, {}},
                                            SequenceChunk{1, position, {own_next}, false, {}}},
                                           &cand_logits));
    }
    const auto differ = std::mismatch(ref_tokens.begin(), ref_tokens.end(), own_tokens.begin());
    const auto common = differ.first - ref_tokens.begin();
    prefix_sum += static_cast<double>(common);
    if (common == static_cast<std::ptrdiff_t>(ref_tokens.size())) ++result.identical_completions;
  }
  if (result.positions > 0) result.mean_cosine = cosine_sum / result.positions;
  if (result.prompts > 0) result.mean_common_prefix = prefix_sum / result.prompts;
  return result;
}

}  // namespace sluice::llm
