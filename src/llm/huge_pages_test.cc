#include "llm/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

namespace sluice::llm {
namespace {

// Whether the page holding `address` is mapped in this process (mincore fails with ENOMEM where
// it is not).
bool Mapped(const void* address) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) & ~(page - 1));
  unsigned char resident = 0;
  if (mincore(start, page, &resident) == 0) return true;
  EXPECT_EQ(errno, ENOMEM);
  return false;
}

TEST(HugePageArenaTest, SmallBlocksShareAnAlignedMappingWithoutOverlapping) {
  HugePageArena arena(int64_t{8} << 20);
  std::vector<HugePageBlock> blocks;
  for (int64_t bytes : {1, 63, 64, 100, 4096, 300000, 1 << 20}) {
    blocks.push_back(arena.Allocate(bytes));
    HugePageBlock& block = blocks.back();
    ASSERT_NE(block.data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block.data) % HugePageArena::kAlignment, 0u);
    std::memset(block.data, static_cast<int>(blocks.size()), static_cast<size_t>(bytes));
  }
  // The first block starts the mapping, on a 2 MiB boundary; each next one follows the last.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[0].data) % HugePageArena::kHugePage, 0u);
  EXPECT_EQ(blocks[1].data, blocks[0].data + 64);
  EXPECT_EQ(blocks[2].data, blocks[1].data + 64);
  EXPECT_EQ(blocks[3].data, blocks[2].data + 64);
  EXPECT_EQ(blocks[4].data, blocks[3].data + 128);
  EXPECT_EQ(blocks[5].data, blocks[4].data + 4096);
  // Each block kept what was written into it (no overlaps).
  EXPECT_EQ(blocks[3].data[99], 4);
  EXPECT_EQ(blocks[4].data[0], 5);
  EXPECT_EQ(blocks[5].data[299999], 6);
}

TEST(HugePageArenaTest, ABlockOverAQuarterOfAChunkHasAMappingOfItsOwn) {
  HugePageArena arena(int64_t{8} << 20);
  HugePageBlock small = arena.Allocate(1000);
  HugePageBlock large = arena.Allocate((int64_t{2} << 20) + 1);
  ASSERT_NE(large.data, nullptr);
  EXPECT_NE(small.owner, large.owner);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data) % HugePageArena::kHugePage, 0u);
  large.data[(int64_t{2} << 20)] = 7;  // Its last byte is there.
  // The next small block still follows the first.
  HugePageBlock next = arena.Allocate(10);
  EXPECT_EQ(next.data, small.data + 1024);
}

TEST(HugePageArenaTest, AMappingIsUnmappedWhenItsLastBlockGoes) {
  HugePageArena arena(int64_t{8} << 20);
  HugePageBlock first = arena.Allocate(4096);
  HugePageBlock second = arena.Allocate(4096);
  HugePageBlock own = arena.Allocate(int64_t{4} << 20);
  uint8_t* chunk = first.data;
  uint8_t* large = own.data;
  ASSERT_TRUE(Mapped(chunk));
  ASSERT_TRUE(Mapped(large));
  first = {};
  EXPECT_TRUE(Mapped(chunk));  // `second` still holds it.
  second = {};
  EXPECT_FALSE(Mapped(chunk));
  own = {};
  EXPECT_FALSE(Mapped(large));
  // The arena maps afresh.
  HugePageBlock again = arena.Allocate(4096);
  ASSERT_NE(again.data, nullptr);
  again.data[4095] = 1;
  EXPECT_TRUE(Mapped(again.data));
}

// Whether the page holding `address` is resident.
bool Resident(const void* address) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) & ~(page - 1));
  unsigned char resident = 0;
  EXPECT_EQ(mincore(start, page, &resident), 0);
  return (resident & 1) != 0;
}

// A released block's pages leave resident memory at once, while its mapping lives on for the
// blocks around it; pages it shares with a live neighbour stay.
TEST(HugePageArenaTest, AReleasedBlockGivesBackItsPages) {
  HugePageArena arena(int64_t{8} << 20);
  HugePageBlock before = arena.Allocate(100);
  HugePageBlock middle = arena.Allocate(int64_t{256} << 10);
  HugePageBlock after = arena.Allocate(100);
  std::memset(before.data, 1, 100);
  std::memset(middle.data, 2, size_t{256} << 10);
  std::memset(after.data, 3, 100);
  uint8_t* inside = middle.data + (int64_t{128} << 10);
  ASSERT_TRUE(Resident(inside));
  middle = {};
  EXPECT_TRUE(Mapped(inside));
  EXPECT_FALSE(Resident(inside));
  EXPECT_EQ(before.data[99], 1);  // The neighbours keep their bytes.
  EXPECT_EQ(after.data[0], 3);
}

TEST(HugePageArenaTest, BlocksFromSeveralThreadsDoNotOverlap) {
  HugePageArena arena(int64_t{4} << 20);
  constexpr int kThreads = 4, kBlocks = 200;
  std::vector<std::vector<HugePageBlock>> blocks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBlocks; ++i) {
        blocks[static_cast<size_t>(t)].push_back(arena.Allocate(1000 + 37 * i));
        std::memset(blocks[static_cast<size_t>(t)].back().data, t, 1000);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kBlocks; ++i) {
      const HugePageBlock& block = blocks[static_cast<size_t>(t)][static_cast<size_t>(i)];
      ASSERT_NE(block.data, nullptr);
      EXPECT_EQ(block.data[999], t);
      const auto begin = reinterpret_cast<uintptr_t>(block.data);
      ranges.emplace_back(begin, begin + 1000 + 37 * i);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

}  // namespace
}  // namespace sluice::llm
