// The prefix cache's disk tier: blocks written and read back, kept across a reopening (a
// restart), kept apart by layout, bounded by bytes (least recently used out first), and a damaged
// file deleted, never served.
#include "llm/kv_disk_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace sluice::llm {
namespace {

namespace fs = std::filesystem;

class KvDiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kv_disk_store_test." + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<KvDiskStore> Open(const std::string& layout = "layout A",
                                    int64_t max_bytes = int64_t{1} << 30) {
    auto store = KvDiskStore::Open(dir_.string(), layout, max_bytes);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? *store : nullptr;
  }

  static std::string Data(char fill, size_t size = 1000) { return std::string(size, fill); }
  static std::vector<int32_t> Tokens(int32_t first) { return {first, first + 1, first + 2}; }

  fs::path dir_;
};

TEST_F(KvDiskStoreTest, BlocksAreReadBackAndOutliveTheStore) {
  {
    auto store = Open();
    EXPECT_FALSE(store->Get(1).has_value());
    store->Put(1, 100, Tokens(10), Data('a'));
    store->Put(2, 1, Tokens(20), Data('b'));
    store->Put(2, 1, Tokens(20), Data('b'));  // Queued already: once.
    store->Flush();
    EXPECT_EQ(store->blocks(), 2);
    EXPECT_TRUE(store->Contains(2));
    auto block = store->Get(2);
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ(block->parent, 1u);
    EXPECT_EQ(block->tokens, Tokens(20));
    EXPECT_EQ(*block->data, Data('b'));
    EXPECT_EQ(store->hits(), 1);
  }
  // Reopened (the server restarted): what was written is there.
  auto again = Open();
  EXPECT_EQ(again->blocks(), 2);
  auto block = again->Get(1);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->parent, 100u);
  EXPECT_EQ(*block->data, Data('a'));
  // Another layout (another model, precision or cache type) sees none of it.
  auto other = Open("layout B");
  EXPECT_EQ(other->blocks(), 0);
  EXPECT_FALSE(other->Get(1).has_value());
  EXPECT_NE(other->folder(), again->folder());
}

TEST_F(KvDiskStoreTest, ADamagedFileIsDeletedNotServed) {
  std::string folder;
  {
    auto store = Open();
    store->Put(1, 0, Tokens(1), Data('a'));
    store->Put(2, 1, Tokens(2), Data('b'));
    store->Put(3, 2, Tokens(3), Data('c'));
    store->Flush();
    folder = store->folder();
    // One byte of block 1's data flipped while the store runs: found by the checksum.
    {
      std::fstream file(fs::path(folder) / "0000000000000001.kv",
                        std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(-10, std::ios::end);
      file.put('x');
    }
    EXPECT_FALSE(store->Get(1).has_value());
    EXPECT_EQ(store->discarded(), 1);
    EXPECT_FALSE(store->Contains(1));
    EXPECT_FALSE(fs::exists(fs::path(folder) / "0000000000000001.kv"));
  }
  // Block 2 truncated, and a write cut short, while the server was down: dropped at opening.
  fs::resize_file(fs::path(folder) / "0000000000000002.kv", 30);
  std::ofstream(fs::path(folder) / "0000000000000004.kv.tmp") << "half";
  auto store = Open();
  EXPECT_EQ(store->blocks(), 1);
  EXPECT_EQ(store->discarded(), 1);
  EXPECT_FALSE(store->Get(2).has_value());
  EXPECT_TRUE(store->Get(3).has_value());
  EXPECT_FALSE(fs::exists(fs::path(folder) / "0000000000000004.kv.tmp"));
}

TEST_F(KvDiskStoreTest, TheLeastRecentlyUsedGoFirstPastTheBound) {
  // Room for two blocks of ~1,060 bytes each (header, tokens, data).
  auto store = Open("layout A", 2500);
  store->Put(1, 0, Tokens(1), Data('a'));
  store->Put(2, 1, Tokens(2), Data('b'));
  store->Flush();
  ASSERT_TRUE(store->Get(1).has_value());  // 1 used since 2.
  store->Put(3, 2, Tokens(3), Data('c'));
  store->Flush();
  EXPECT_EQ(store->blocks(), 2);
  EXPECT_TRUE(store->Contains(1));
  EXPECT_FALSE(store->Contains(2));
  EXPECT_TRUE(store->Contains(3));
  EXPECT_LE(store->bytes(), 2500);
}

TEST_F(KvDiskStoreTest, TheWeightsDigestSeesTheirContent) {
  fs::create_directories(dir_);
  const fs::path a = dir_ / "a.bin", b = dir_ / "b.bin";
  std::string content(3 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7);
  std::ofstream(a, std::ios::binary) << content;
  for (size_t i = 0; i < content.size(); i += 4096) content[i] ^= 1;  // Every page differs.
  std::ofstream(b, std::ios::binary) << content;
  EXPECT_EQ(KvDiskStore::FilesDigest({a.string()}), KvDiskStore::FilesDigest({a.string()}));
  EXPECT_NE(KvDiskStore::FilesDigest({a.string()}), KvDiskStore::FilesDigest({b.string()}));
  EXPECT_EQ(KvDiskStore::FilesDigest({a.string()}).size(), 16u);
}

}  // namespace
}  // namespace sluice::llm
