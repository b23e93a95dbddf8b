#include "http/exchange.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sluice {
namespace {

TEST(ResponseStreamTest, RenderersRunOnTheTakingThreadInOrderWithWrites) {
  ResponseStream stream;
  std::thread::id rendered_on;
  std::thread producer([&] {
    EXPECT_TRUE(stream.Write("a"));
    EXPECT_TRUE(stream.Post(
        [&] {
          rendered_on = std::this_thread::get_id();
          return std::string("b");
        },
        1));
    EXPECT_TRUE(stream.Write("c"));
    EXPECT_TRUE(stream.Post([] { return std::string("d"); }, 1));
    stream.Close();
  });
  producer.join();
  bool closed = false;
  EXPECT_EQ(stream.Take(&closed), "abcd");
  EXPECT_TRUE(closed);
  EXPECT_EQ(rendered_on, std::this_thread::get_id());
  // Nothing is rendered twice, and what comes after the close is ignored.
  EXPECT_TRUE(stream.Post([] { return std::string("late"); }, 1));
  EXPECT_EQ(stream.Take(&closed), "");
}

TEST(ResponseStreamTest, ARendererIsNotRunBeforeTheStreamIsTaken) {
  ResponseStream stream;
  int runs = 0;
  ASSERT_TRUE(stream.Post(
      [&] {
        ++runs;
        return std::string("x");
      },
      1));
  EXPECT_EQ(runs, 0);
  bool closed = true;
  EXPECT_EQ(stream.Take(&closed), "x");
  EXPECT_FALSE(closed);
  EXPECT_EQ(runs, 1);
}

TEST(ResponseStreamTest, RenderersCountTheirWeightTowardTheBoundAndAreDroppedWhenTheClientIsGone) {
  ResponseStream stream;
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  ASSERT_TRUE(stream.Post([held] { return std::string("x"); }, ResponseStream::kMaxPendingBytes));
  held.reset();
  EXPECT_FALSE(watch.expired());  // Queued: the renderer keeps what it captured.
  // One byte more than the bound: the client counts as gone, and the queue's renderers go unrun.
  EXPECT_FALSE(stream.Write("y"));
  EXPECT_TRUE(stream.client_gone());
  EXPECT_TRUE(watch.expired());
  bool closed = false;
  EXPECT_EQ(stream.Take(&closed), "");

  ResponseStream left;
  auto kept = std::make_shared<int>(0);
  std::weak_ptr<int> kept_watch = kept;
  ASSERT_TRUE(left.Post([kept] { return std::string("x"); }, 1));
  kept.reset();
  left.MarkGone();
  EXPECT_TRUE(kept_watch.expired());
  EXPECT_FALSE(left.Post([] { return std::string("z"); }, 1));
}

TEST(ResponseStreamTest, TakingFreesTheBound) {
  ResponseStream stream;
  ASSERT_TRUE(stream.Post([] { return std::string("x"); }, ResponseStream::kMaxPendingBytes));
  bool closed = false;
  EXPECT_EQ(stream.Take(&closed), "x");
  EXPECT_TRUE(stream.Post([] { return std::string("y"); }, ResponseStream::kMaxPendingBytes));
}

TEST(QueryParametersTest, NamesAndValuesDecodedInOrder) {
  using Parameters = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(QueryParameters(""), Parameters{});
  EXPECT_EQ(QueryParameters("limit=2&order=asc&after=msg_1"),
            (Parameters{{"limit", "2"}, {"order", "asc"}, {"after", "msg_1"}}));
  EXPECT_EQ(QueryParameters("include%5B%5D=a+b&flag&&x=%2F"),
            (Parameters{{"include[]", "a b"}, {"flag", ""}, {"x", "/"}}));
  EXPECT_FALSE(QueryParameters("x=%4").has_value());
  EXPECT_FALSE(QueryParameters("x=%zz").has_value());
  EXPECT_FALSE(QueryParameters("x=%").has_value());
}

}  // namespace
}  // namespace sluice
