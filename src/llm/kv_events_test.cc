// KV events: the msgpack payload's layout (decoded by msgpack-c, as a subscriber would), and the
// publisher over real ZeroMQ sockets on loopback: topics, per-topic sequence numbers, replay.
#include "llm/kv_events.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <chrono>
#include <msgpack.hpp>
#include <thread>

namespace sluice::llm {
namespace {

KvEvent Stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent,
               std::vector<int32_t> tokens, uint64_t adapter = 0) {
  KvEvent event;
  event.kind = KvEvent::Kind::kStored;
  event.hashes = std::move(hashes);
  event.parent = parent;
  event.tokens = std::move(tokens);
  event.adapter = adapter;
  return event;
}

TEST(KvEventsTest, ThePayloadIsVllmsEventBatch) {
  KvEventBatch batch = NewKvEventBatch("kv@m", 2);
  batch.events.push_back(Stored({0xffffffffffffffffull, 5}, std::nullopt, {1, 2, 3, 4}));
  batch.events.push_back(Stored({9}, 5, {7, 8}, 42));
  batch.adapter_names[42] = "sql";
  KvEvent removed;
  removed.kind = KvEvent::Kind::kRemoved;
  removed.hashes = {5, 9};
  batch.events.push_back(removed);
  batch.events.push_back(ClearedKvEventBatch("kv@m", 2).events[0]);
  const std::string payload = EncodeKvEventBatch(batch);

  msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& root = handle.get();
  ASSERT_EQ(root.type, msgpack::type::ARRAY);
  ASSERT_EQ(root.via.array.size, 3u);  // [ts, events, data parallel rank]
  EXPECT_EQ(root.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_NEAR(root.via.array.ptr[0].as<double>(), batch.ts, 1e-6);
  EXPECT_EQ(root.via.array.ptr[2].as<int>(), 0);
  const msgpack::object& events = root.via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 4u);

  const msgpack::object* stored = events.via.array.ptr[0].via.array.ptr;
  ASSERT_EQ(events.via.array.ptr[0].via.array.size, 8u);
  EXPECT_EQ(stored[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored[1].as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{0xffffffffffffffffull, 5}));
  EXPECT_TRUE(stored[2].is_nil());  // A first block: no parent.
  EXPECT_EQ(stored[3].as<std::vector<int32_t>>(), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(stored[4].as<int>(), 2);
  EXPECT_TRUE(stored[5].is_nil());  // No LoRA adapter.
  EXPECT_EQ(stored[6].as<std::string>(), "CPU");
  EXPECT_TRUE(stored[7].is_nil());

  const msgpack::object* with_adapter = events.via.array.ptr[1].via.array.ptr;
  EXPECT_EQ(with_adapter[2].as<uint64_t>(), 5u);
  EXPECT_EQ(with_adapter[5].as<uint64_t>(), 42u);
  EXPECT_EQ(with_adapter[7].as<std::string>(), "sql");

  const msgpack::object& gone = events.via.array.ptr[2];
  ASSERT_EQ(gone.via.array.size, 3u);
  EXPECT_EQ(gone.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(gone.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{5, 9}));
  EXPECT_EQ(gone.via.array.ptr[2].as<std::string>(), "CPU");

  const msgpack::object& cleared = events.via.array.ptr[3];
  ASSERT_EQ(cleared.via.array.size, 1u);
  EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
}

TEST(KvEventsTest, TheTopicNamesTheModelWhereAsked) {
  auto publisher = KvEventPublisher::Start({.endpoint = "tcp://127.0.0.1:*",
                                            .replay_endpoint = "",
                                            .topic = "kv@10.0.0.7@{model}"});
  ASSERT_TRUE(publisher.ok()) << publisher.status().message();
  EXPECT_EQ((*publisher)->TopicOf("qwen"), "kv@10.0.0.7@qwen");
  EXPECT_TRUE((*publisher)->endpoint().starts_with("tcp://127.0.0.1:"));
  EXPECT_NE((*publisher)->endpoint(), "tcp://127.0.0.1:*");  // The port resolved.
}

TEST(KvEventsTest, ABadAddressIsNamed) {
  auto publisher =
      KvEventPublisher::Start({.endpoint = "nonsense://x", .replay_endpoint = "", .topic = ""});
  ASSERT_FALSE(publisher.ok());
  EXPECT_NE(publisher.status().message().find("nonsense://x"), std::string::npos);
}

// Every frame of one message, waiting up to 5 s for it; empty on timeout.
std::vector<std::string> Receive(void* socket) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, 5000) <= 0) return {};
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) return {};
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return frames;
  }
}

int64_t Sequence(const std::string& bytes) {
  uint64_t value = 0;
  for (const char c : bytes) value = (value << 8) | static_cast<unsigned char>(c);
  return static_cast<int64_t>(value);
}

std::string StartAt(int64_t sequence) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(sequence & 0xff);
    sequence >>= 8;
  }
  return out;
}

TEST(KvEventsTest, SubscribersGetNumberedBatchesAndReplayWhatTheyMissed) {
  auto started = KvEventPublisher::Start({.endpoint = "tcp://127.0.0.1:*",
                                          .replay_endpoint = "tcp://127.0.0.1:*",
                                          .topic = "kv@{model}",
                                          .buffer_steps = 3});
  ASSERT_TRUE(started.ok()) << started.status().message();
  std::shared_ptr<KvEventPublisher> publisher = *started;
  void* context = zmq_ctx_new();
  void* sub = zmq_socket(context, ZMQ_SUB);
  ASSERT_EQ(zmq_connect(sub, publisher->endpoint().c_str()), 0);
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv@a", 4), 0);

  // A subscription reaches the publisher some time after connecting: until one batch arrives,
  // publish to another topic, which must not arrive.
  zmq_pollitem_t item{sub, 0, ZMQ_POLLIN, 0};
  int probes = 0;
  while (zmq_poll(&item, 1, 0) == 0 && probes < 500) {
    publisher->Publish(ClearedKvEventBatch("kv@a", 16));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ++probes;
  }
  ASSERT_LT(probes, 500) << "no batch reached the subscriber";
  publisher->Publish(ClearedKvEventBatch("kv@b", 16));  // Another topic: its own numbers.
  KvEventBatch last = NewKvEventBatch("kv@a", 16);
  last.events.push_back(Stored({11}, std::nullopt, std::vector<int32_t>(16, 3)));
  publisher->Publish(last);

  int64_t previous = -1;
  std::vector<std::string> frames;
  for (;;) {
    frames = Receive(sub);
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0], "kv@a");
    ASSERT_EQ(frames[1].size(), 8u);
    const int64_t sequence = Sequence(frames[1]);
    if (previous >= 0) {
      EXPECT_EQ(sequence, previous + 1);
    }
    previous = sequence;
    if (frames[2] == EncodeKvEventBatch(last)) break;  // After the probes.
  }
  EXPECT_EQ(previous, probes);  // 0..probes-1 were the probes (some before the subscription).

  // Replay from the first probe: the buffer holds the last 3 batches of all topics; this request
  // names topic kv@a, so kv@b's is left out.
  void* dealer = zmq_socket(context, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer, publisher->replay_endpoint().c_str()), 0);
  const std::string start = StartAt(0);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start.data(), start.size(), ZMQ_SNDMORE);
  zmq_send(dealer, "kv@a", 4, 0);
  std::vector<int64_t> replayed;
  for (;;) {
    frames = Receive(dealer);
    ASSERT_EQ(frames.size(), 3u);  // [empty, sequence, payload]
    EXPECT_TRUE(frames[0].empty());
    if (Sequence(frames[1]) == -1) {
      EXPECT_TRUE(frames[2].empty());
      break;
    }
    replayed.push_back(Sequence(frames[1]));
  }
  EXPECT_EQ(replayed, (std::vector<int64_t>{probes - 1, probes}));

  // A malformed request gets the end mark, and the publisher goes on.
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, "x", 1, 0);
  frames = Receive(dealer);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(Sequence(frames[1]), -1);

  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(context);
  EXPECT_EQ(publisher->dropped(), 0);
  publisher.reset();  // Stops its thread and closes its sockets.
}

}  // namespace
}  // namespace sluice::llm
