// Request traces: each sampled request's stages as Chrome / Perfetto trace-event JSON, and the
// W3C Trace Context `traceparent` header.
//
// A request's stages run back to back: each starts where the one before it ended, so the stage
// spans tile the request's span exactly. Stages a request never reached (a request refused before
// it was queued, a streamed answer) are left out and the next present stage starts where the last
// present one ended. Every request is one root span on its lane (a connection, or a slot of the
// benchmark) with its stages nested inside; the batches it joined also appear once each on their
// instance's lane. Timestamps are microseconds of the steady clock since the file was opened.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "sluice/request.h"
#include "sluice/status.h"

namespace sluice {

// A parsed `traceparent` header (W3C Trace Context, version 00).
struct TraceContext {
  std::array<uint8_t, 16> trace_id{};
  uint64_t parent_id = 0;  // The caller's span.
  uint8_t flags = 0;       // Bit 0: the caller samples this trace.

  bool sampled() const { return (flags & 1) != 0; }
};

// The header's context, or nothing when it is malformed or all-zero (the caller then starts a
// new trace, as the specification says). Unknown future versions are read by their version-00
// prefix.
std::optional<TraceContext> ParseTraceparent(std::string_view header);
// "00-<trace id>-<span_id>-<flags>": the header a callee sends on, naming its own span.
std::string FormatTraceparent(const TraceContext& context, uint64_t span_id);
// A random non-zero span id.
uint64_t NewSpanId();

// The stages of one request, in order. A server's request passes kRead..kWrite; the benchmark's
// client side of one passes kDelay..kReceive (over HTTP) or kSubmit..kComplete (in-process).
enum class TraceStage {
  kDelay,     // Benchmark, open loop: due but waiting for an idle connection.
  kSend,      // Benchmark: the request written to the socket.
  kRead,      // First byte of the request to the whole request read.
  kDecode,    // Parse and decode into tensors, up to the model's queue.
  kSubmit,    // Benchmark, in-process: handed to the model's scheduler.
  kQueue,     // Waiting in the model's queue.
  kBatch,     // Taken into a batch until that batch starts running.
  kCompute,   // The batch on its instance: collate, forward, split.
  kRespond,   // Outputs ready until the encoder picks them up.
  kEncode,    // The response body.
  kHandle,    // Whatever came after the last stage above until the answer was handed to the
              // socket: all of it for a request no model ran; the error for one that failed.
  kWrite,     // The answer written to the socket (the whole stream for a streamed one).
  kReceive,   // Benchmark: from the request written to its answer read.
  kComplete,  // Benchmark, in-process: outputs ready until the benchmark has them.
};
inline constexpr int kTraceStageCount = 14;
const char* TraceStageName(TraceStage stage);

// One traced request. Filled by the transport and the handler; the writer formats it.
struct RequestTrace {
  std::string name;         // The root span's name, e.g. "POST /v2/models/resnet18/infer".
  Clock::time_point start;  // Its first stage's start.
  // When each stage ended (the epoch: the request did not pass through it).
  std::array<Clock::time_point, kTraceStageCount> ends{};
  uint64_t lane = 0;  // The connection (server) or slot (benchmark) that carried it.
  int status = 0;     // HTTP status, 0 when none applies.
  std::string model;  // Empty when no model ran it.
  uint64_t batch_id = 0;
  int batch_size = 0;
  int instance = -1;
  // W3C Trace Context ids, written when non-zero: the trace, the caller's span (a server's
  // request that came with a traceparent) and this request's own span.
  std::array<uint8_t, 16> trace_id{};
  uint64_t parent_span_id = 0;
  uint64_t span_id = 0;

  void End(TraceStage stage, Clock::time_point at) { ends[static_cast<size_t>(stage)] = at; }
  // The engine's stamps (queued, batched, computed) of a request a model ran.
  void SetEngineTimes(const InferResponse& response);
};

// Assigns each span a lane on which it overlaps no other, reusing lanes (the lowest free one).
// Thread-compatible.
class TraceLanes {
 public:
  // A lane from 1 whose spans all ended by `start`.
  uint64_t Assign(Clock::time_point start, Clock::time_point end);

 private:
  std::vector<Clock::time_point> ends_;  // Per lane, its last span's end.
};

struct TraceOptions {
  std::filesystem::path path;
  // Fraction of requests traced, in [0, 1]; every 1/rate-th request, deterministically. A request
  // whose traceparent says "sampled" is traced whatever the rate.
  double sample_rate = 1;
  std::string process_name = "sluice";
  std::string lane_prefix = "connection";  // Lanes are named "<prefix> <lane>".
  // Past this many bytes the file is closed off and later requests are dropped (counted).
  size_t max_bytes = size_t{1} << 30;
  // Traces waiting for the writer thread beyond which new ones are dropped (counted).
  size_t max_pending = 65536;
};

// Writes traces to one file on its own thread, so a request pays for a struct handed over, not
// for JSON or disk. Thread-safe.
class TraceWriter {
 public:
  // Creates (truncates) the file and starts the writer thread.
  static Result<std::unique_ptr<TraceWriter>> Open(TraceOptions options);
  ~TraceWriter();  // Close().
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Whether to trace the next request (`forced`: its caller sampled it).
  bool ShouldSample(bool forced = false);
  // Hands one request over; dropped (and counted) when the writer is behind or the file full.
  void Record(RequestTrace trace);
  // Writes what is pending and the closing bracket; later Record() calls are dropped. Idempotent.
  Status Close();

  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  const std::filesystem::path& path() const { return options_.path; }

 private:
  TraceWriter(TraceOptions options, std::FILE* file);
  void WriterLoop();
  // Appends one request's events (and its lane's and batches' first mentions) to `out`.
  void Format(const RequestTrace& trace, std::string& out);
  int64_t Nanos(Clock::time_point t) const;  // Since the file was opened, >= 0.

  const TraceOptions options_;
  const Clock::time_point origin_;
  std::FILE* file_;  // Owned by the writer thread once started.
  std::atomic<uint64_t> sample_counter_{0};
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> dropped_{0};

  Mutex mu_;
  CondVar wake_;
  std::vector<RequestTrace> pending_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  Status close_status_ GUARDED_BY(mu_);

  // Writer thread only.
  size_t bytes_ = 0;
  bool full_ = false;
  std::unordered_set<uint64_t> named_lanes_;
  std::unordered_map<std::string, uint64_t> instance_lanes_;  // "<model> instance <i>" -> lane.
  std::unordered_set<uint64_t> batches_seen_;  // Hash of (model, batch id); cleared when large.

  std::thread writer_;
};

}  // namespace sluice
