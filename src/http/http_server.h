// The HTTP/1.1 server: Boost.Beast on Asio, a small pool of I/O threads (an event loop each, with
// the connections dealt to them in turn), keep-alive (also for HTTP/1.0 clients that ask for it),
// TCP_NODELAY, one write per response. It parses requests, hands them to the route table, and
// writes whatever the handlers answer, in order per connection. Limits on header size, body size,
// idle time and open connections keep a hostile or broken client from costing more than it
// should.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "http/router.h"
#include "metrics/prometheus.h"
#include "metrics/trace.h"
#include "sluice/status.h"

namespace sluice {

struct HttpServerOptions {
  std::string host = "127.0.0.1";       // Address to bind; 127.0.0.1 unless told otherwise.
  uint16_t port = 8000;                 // 0: an ephemeral port (see HttpServer::port()).
  int io_threads = 2;                   // I/O threads, an event loop each; >= 1.
  int backlog = 1024;                   // listen() backlog; >= 512 recommended.
  size_t max_body_bytes = 64u << 20;    // Larger bodies are answered 413.
  size_t max_header_bytes = 16u << 10;  // Larger headers are answered 431.
  Seconds idle_timeout{60};    // A connection waiting this long for a request's first byte closes.
  Seconds header_timeout{10};  // From a request's first byte to its complete header; 408 after.
  Seconds body_timeout{60};    // From the complete header to the complete body; 408 after.
  // When set, every route but /v2/health/* needs "Authorization: Bearer <key>" or
  // "X-API-Key: <key>" (compared in constant time); otherwise 401.
  std::string api_key;
  int max_connections = 4096;  // Beyond this, new connections are closed at once.
  // Bytes of request bodies being read and of what handlers decode from them, server-wide, until
  // each request is answered; 0: a quarter of the machine's memory. A body whose declared length
  // (or, chunked, whose next chunk) does not fit is answered 503 with Retry-After before it is
  // read, and the connection closes. Must be >= max_body_bytes.
  size_t memory_budget_bytes = 0;
  // When set (not owned; it outlives the server), the requests it samples are traced: their
  // stages from first byte to last byte written. A `traceparent` header is echoed with the
  // server's span id whether or not tracing is on.
  TraceWriter* tracer = nullptr;
};

// Thread-safe. Start() once; Shutdown() once, from any thread.
class HttpServer {
 public:
  // `router` must outlive the server.
  HttpServer(HttpServerOptions options, const Router& router);
  ~HttpServer();  // Shutdown() with no grace.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. kUnavailable when the address cannot be bound.
  Status Start();

  // The bound port (the real one when options.port was 0).
  uint16_t port() const;

  // From now on every response carries Connection: close and its connection closes after it,
  // while new connections are still accepted: clients holding keep-alive connections reconnect,
  // through their load balancer, to another replica. The drain before Shutdown().
  void CloseConnectionsAfterResponses();

  // Stops accepting connections, waits (up to `grace`) until every request already read has
  // been answered, then closes all connections and joins the I/O threads.
  void Shutdown(Clock::duration grace);

  HttpStats stats() const;

  class Impl;  // Defined in http_server_impl.h (keeps Beast out of this header).

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
