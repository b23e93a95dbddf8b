// KV events for cache-aware routers (llm-d's precise prefix scorer, NVIDIA Dynamo's KV router,
// KServe's LLMInferenceService): what each language model's prefix cache holds, published as vLLM
// publishes it, so a router that reads vLLM's stream reads Sluice's.
//
// The wire format (vLLM's ZmqEventPublisher): a PUB socket sends multipart messages
// [topic, sequence (8 bytes, big-endian, from 0, one stream per topic), payload]; the payload is
// a msgpack EventBatch, an array [ts (float seconds since the epoch), [event...], data parallel
// rank (0)], each event a tagged array (msgspec's array_like layout, the tag first):
//   ["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size, lora_id | nil,
//    medium, lora_name | nil]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// Block hashes are unsigned 64-bit integers; a block's parent is the block before it (nil for a
// sequence's first block); token_ids are the stored blocks' tokens in order; medium is "CPU".
// Replay (optional): a ROUTER socket answers a request [empty, start sequence (8 bytes,
// big-endian)] from a REQ socket (or a DEALER sending the empty frame) with one message
// [empty, sequence, payload] for each batch still buffered from `start` on, then [empty, -1 (8
// bytes), empty]. A fourth request frame names the topic replayed; without it, every topic's
// batches are replayed (one topic, unless the topic names the model and several are served).
//
// Thread-safe: engines' loops Publish(); one thread of its own encodes and sends (a slow
// subscriber never holds up a step: ZeroMQ drops at the high-water mark, and a full queue drops
// its oldest batch, counted in dropped()).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "sluice/status.h"
#include "llm/block_pool.h"

namespace sluice::llm {

struct KvEventsOptions {
  // The PUB socket's address: bound where it has '*' or '::' or is ipc:// or inproc:// (a server
  // listening), else connected (to a router's bound SUB socket), as vLLM decides.
  std::string endpoint;
  std::string replay_endpoint;  // The ROUTER socket's address, bound; empty: no replay.
  // Each message's topic; "{model}" in it stands for the model's name (llm-d reads its pod and
  // model from a topic such as "kv@10.0.0.7@{model}").
  std::string topic;
  int buffer_steps = 10000;  // Batches kept for replay.
  int hwm = 100000;          // The PUB socket's send high-water mark (messages).
  int max_queue = 10000;     // Batches waiting for the sending thread; beyond: the oldest dropped.
};

// One step's events of one model's cache.
struct KvEventBatch {
  std::string topic;
  double ts = 0;  // Seconds since the epoch.
  int block_size = 16;
  std::vector<KvEvent> events;
  // The names of the LoRA adapters the events' blocks belong to (lora_name), by adapter id.
  std::unordered_map<uint64_t, std::string> adapter_names;
};

// A batch for `topic` stamped now, with no events; or holding one AllBlocksCleared.
KvEventBatch NewKvEventBatch(std::string topic, int block_size);
KvEventBatch ClearedKvEventBatch(std::string topic, int block_size);

// The batch's msgpack payload, as above.
std::string EncodeKvEventBatch(const KvEventBatch& batch);

class KvEventPublisher {
 public:
  // Opens the sockets (kInvalidArgument naming an address ZeroMQ refuses) and starts the thread.
  static Result<std::shared_ptr<KvEventPublisher>> Start(KvEventsOptions options);
  // Sends what is queued (for at most a second: the sockets linger that long), then closes.
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  std::string TopicOf(const std::string& model) const;
  // The sockets' addresses as opened (a bound wildcard port resolved: tcp://127.0.0.1:*).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  // Queues `batch` (its topic set) for sending; never waits on the network.
  void Publish(KvEventBatch batch);

  int64_t published() const;  // Batches sent.
  int64_t dropped() const;    // Batches dropped from a full queue.

 private:
  explicit KvEventPublisher(KvEventsOptions options);
  void Run();
  void Send(const KvEventBatch& batch);
  void ServeReplay();

  const KvEventsOptions options_;
  std::string endpoint_, replay_endpoint_;
  void* context_ = nullptr;
  void* pub_ = nullptr;     // Sending thread only (after Start).
  void* replay_ = nullptr;  // Sending thread only (after Start).

  mutable Mutex mu_;
  CondVar wake_;
  std::deque<KvEventBatch> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t published_ GUARDED_BY(mu_) = 0;
  int64_t dropped_ GUARDED_BY(mu_) = 0;

  // Sending thread only.
  std::map<std::string, uint64_t> next_sequence_;  // By topic.
  struct Sent {
    std::string topic;
    uint64_t sequence;
    std::string payload;
  };
  std::deque<Sent> sent_;  // For replay, oldest first.

  std::thread thread_;
};

}  // namespace sluice::llm
