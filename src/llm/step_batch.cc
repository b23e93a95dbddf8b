#include "llm/step_batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace sluice::llm {

Result<StepBatch> AssembleStep(const std::vector<SequenceChunk>& chunks,
                               const StepGeometry& geometry) {
  StepBatch b;
  const int64_t block = geometry.block_size;
  const int64_t per_slot = (geometry.context_length + block - 1) / block;
  b.tables.resize(chunks.size());
  b.kv_indptr.push_back(0);
  b.qo_indptr.push_back(0);
  std::vector<int32_t> written;  // Blocks this step writes into: no two chunks share one.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& chunk = chunks[i];
    const int64_t len = static_cast<int64_t>(chunk.tokens.size());
    if (len == 0 || chunk.start < 0 || chunk.start + len > geometry.context_length) {
      return Status::Internal(fmt::format("chunk of {} tokens at {} exceeds the context of {}", len,
                                          chunk.start, geometry.context_length));
    }
    std::vector<int32_t>& table = b.tables[i];
    if (chunk.blocks.empty()) {
      if (chunk.slot < 0 || (chunk.slot + 1) * per_slot > geometry.blocks) {
        return Status::Internal(fmt::format("step names slot {}, out of range", chunk.slot));
      }
      table.resize(static_cast<size_t>(per_slot));
      std::iota(table.begin(), table.end(), static_cast<int32_t>(chunk.slot * per_slot));
    } else {
      table = chunk.blocks;
    }
    const int64_t needed = (chunk.start + len + block - 1) / block;
    if (static_cast<int64_t>(table.size()) < needed ||
        std::any_of(table.begin(), table.begin() + needed,
                    [&](int32_t t) { return t < 0 || t >= geometry.blocks; })) {
      return Status::Internal(
          fmt::format("a block table of {} entries does not cover {} tokens "
                      "in [0, {}) blocks",
                      table.size(), chunk.start + len, geometry.blocks));
    }
    for (int64_t t = chunk.start / block; t < needed; ++t) {
      written.push_back(table[static_cast<size_t>(t)]);
    }
    b.offsets.push_back(b.size());
    b.kv_lengths.push_back(chunk.start + len);
    b.kv_indices.insert(b.kv_indices.end(), table.begin(), table.begin() + needed);
    b.kv_indptr.push_back(static_cast<int32_t>(b.kv_indices.size()));
    b.kv_last_page_len.push_back(static_cast<int32_t>(chunk.start + len - (needed - 1) * block));
    const int64_t prompt = chunk.prompt_length > 0 ? chunk.prompt_length : chunk.start + len;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t token = chunk.tokens[static_cast<size_t>(j)];
      if (token < 0 || token >= geometry.vocab_size) {
        return Status::InvalidArgument(fmt::format("token id {} is outside the vocab", token));
      }
      if (chunk.all_logits || j == len - 1) b.logit_rows.push_back(b.size());
      const int64_t position = chunk.start + j;
      b.tokens.push_back(token);
      b.positions.push_back(position);
      const bool long_factors = geometry.long_rope_row > 0 &&
                                std::max(prompt, position + 1) > geometry.rope_original_context;
      b.rope_rows.push_back(position + (long_factors ? geometry.long_rope_row : 0));
      b.chunk_of.push_back(static_cast<int32_t>(i));
      b.cache_rows.push_back(table[static_cast<size_t>(position / block)] * block +
                             position % block);
    }
    b.qo_indptr.push_back(static_cast<int32_t>(b.size()));
  }
  std::sort(written.begin(), written.end());
  if (std::adjacent_find(written.begin(), written.end()) != written.end()) {
    return Status::Internal("two chunks of a step write into the same cache block");
  }
  return b;
}

int DecodeBucket(int sequences, const std::vector<int>& buckets) {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), sequences);
  return it == buckets.end() ? 0 : *it;
}

std::vector<int> DecodeBuckets(int max_sequences) {
  std::vector<int> buckets;
  for (int b : {1, 2, 4}) {
    if (b < max_sequences) buckets.push_back(b);
  }
  for (int b = 8; b < max_sequences; b += b < 256 ? 8 : 32) buckets.push_back(b);
  if (max_sequences >= 1) buckets.push_back(max_sequences);
  return buckets;
}

}  // namespace sluice::llm
