// The Responses API's store: bounded in count and bytes, least recently used first out.
#include "http/response_store.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

StoredResponse Response(const std::string& id, size_t body_bytes = 10) {
  StoredResponse r;
  r.id = id;
  r.body = std::string(body_bytes, 'x');
  llm::ChatMessage message;
  message.role = "user";
  message.content = "hello";
  r.conversation.push_back(message);
  return r;
}

TEST(ResponseStoreTest, TheLeastRecentlyUsedGoFirst) {
  ResponseStore store(3, 1 << 20);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(store.Put(Response(id)));
  ASSERT_NE(store.Get("a"), nullptr);  // a is now the most recently used.
  ASSERT_TRUE(store.Put(Response("d")));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.Get("b"), nullptr);
  EXPECT_NE(store.Get("a"), nullptr);
  EXPECT_EQ(store.Get("a")->conversation[0].content, "hello");
  EXPECT_TRUE(store.Delete("a"));
  EXPECT_FALSE(store.Delete("a"));
  EXPECT_EQ(store.Get("a"), nullptr);
  EXPECT_EQ(store.size(), 2u);
}

TEST(ResponseStoreTest, BytesAreBoundedToo) {
  const size_t one = ResponseStore::BytesOf(Response("r0000", 1000));
  ResponseStore store(1000, 5 * one);
  for (int i = 0; i < 10000; ++i) {
    char id[8];
    std::snprintf(id, sizeof(id), "r%04d", i % 10000);
    ASSERT_TRUE(store.Put(Response(id, 1000)));
    ASSERT_LE(store.bytes(), 5 * one);
  }
  EXPECT_EQ(store.size(), 5u);
  EXPECT_NE(store.Get("r9999"), nullptr);
  EXPECT_EQ(store.Get("r9994"), nullptr);
  // One larger than the whole bound is not kept, and lets nothing go.
  EXPECT_FALSE(store.Put(Response("huge", 6 * one)));
  EXPECT_EQ(store.size(), 5u);
  // The same id again replaces it.
  ASSERT_TRUE(store.Put(Response("r9999", 10)));
  EXPECT_EQ(store.size(), 5u);
  EXPECT_EQ(store.Get("r9999")->body.size(), 10u);
  ResponseStore none(0, 1 << 20);
  EXPECT_FALSE(none.Put(Response("a")));
}

}  // namespace
}  // namespace sluice
