#include "llm/kv_events.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <zmq.h>

#include <chrono>
#include <cstring>
#include <msgpack.hpp>
#include <utility>

namespace sluice::llm {

namespace {

constexpr const char* kMedium = "CPU";  // Where Sluice's KV cache lives: host memory.

std::string BigEndian(int64_t value) {
  std::string out(8, '\0');
  auto bits = static_cast<uint64_t>(value);
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(bits & 0xff);
    bits >>= 8;
  }
  return out;
}

// The address `socket` opened last (a wildcard port resolved), else `fallback`.
std::string LastEndpoint(void* socket, const std::string& fallback) {
  char address[512];
  size_t size = sizeof(address);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, address, &size) != 0 || size <= 1) {
    return fallback;
  }
  return std::string(address);
}

bool BindsRatherThanConnects(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

// Sends `frames` as one multipart message; false when ZeroMQ would block or fails.
bool SendFrames(void* socket, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) return false;
  }
  return true;
}

// Receives one multipart message (every frame), or nothing when none waits.
std::vector<std::string> ReceiveFrames(void* socket) {
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return frames;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return frames;
  }
}

}  // namespace

KvEventBatch NewKvEventBatch(std::string topic, int block_size) {
  KvEventBatch batch;
  batch.topic = std::move(topic);
  batch.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                 .count();
  batch.block_size = block_size;
  return batch;
}

KvEventBatch ClearedKvEventBatch(std::string topic, int block_size) {
  KvEventBatch batch = NewKvEventBatch(std::move(topic), block_size);
  batch.events.emplace_back().kind = KvEvent::Kind::kCleared;
  return batch;
}

std::string EncodeKvEventBatch(const KvEventBatch& batch) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> out(buffer);
  out.pack_array(3);
  out.pack_double(batch.ts);
  out.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& event : batch.events) {
    switch (event.kind) {
      case KvEvent::Kind::kStored: {
        out.pack_array(8);
        out.pack(std::string_view("BlockStored"));
        out.pack(event.hashes);
        if (event.parent) {
          out.pack_uint64(*event.parent);
        } else {
          out.pack_nil();
        }
        out.pack(event.tokens);
        out.pack_int32(batch.block_size);
        auto name = batch.adapter_names.find(event.adapter);
        if (event.adapter == 0) {
          out.pack_nil();
        } else {
          out.pack_uint64(event.adapter);
        }
        out.pack(std::string_view(kMedium));
        if (event.adapter == 0 || name == batch.adapter_names.end()) {
          out.pack_nil();
        } else {
          out.pack(name->second);
        }
        break;
      }
      case KvEvent::Kind::kRemoved:
        out.pack_array(3);
        out.pack(std::string_view("BlockRemoved"));
        out.pack(event.hashes);
        out.pack(std::string_view(kMedium));
        break;
      case KvEvent::Kind::kCleared:
        out.pack_array(1);
        out.pack(std::string_view("AllBlocksCleared"));
        break;
    }
  }
  out.pack_int32(0);  // The data parallel rank: one engine per model.
  return std::string(buffer.data(), buffer.size());
}

KvEventPublisher::KvEventPublisher(KvEventsOptions options) : options_(std::move(options)) {}

Result<std::shared_ptr<KvEventPublisher>> KvEventPublisher::Start(KvEventsOptions options) {
  if (options.endpoint.empty()) return Status::InvalidArgument("KV events: no endpoint");
  std::shared_ptr<KvEventPublisher> publisher(new KvEventPublisher(std::move(options)));
  const KvEventsOptions& o = publisher->options_;
  publisher->context_ = zmq_ctx_new();
  if (publisher->context_ == nullptr) return Status::Internal("KV events: no ZeroMQ context");
  publisher->pub_ = zmq_socket(publisher->context_, ZMQ_PUB);
  const int hwm = o.hwm;
  const int linger_ms = 1000;
  zmq_setsockopt(publisher->pub_, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  zmq_setsockopt(publisher->pub_, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
  const int opened = BindsRatherThanConnects(o.endpoint)
                         ? zmq_bind(publisher->pub_, o.endpoint.c_str())
                         : zmq_connect(publisher->pub_, o.endpoint.c_str());
  if (opened != 0) {
    return Status::InvalidArgument(
        fmt::format("KV events: cannot open '{}': {}", o.endpoint, zmq_strerror(zmq_errno())));
  }
  publisher->endpoint_ = LastEndpoint(publisher->pub_, o.endpoint);
  if (!o.replay_endpoint.empty()) {
    publisher->replay_ = zmq_socket(publisher->context_, ZMQ_ROUTER);
    const int no_linger = 0;
    const int replies = o.buffer_steps + 1;  // A whole replay and its end mark.
    zmq_setsockopt(publisher->replay_, ZMQ_LINGER, &no_linger, sizeof(no_linger));
    zmq_setsockopt(publisher->replay_, ZMQ_SNDHWM, &replies, sizeof(replies));
    if (zmq_bind(publisher->replay_, o.replay_endpoint.c_str()) != 0) {
      return Status::InvalidArgument(fmt::format("KV events: cannot bind the replay socket '{}': {}",
                                                 o.replay_endpoint, zmq_strerror(zmq_errno())));
    }
    publisher->replay_endpoint_ = LastEndpoint(publisher->replay_, o.replay_endpoint);
  }
  publisher->thread_ = std::thread([p = publisher.get()] { p->Run(); });
  return publisher;
}

KvEventPublisher::~KvEventPublisher() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (replay_ != nullptr) zmq_close(replay_);
  if (pub_ != nullptr) zmq_close(pub_);
  if (context_ != nullptr) zmq_ctx_term(context_);  // Waits out the PUB socket's linger.
}

std::string KvEventPublisher::TopicOf(const std::string& model) const {
  std::string topic = options_.topic;
  for (size_t at = topic.find("{model}"); at != std::string::npos;
       at = topic.find("{model}", at + model.size())) {
    topic.replace(at, 7, model);
  }
  return topic;
}

void KvEventPublisher::Publish(KvEventBatch batch) {
  {
    MutexLock lock(mu_);
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {
      queue_.pop_front();
      if (dropped_++ == 0) {
        spdlog::warn("KV events: the queue is full ({} batches); dropping the oldest",
                     options_.max_queue);
      }
    }
    queue_.push_back(std::move(batch));
  }
  wake_.Signal();
}

int64_t KvEventPublisher::published() const {
  MutexLock lock(mu_);
  return published_;
}

int64_t KvEventPublisher::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

void KvEventPublisher::Run() {
  // With a replay socket the thread also looks for requests, every 10 ms while idle.
  const auto idle = replay_ != nullptr ? std::chrono::milliseconds(10)
                                       : std::chrono::milliseconds(200);
  for (;;) {
    std::deque<KvEventBatch> batches;
    bool stop = false;
    {
      MutexLock lock(mu_);
      if (queue_.empty() && !stopping_) wake_.WaitFor(lock, idle);
      batches.swap(queue_);
      stop = stopping_;
    }
    for (const KvEventBatch& batch : batches) Send(batch);
    if (!batches.empty()) {
      MutexLock lock(mu_);
      published_ += static_cast<int64_t>(batches.size());
    }
    if (replay_ != nullptr) ServeReplay();
    if (stop) {
      MutexLock lock(mu_);
      if (queue_.empty()) return;
    }
  }
}

void KvEventPublisher::Send(const KvEventBatch& batch) {
  const uint64_t sequence = next_sequence_[batch.topic]++;
  std::string payload = EncodeKvEventBatch(batch);
  // At the high-water mark ZeroMQ drops the message for that subscriber; it can replay it.
  SendFrames(pub_, {batch.topic, BigEndian(static_cast<int64_t>(sequence)), payload});
  if (replay_ == nullptr) return;
  sent_.push_back(Sent{batch.topic, sequence, std::move(payload)});
  while (static_cast<int>(sent_.size()) > options_.buffer_steps) sent_.pop_front();
}

void KvEventPublisher::ServeReplay() {
  for (;;) {
    const std::vector<std::string> request = ReceiveFrames(replay_);
    if (request.empty()) return;
    // [identity, empty, start] from a REQ socket; a fourth frame: the topic.
    if (request.size() < 3 || request.size() > 4 || !request[1].empty() ||
        request[2].size() != 8) {
      spdlog::warn("KV events: a replay request of {} frames is not [empty, 8-byte sequence]",
                   request.size() - 1);
      if (request.size() >= 2) SendFrames(replay_, {request[0], "", BigEndian(-1), ""});
      continue;
    }
    uint64_t start = 0;
    for (const char c : request[2]) start = (start << 8) | static_cast<unsigned char>(c);
    const std::string* topic = request.size() == 4 ? &request[3] : nullptr;
    for (const Sent& sent : sent_) {
      if (sent.sequence < start || (topic != nullptr && sent.topic != *topic)) continue;
      SendFrames(replay_,
                 {request[0], "", BigEndian(static_cast<int64_t>(sent.sequence)), sent.payload});
    }
    SendFrames(replay_, {request[0], "", BigEndian(-1), ""});
  }
}

}  // namespace sluice::llm
