// A step's chunks (step_model.h) laid out as the kernels of any executor take them: every token of
// the step in one flat array with its position, its row of the RoPE tables and its row of the
// paged KV cache, each chunk's block table checked against the pool, and FlashInfer's paged-KV
// description (indptr / indices / last page length) for attention on a device. Torch-free: the CPU
// decoder (llama/llama_model.cc) and the device executor both start a step here, and a block
// table that is wrong is refused here, before any kernel reads it.
#pragma once

#include <cstdint>
#include <vector>

#include "llm/step_model.h"
#include "sluice/status.h"

namespace sluice::llm {

// What a step's layout depends on: the cache's geometry and the model's vocabulary and RoPE.
struct StepGeometry {
  int block_size = 16;
  int context_length = 0;
  int blocks = 0;  // In the pool: a table's entries must lie in [0, blocks).
  int vocab_size = 0;
  // LongRoPE served past its original context: from this row the RoPE tables hold the long
  // factors' rows (0: one table), taken by a token where its prompt or its own position passes
  // `rope_original_context`.
  int64_t long_rope_row = 0;
  int rope_original_context = 0;
};

struct StepBatch {
  // Per token, in chunk order.
  std::vector<int64_t> tokens;
  std::vector<int64_t> positions;
  std::vector<int64_t> rope_rows;   // Its row of the RoPE tables (its position but LongRoPE's).
  std::vector<int32_t> chunk_of;    // Its chunk.
  std::vector<int64_t> cache_rows;  // Its row of the cache: block x block_size + offset.
  std::vector<int64_t> logit_rows;  // The tokens whose logits are wanted, in order.
  // Per chunk.
  std::vector<int64_t> offsets;              // Its first token in the arrays above.
  std::vector<int64_t> kv_lengths;           // Positions its attention reads: start + tokens.
  std::vector<std::vector<int32_t>> tables;  // Its block table (its own, or its slot's).
  // FlashInfer's paged KV (its BatchDecode / BatchPrefill "page table"): chunk i reads the blocks
  // kv_indices[kv_indptr[i], kv_indptr[i + 1]), the last of them up to kv_last_page_len[i] rows.
  std::vector<int32_t> kv_indptr, kv_indices, kv_last_page_len;
  // Per chunk: where its queries start in the token arrays (qo_indptr: chunks + 1 entries).
  std::vector<int32_t> qo_indptr;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// Lays `chunks` out. Errors: a chunk empty or past the context, a slot out of range, a block table
// that does not cover its tokens or names a block outside the pool, two chunks writing one block
// (kInternal: the scheduler's mistake), a token outside the vocabulary (kInvalidArgument).
Result<StepBatch> AssembleStep(const std::vector<SequenceChunk>& chunks,
                               const StepGeometry& geometry);

// The captured batch size a step of `sequences` decode sequences replays: the smallest bucket that
// holds it, or 0 where none does (the step then runs without a graph). `buckets` ascending.
int DecodeBucket(int sequences, const std::vector<int>& buckets);

// The decode buckets captured for up to `max_sequences` at once: 1, 2, 4, then every multiple of
// 8 up to 256 and of 32 beyond (a step pads by at most 7 sequences up to 256), and
// `max_sequences` itself.
std::vector<int> DecodeBuckets(int max_sequences);

}  // namespace sluice::llm
