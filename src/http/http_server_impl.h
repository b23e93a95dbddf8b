// The HTTP server's inside, shared by the server (http_server.cc: acceptor, I/O threads, counters,
// drain and shutdown) and its connections (http_session.cc: reading, answering and streaming one
// client's requests). Private to src/server; Beast stays out of http_server.h.
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/handoff_batch.h"
#include "common/histogram.h"
#include "common/memory_budget.h"
#include "common/mutex.h"
#include "http/http_server.h"

namespace sluice {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
// A connection's executor: the io_context of the one I/O thread that serves it, by its concrete
// type (Beast's tcp_stream would erase it). One thread per io_context serialises a connection's
// handlers without a strand, and a completion stays on the thread that caused it instead of
// waking another.
using Executor = net::io_context::executor_type;
using Socket = tcp::socket::rebind_executor<Executor>::other;
using Stream = beast::basic_stream<tcp, Executor>;
using Timer = net::basic_waitable_timer<std::chrono::steady_clock,
                                        net::wait_traits<std::chrono::steady_clock>, Executor>;

// What the server needs of a session: its start, and its drain at shutdown.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  // Reads the connection's first request; called once, after the server has registered it.
  virtual void Start() = 0;
  // Called from any thread once the server drains: an idle connection closes soon; one with
  // bytes waiting still has its request read and answered.
  virtual void BeginDrain() = 0;
};

// The session of a connection accepted on `socket` (http_session.cc), not yet started.
std::shared_ptr<SessionBase> MakeSession(Socket socket, HttpServer::Impl& server);

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, const Router& router)
      : options_(std::move(options)),
        router_(router),
        contexts_(MakeContexts(std::max(1, options_.io_threads))),
        sinks_(MakeSinks()),
        acceptor_(contexts_[0]->get_executor()),
        memory_budget_(options_.memory_budget_bytes > 0 ? options_.memory_budget_bytes
                                                        : MemoryBudget::DefaultLimit()),
        request_seconds_(Histogram::LatencySecondsBuckets()) {
    for (auto& count : responses_) count.store(0);
  }

  Status Start();
  uint16_t port() const { return port_; }
  void Shutdown(Clock::duration grace);
  HttpStats stats() const;

  // Used by sessions.
  const HttpServerOptions& options() const { return options_; }
  TraceWriter* tracer() const { return options_.tracer; }
  uint64_t NextConnectionId() { return next_connection_id_.fetch_add(1) + 1; }
  const Router& router() const { return router_; }
  MemoryBudget& memory_budget() { return memory_budget_; }
  bool draining() const { return draining_.load(); }
  // Responses close their connections: draining, or told to (CloseConnectionsAfterResponses).
  bool keep_alive_allowed() const { return !draining_.load() && !no_keep_alive_.load(); }
  void CloseConnectionsAfterResponses() { no_keep_alive_.store(true); }
  void RequestStarted() { inflight_.fetch_add(1); }
  void HandedOff() { handoffs_.fetch_add(1, std::memory_order_relaxed); }
  void AnsweredInPlace() { answers_in_place_.fetch_add(1, std::memory_order_relaxed); }
  // The sink that hands work to the I/O thread running `executor`, a batch at a time.
  HandOffBatch::Sink& SinkFor(const Executor& executor) {
    for (size_t i = 0; i < contexts_.size(); ++i) {
      if (&executor.context() == contexts_[i].get()) return *sinks_[i];
    }
    return *sinks_[0];  // Not reached: every connection runs on one of contexts_.
  }
  // `done`: when the answer left (or failed).
  void RequestFinished(int status, Clock::time_point received,
                       Clock::time_point done = Clock::Real().Now()) {
    if (status >= 100 && status < 600) responses_[static_cast<size_t>(status)].fetch_add(1);
    request_seconds_.Observe(SecondsBetween(received, done));
    inflight_.fetch_sub(1);
  }
  void ConnectionOpened() {
    open_connections_.fetch_add(1);
    accepted_connections_.fetch_add(1);
  }
  void ConnectionClosed() { open_connections_.fetch_sub(1); }

 private:
  void Accept();
  void OnAccept(beast::error_code ec, Socket socket);
  // Starts a session on `socket` and remembers it for shutdown.
  void StartSession(Socket socket);

  const HttpServerOptions options_;
  const Router& router_;
  // One io_context per I/O thread, each told it runs on one thread (concurrency hint 1): its
  // completions queue on that thread without a lock or a wake-up. Connections are dealt to them
  // in turn; the acceptor runs on the first.
  static std::vector<std::unique_ptr<net::io_context>> MakeContexts(int count) {
    std::vector<std::unique_ptr<net::io_context>> contexts;
    for (int i = 0; i < count; ++i) contexts.push_back(std::make_unique<net::io_context>(1));
    return contexts;
  }
  // The executor of the I/O thread that serves the next connection.
  Executor NextExecutor() {
    return contexts_[next_context_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()]
        ->get_executor();
  }

  // Delivers a batch of hand-offs to one I/O thread as one posted handler.
  class ContextSink final : public HandOffBatch::Sink {
   public:
    ContextSink(net::io_context& context, std::atomic<int64_t>& handoffs)
        : context_(context), handoffs_(handoffs) {}
    void Deliver(std::vector<std::function<void()>> works) override {
      handoffs_.fetch_add(1, std::memory_order_relaxed);
      net::post(context_, [works = std::move(works)]() mutable {
        for (auto& work : works) work();
      });
    }

   private:
    net::io_context& context_;
    std::atomic<int64_t>& handoffs_;
  };
  std::vector<std::unique_ptr<ContextSink>> MakeSinks() {
    std::vector<std::unique_ptr<ContextSink>> sinks;
    for (const auto& context : contexts_) {
      sinks.push_back(std::make_unique<ContextSink>(*context, handoffs_));
    }
    return sinks;
  }

  // Work handed to an I/O thread from another thread: request.post calls, a batch's together.
  std::atomic<int64_t> handoffs_{0};
  std::atomic<int64_t> answers_in_place_{0};
  std::vector<std::unique_ptr<net::io_context>> contexts_;
  std::vector<std::unique_ptr<ContextSink>> sinks_;
  std::atomic<size_t> next_context_{0};
  // Keep the I/O threads running until Shutdown() ends, even while no operation is pending: an
  // answer or a drain notice posted to a connection after the acceptor closed still runs.
  std::vector<net::executor_work_guard<Executor>> work_;
  tcp::acceptor acceptor_;
  MemoryBudget memory_budget_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> no_keep_alive_{false};
  std::atomic<int64_t> inflight_{0};
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> accepted_connections_{0};
  std::atomic<int64_t> refused_connections_{0};
  std::atomic<uint64_t> next_connection_id_{0};
  std::array<std::atomic<int64_t>, 600> responses_;
  Histogram request_seconds_;
  std::once_flag shutdown_once_;
  Mutex sessions_mu_;
  std::vector<std::weak_ptr<SessionBase>> sessions_
      GUARDED_BY(sessions_mu_);  // Pruned as it grows.
};

}  // namespace sluice
