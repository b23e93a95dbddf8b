// HTTP requests and responses as handlers see them.
//
// Handlers never see Boost.Beast: the server turns each parsed HTTP request into an HttpRequest and
// writes whatever HttpResponse the handler's responder is given (a whole body, or a ResponseStream
// of server-sent events).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/memory_budget.h"
#include "common/mutex.h"
#include "metrics/trace.h"
#include "sluice/status.h"

namespace sluice {

// Runs a function on the connection's I/O thread (for work that should leave engine threads), or,
// where the server sees that nothing waits behind it (a model batch of one), at once on the calling
// thread: the work touches the connection only through the responder.
using Poster = std::function<void(std::function<void()>)>;

struct HttpRequest {
  std::string method;                             // "GET", "POST", ...
  std::string path;                               // Without the query string.
  std::string query;                              // After the '?', as sent; may be empty.
  std::string content_type;                       // As sent; may be empty.
  std::string accept_encoding;                    // As sent; may be empty.
  std::string if_none_match;                      // As sent; may be empty.
  std::optional<size_t> inference_header_length;  // Inference-Header-Content-Length.
  std::string body;
  Clock::time_point arrived;   // When its first bytes were read (the deadline counts from it).
  Clock::time_point received;  // When the whole request had been read.
  Poster post;                 // Set by the server; runs work for this connection (see Poster).
  // Registers what to do if the client disconnects before it is answered (cancel the queued
  // request). Call at most once, from the handler itself (not from a later callback).
  std::function<void(std::function<void()>)> on_disconnect;
  // The bytes this request holds from the server's memory budget (its body, from the moment its
  // header arrived). A handler that keeps data past its return (decoded tensors, a copy of the
  // body) keeps this pointer alive as long as it keeps the data, and grows it by what it allocates:
  // a refused growth is answered with MemoryBudgetExceeded(). Null outside a server.
  std::shared_ptr<MemoryReservation> memory;
  // The route's admission ticket (see Admission), if it gave one: the handler keeps it until the
  // request is queued or answered.
  std::shared_ptr<const void> admission;
  // Set when this request is traced: a handler that runs a model stamps the engine's stages and
  // its encoding (SetEngineTimes, End(kRespond / kEncode)) before it responds; the server stamps
  // the rest. Touched by one thread at a time: the connection's, or the one its Poster ran on.
  std::shared_ptr<RequestTrace> trace;
  // Set on a request handled again after waiting for its model's load (WaitForLoad): it waits
  // no more.
  bool waited_for_load = false;
};

// The query string's parameters in order, names and values percent-decoded ('+' as a space); a
// parameter without '=' has an empty value. Nullopt for a malformed escape.
std::optional<std::vector<std::pair<std::string, std::string>>> QueryParameters(
    std::string_view query);

// 503 for a request that does not fit in the server's memory budget, naming what was asked and
// what is in use.
Status MemoryBudgetExceeded(const MemoryReservation& memory, size_t asked);

// The body of a streamed response (server-sent events), sent in HTTP/1.1 chunks as the producer
// writes it. Thread-safe: the producer writes from any thread; the server drains it on the
// connection's thread. What the producer posts as a renderer is made into bytes there, when the
// connection takes it (so a language model's event JSON is built on the I/O thread, not on the
// engine's loop), in order with what was written around it.
class ResponseStream {
 public:
  // Most bytes queued and not yet sent; beyond it the client counts as gone (too slow to read).
  static constexpr size_t kMaxPendingBytes = 4u << 20;

  // Queues `data`; false once the client is gone (the producer should stop and cancel).
  bool Write(std::string data);
  // Queues `render`, run on the connection's thread when it takes what is queued; `weight`: the
  // bytes it is expected to make, counted against kMaxPendingBytes until then. False once the
  // client is gone (and `render` is dropped unrun).
  bool Post(std::function<std::string()> render, size_t weight);
  // Ends the body. Write() or Post() after Close() is ignored.
  void Close();
  bool client_gone() const;

  // Server side. `wake` runs (from the producer's thread) whenever data or the end arrives.
  void Attach(std::function<void()> wake);
  // Takes what is queued, running its renderers (outside the lock) in order; `closed` tells
  // whether the end has been written. One caller at a time.
  std::string Take(bool* closed);
  // The client left or could not keep up: later writes fail, and queued renderers are dropped
  // (with whatever they hold).
  void MarkGone();

 private:
  // Written bytes, or a renderer (then `bytes` is empty).
  struct Piece {
    std::string bytes;
    std::function<std::string()> render;
  };
  // Queues `piece` counted as `weight` bytes.
  bool Queue(Piece piece, size_t weight);

  mutable Mutex mu_;
  std::vector<Piece> pending_ GUARDED_BY(mu_);
  size_t pending_bytes_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
  bool gone_ GUARDED_BY(mu_) = false;
  std::function<void()> wake_ GUARDED_BY(mu_);
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // Extra headers.
  // When set, `body` is ignored: the body is sent in chunks as the stream is written.
  std::shared_ptr<ResponseStream> stream;
  // When set (and no stream), it makes `body` on the connection's thread just before the answer
  // is sent, so a producer on another thread (a language model's loop) does not build it.
  std::function<std::string()> render;

  static HttpResponse Json(int status, std::string body);
  // A JSON answer whose body `render` makes on the connection's thread.
  static HttpResponse RenderedJson(int status, std::function<std::string()> render);
  // {"error": "<message>"} with the status's HTTP code; 503 adds Retry-After.
  static HttpResponse Error(const Status& status);
};

// Answers a request exactly once, from any thread.
using Responder = std::function<void(HttpResponse)>;

}  // namespace sluice
