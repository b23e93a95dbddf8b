// A step's layout: each token's cache row from its chunk's block table, FlashInfer's page table,
// the logit rows, LongRoPE's rows, the refusals of tables that are wrong, and the decode buckets.
#include "llm/step_batch.h"

#include <gtest/gtest.h>

namespace sluice::llm {
namespace {

StepGeometry Geometry() {
  return StepGeometry{.block_size = 4, .context_length = 32, .blocks = 16, .vocab_size = 100};
}

SequenceChunk Chunk(int start, std::vector<int32_t> tokens, std::vector<int32_t> blocks) {
  SequenceChunk c;
  c.start = start;
  c.tokens = std::move(tokens);
  c.blocks = std::move(blocks);
  return c;
}

TEST(StepBatchTest, APrefillAndADecodeLaidOutFromTheirBlockTables) {
  // A prompt of 6 tokens in blocks 9 and 2; a decode at position 5 of a sequence in 7 then 3.
  auto step = AssembleStep({Chunk(0, {10, 11, 12, 13, 14, 15}, {9, 2}), Chunk(5, {42}, {7, 3})},
                           Geometry());
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_EQ(step->tokens, (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 42}));
  EXPECT_EQ(step->positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 5}));
  EXPECT_EQ(step->rope_rows, step->positions);
  EXPECT_EQ(step->chunk_of, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1}));
  // Block 9's rows 0-3, block 2's rows 0-1; block 3's row 1.
  EXPECT_EQ(step->cache_rows, (std::vector<int64_t>{36, 37, 38, 39, 8, 9, 13}));
  EXPECT_EQ(step->logit_rows, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(step->offsets, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(step->kv_lengths, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(step->qo_indptr, (std::vector<int32_t>{0, 6, 7}));
  EXPECT_EQ(step->kv_indptr, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(step->kv_indices, (std::vector<int32_t>{9, 2, 7, 3}));
  EXPECT_EQ(step->kv_last_page_len, (std::vector<int32_t>{2, 2}));
}

TEST(StepBatchTest, AStaticSlotsBlocksAndEveryLogitWhenAsked) {
  SequenceChunk c = Chunk(3, {1, 2}, {});
  c.slot = 1;  // Slot 1 of a 32-token context in blocks of 4: blocks 8 to 15.
  c.all_logits = true;
  auto step = AssembleStep({c}, Geometry());
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_EQ(step->cache_rows, (std::vector<int64_t>{35, 36}));
  EXPECT_EQ(step->logit_rows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(step->kv_indices, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(step->kv_last_page_len, (std::vector<int32_t>{1}));
  c.slot = 2;
  EXPECT_NE(AssembleStep({c}, Geometry()).status().message().find("slot 2, out of range"),
            std::string::npos);
}

TEST(StepBatchTest, LongRopeRowsPastTheOriginalContext) {
  StepGeometry g = Geometry();
  g.long_rope_row = 32;
  g.rope_original_context = 4;
  // Positions 2 and 3, the prompt ending there (4 tokens, not past 4): the short factors' rows.
  // A prompt of 8 (prompt_length) is past 4: every token of it takes the long factors' rows.
  SequenceChunk c = Chunk(2, {5, 6}, {0, 1});
  auto short_rows = AssembleStep({c}, g);
  ASSERT_TRUE(short_rows.ok());
  EXPECT_EQ(short_rows->rope_rows, (std::vector<int64_t>{2, 3}));
  c.prompt_length = 8;
  auto long_rows = AssembleStep({c}, g);
  ASSERT_TRUE(long_rows.ok());
  EXPECT_EQ(long_rows->rope_rows, (std::vector<int64_t>{34, 35}));
}

TEST(StepBatchTest, TablesThatAreWrongAreRefused) {
  const StepGeometry g = Geometry();
  auto message = [&](std::vector<SequenceChunk> chunks) {
    return AssembleStep(chunks, g).status().message();
  };
  EXPECT_NE(message({Chunk(0, {1, 2, 3, 4, 5}, {3})}).find("does not cover 5 tokens"),
            std::string::npos);
  EXPECT_NE(message({Chunk(0, {1}, {16})}).find("in [0, 16) blocks"), std::string::npos);
  EXPECT_NE(message({Chunk(0, {1}, {-1})}).find("does not cover"), std::string::npos);
  // Two sequences writing into block 5 (a prefix's shared block must be copied first).
  EXPECT_EQ(message({Chunk(4, {1}, {0, 5}), Chunk(5, {2}, {1, 5})}),
            "two chunks of a step write into the same cache block");
  // Reading a shared block is fine: the second writes only into its block 6.
  EXPECT_TRUE(AssembleStep({Chunk(4, {1}, {0, 5}), Chunk(8, {2}, {0, 5, 6})}, g).ok());
  EXPECT_NE(message({Chunk(30, {1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8})}).find("exceeds"),
            std::string::npos);
  EXPECT_NE(message({Chunk(0, {}, {0})}).find("chunk of 0 tokens"), std::string::npos);
  auto vocab = AssembleStep({Chunk(0, {100}, {0})}, g);
  EXPECT_EQ(vocab.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(vocab.status().message(), "token id 100 is outside the vocab");
}

TEST(StepBatchTest, DecodeBuckets) {
  EXPECT_EQ(DecodeBuckets(1), (std::vector<int>{1}));
  EXPECT_EQ(DecodeBuckets(6), (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(DecodeBuckets(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  const std::vector<int> many = DecodeBuckets(320);
  EXPECT_EQ(many[3], 8);
  EXPECT_EQ(many[many.size() - 4], 248);
  EXPECT_EQ(many[many.size() - 3], 256);
  EXPECT_EQ(many[many.size() - 2], 288);
  EXPECT_EQ(many.back(), 320);
  EXPECT_EQ(DecodeBucket(1, many), 1);
  EXPECT_EQ(DecodeBucket(3, many), 4);
  EXPECT_EQ(DecodeBucket(9, many), 16);
  EXPECT_EQ(DecodeBucket(257, many), 288);
  EXPECT_EQ(DecodeBucket(321, many), 0) << "past the largest: no graph";
}

}  // namespace
}  // namespace sluice::llm
