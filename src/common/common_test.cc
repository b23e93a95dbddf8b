// Tests for status, tensor, clock, JSON writing, the blocking queue and the memory the machine
// has left.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <thread>

#include "common/blocking_queue.h"
#include "common/clock.h"
#include "common/duration.h"
#include "common/handoff_batch.h"
#include "common/json_writer.h"
#include "common/system_info.h"
#include "common/thread_pool.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {
namespace {

TEST(StatusTest, CodesMapToHttpStatuses) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(StatusCode::kPayloadTooLarge), 413);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
}

TEST(StatusTest, ToStringNamesCodeAndMessage) {
  EXPECT_EQ(Status::Ok().ToString(), "ok");
  EXPECT_EQ(Status::Unavailable("queue full").ToString(), "unavailable: queue full");
}

Status FailsWhenNegative(int v) {
  SLUICE_RETURN_IF_ERROR(v < 0 ? Status::InvalidArgument("negative") : Status::Ok());
  return Status::Internal("reached the end");
}

TEST(StatusTest, ReturnIfErrorReturnsEarlyOnlyOnError) {
  EXPECT_EQ(FailsWhenNegative(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FailsWhenNegative(1).code(), StatusCode::kInternal);
}

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> good = 7;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  EXPECT_TRUE(good.status().ok());
  Result<int> bad = Status::NotFound("no such model");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
}

TEST(TensorTest, DataTypeNamesRoundTrip) {
  for (DataType t :
       {DataType::kBool, DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kInt32,
        DataType::kInt64, DataType::kFp16, DataType::kBf16, DataType::kFp32, DataType::kFp64}) {
    EXPECT_EQ(ParseDataType(DataTypeName(t)), t);
  }
  EXPECT_EQ(DataTypeSize(DataType::kFp16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kInt64), 8u);
  EXPECT_FALSE(ParseDataType("BYTES_OR_WHATEVER").has_value());
  EXPECT_FALSE(ParseDataType("fp32").has_value());  // Names are upper case, as in KServe v2.
}

TEST(TensorTest, ElementCountRejectsNegativeAndOverflow) {
  EXPECT_EQ(ElementCount({2, 3, 4}), 24);
  EXPECT_EQ(ElementCount({}), 1);
  EXPECT_EQ(ElementCount({5, 0}), 0);
  EXPECT_FALSE(ElementCount({2, -1}).has_value());
  EXPECT_FALSE(ElementCount({1LL << 40, 1LL << 40}).has_value());
}

TEST(TensorTest, ZerosAllocatesZeroFilledAlignedStorage) {
  Tensor t = Tensor::Zeros(DataType::kFp32, {2, 3});
  EXPECT_EQ(t.element_count(), 6);
  EXPECT_EQ(t.byte_size(), 24u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (float v : t.values<float>()) EXPECT_EQ(v, 0.0f);
  Tensor copy = t;
  copy.mutable_values<float>()[1] = 5;
  EXPECT_EQ(t.values<float>()[1], 5);  // Copies share the buffer.
}

TEST(TensorTest, WrapKeepsOwnerAliveWithoutCopying) {
  auto buffer = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{1, 2, 3, 4});
  std::weak_ptr<std::vector<int32_t>> watch = buffer;
  Tensor t = Tensor::Wrap(DataType::kInt32, {2, 2}, buffer, buffer->data());
  EXPECT_EQ(t.data(), buffer->data());
  buffer.reset();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(t.values<int32_t>()[3], 4);
  t = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  Clock::time_point start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(Millis(5));
  EXPECT_EQ(clock.Now() - start, Millis(5));
  clock.SleepFor(Micros(250));
  EXPECT_EQ(clock.Now() - start, Micros(5250));
}

TEST(JsonWriterTest, WritesNestedValuesWithCommas) {
  JsonWriter json;
  json.BeginObject().Field("a", 1).Key("b").BeginArray().Int(1).Double(2.5).Null().EndArray();
  json.Field("c", true).Field("d", "x").Key("e").BeginObject().EndObject().EndObject();
  EXPECT_EQ(json.str(), R"({"a":1,"b":[1,2.5,null],"c":true,"d":"x","e":{}})");
}

TEST(JsonWriterTest, NonFiniteNumbersBecomeNull) {
  JsonWriter json;
  json.BeginArray().Double(std::numeric_limits<double>::infinity()).Double(std::nan("")).EndArray();
  EXPECT_EQ(json.str(), "[null,null]");
}

TEST(JsonQuoteTest, EscapesControlQuotesAndInvalidUtf8) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\t\x01"), R"("a\"b\\c\n\t\u0001")");
  EXPECT_EQ(JsonQuote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // Valid UTF-8 passes through.
  EXPECT_EQ(JsonQuote("bad\xff"), R"("bad\ufffd")");
  EXPECT_EQ(JsonQuote("\xc0\xaf"), R"("\ufffd\ufffd")");            // Overlong '/' is rejected.
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), R"("\ufffd\ufffd\ufffd")");  // A surrogate.
}

TEST(BlockingQueueTest, FifoAndCloseDrainsThenEnds) {
  BlockingQueue<int> q;
  q.Push(1);
  q.Push(2);
  q.Close();
  EXPECT_FALSE(q.Push(3));
  EXPECT_EQ(q.Pop(), 1);
  EXPECT_EQ(q.Pop(), 2);
  EXPECT_EQ(q.Pop(), std::nullopt);
}

TEST(BlockingQueueTest, PushBlocksWhileFullUntilPopped) {
  BlockingQueue<int> q(1);
  q.Push(1);
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    q.Push(2);
    pushed = true;
  });
  std::this_thread::sleep_for(Millis(20));
  EXPECT_FALSE(pushed.load());
  EXPECT_EQ(q.Pop(), 1);
  producer.join();
  EXPECT_TRUE(pushed.load());
  EXPECT_EQ(q.Pop(), 2);
}

TEST(BlockingQueueTest, ManyProducersAndConsumersLoseNothing) {
  BlockingQueue<int> q(8);
  constexpr int kPerProducer = 2000;
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&] {
      for (int i = 1; i <= kPerProducer; ++i) q.Push(i);
    });
  }
  std::vector<std::thread> consumers;
  for (int c = 0; c < 2; ++c) {
    consumers.emplace_back([&] {
      while (auto v = q.Pop()) sum += *v;
    });
  }
  for (auto& t : threads) t.join();
  q.Close();
  for (auto& t : consumers) t.join();
  EXPECT_EQ(sum.load(), 3LL * kPerProducer * (kPerProducer + 1) / 2);
}

// A task handed to an idle pool wakes one of its threads, and the pool counts it; every task runs.
TEST(ThreadPoolTest, RunsEveryTaskAndCountsItsWakeUps) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1, 16);
    // Until the thread has gone to wait, a submitted task may find it still starting.
    while (pool.wakeups() == 0) {
      ASSERT_TRUE(pool.TrySubmit([&ran] { ran.fetch_add(1); }));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const int before = ran.load();
    EXPECT_GE(before, 1);
    ASSERT_TRUE(pool.TrySubmit([&ran] { ran.fetch_add(1); }));
    while (ran.load() == before) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_GE(pool.wakeups(), 2);
  }
  EXPECT_GE(ran.load(), 2);
}

// queued() is the backlog: tasks submitted that no thread has taken yet.
TEST(ThreadPoolTest, QueuedCountsTheTasksNoThreadHasTaken) {
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  ThreadPool pool(1, 16);
  EXPECT_EQ(pool.queued(), 0u);
  ASSERT_TRUE(pool.TrySubmit([&started, released] {
    started.set_value();
    released.wait();
  }));
  started.get_future().wait();
  EXPECT_EQ(pool.queued(), 0u);  // Taken by the one thread, which is busy with it.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pool.TrySubmit([&ran] { ran.fetch_add(1); }));
  EXPECT_EQ(pool.queued(), 2u);
  release.set_value();
  while (ran.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(pool.queued(), 0u);
}

// A batch of hand-offs: held while open, one delivery per sink when it closes, in order; a nested
// batch joins the outer one; with none open, the caller hands off itself.
TEST(HandOffBatchTest, GathersPerSinkAndDeliversOnceWhenTheOuterBatchCloses) {
  struct CountingSink : HandOffBatch::Sink {
    std::vector<std::vector<int>> deliveries;
    std::vector<int>* running = nullptr;
    void Deliver(std::vector<std::function<void()>> works) override {
      deliveries.emplace_back();
      running = &deliveries.back();
      for (auto& work : works) work();
    }
  };
  CountingSink a, b;
  auto work_for = [](CountingSink& sink, int n) {
    return std::function<void()>([&sink, n] { sink.running->push_back(n); });
  };
  std::function<void()> alone = work_for(a, 0);
  EXPECT_FALSE(HandOffBatch::Gather(a, alone));
  EXPECT_TRUE(static_cast<bool>(alone));  // Left to the caller.
  {
    HandOffBatch batch;
    for (int n = 1; n <= 3; ++n) {
      std::function<void()> w = work_for(a, n);
      EXPECT_TRUE(HandOffBatch::Gather(a, w));
      {
        HandOffBatch nested;
        std::function<void()> v = work_for(b, 10 * n);
        EXPECT_TRUE(HandOffBatch::Gather(b, v));
      }
      EXPECT_TRUE(b.deliveries.empty());  // The nested batch delivered nothing.
    }
    EXPECT_TRUE(a.deliveries.empty());
  }
  EXPECT_EQ(a.deliveries, (std::vector<std::vector<int>>{{1, 2, 3}}));
  EXPECT_EQ(b.deliveries, (std::vector<std::vector<int>>{{10, 20, 30}}));
  std::function<void()> after = work_for(a, 4);
  EXPECT_FALSE(HandOffBatch::Gather(a, after));  // Closed: none open on this thread.
}

// A batch opened in place lets the work run where it is; the outer batch decides for a nested
// one, and another thread sees none open.
TEST(HandOffBatchTest, InPlaceHoldsOnlyWhileAnOuterBatchOpenedInPlaceIsOpen) {
  EXPECT_FALSE(HandOffBatch::InPlace());
  {
    HandOffBatch gathering;
    EXPECT_FALSE(HandOffBatch::InPlace());
    {
      HandOffBatch nested(/*in_place=*/true);
      EXPECT_FALSE(HandOffBatch::InPlace());
    }
  }
  {
    HandOffBatch in_place(/*in_place=*/true);
    EXPECT_TRUE(HandOffBatch::InPlace());
    {
      HandOffBatch nested;
      EXPECT_TRUE(HandOffBatch::InPlace());
    }
    EXPECT_TRUE(HandOffBatch::InPlace());
    bool elsewhere = true;
    std::thread([&elsewhere] { elsewhere = HandOffBatch::InPlace(); }).join();
    EXPECT_FALSE(elsewhere);
  }
  EXPECT_FALSE(HandOffBatch::InPlace());
}

TEST(SystemInfoTest, AvailableMemoryIsTheLesserOfTheKernelsAndTheCgroups) {
  EXPECT_EQ(MemAvailableOf("MemTotal:       24000000 kB\nMemFree:  100 kB\n"
                           "MemAvailable:   12345678 kB\nBuffers: 1 kB\n"),
            int64_t{12345678} * 1024);
  EXPECT_FALSE(MemAvailableOf("MemTotal: 1 kB\n").has_value());
  EXPECT_EQ(CgroupRoomOf("1073741824\n", "268435456\n"), int64_t{805306368});
  EXPECT_EQ(CgroupRoomOf("1000\n", "2000\n"), int64_t{0});  // Over its limit: no room.
  EXPECT_FALSE(CgroupRoomOf("max\n", "268435456\n").has_value());
  EXPECT_FALSE(CgroupRoomOf("", "").has_value());
  // This machine: some memory, no more than it has.
  const std::optional<int64_t> available = AvailableMemoryBytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0);
  EXPECT_LE(*available, *MemAvailableOf(R"(MemAvailable: 999999999999 kB)"));
}

}  // namespace
TEST(DurationTest, GoDurationsAndBareSecondsAsOllamaReadsKeepAlive) {
  using std::chrono::milliseconds;
  const std::pair<const char*, int64_t> good[] = {
      {"300", 300000},  {"10m", 600000},    {"1h30m", 5400000}, {"45s", 45000},
      {"500ms", 500},   {"1.5h", 5400000},  {"-1", -1000},      {"-1m", -60000},
      {"0", 0},         {"0s", 0},          {"2.5", 2500},      {"1m30s", 90000},
      {"1500us", 2},    {"+5s", 5000}};
  for (const auto& [text, ms] : good) {
    auto parsed = ParseDuration(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().message();
    EXPECT_EQ(*parsed, milliseconds(ms)) << text;
  }
  for (const char* text : {"", "-", "m", "10x", "1h30", "ten minutes", "5 m", "1e400s", "--1"}) {
    auto parsed = ParseDuration(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("is not a duration"), std::string::npos);
  }
}

}  // namespace sluice
