// Boost.Beast HTTP/1.1 server: the acceptor, one io_context and thread per I/O thread, the
// counters, the drain and graceful shutdown. Each connection is a session (http_session.cc).
#include "http/http_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/beast/http.hpp>
#include <future>

#include "common/system_info.h"
#include "http/http_server_impl.h"

namespace sluice {

Status HttpServer::Impl::Start() {
  if (memory_budget_.limit() < options_.max_body_bytes) {
    return Status::InvalidArgument(
        fmt::format("the memory budget ({} bytes) is smaller than the largest body allowed ({} "
                    "bytes): raise the budget or lower the body limit",
                    memory_budget_.limit(), options_.max_body_bytes));
  }
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(options_.host, ec);
  if (ec) return Status::InvalidArgument(fmt::format("invalid host '{}'", options_.host));
  tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(options_.backlog, ec);
  if (ec) {
    return Status::Unavailable(
        fmt::format("cannot listen on {}:{}: {}", options_.host, options_.port, ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  for (const auto& context : contexts_) {
    work_.push_back(net::make_work_guard(context->get_executor()));
    threads_.emplace_back([io = context.get()] {
      NameThisThread("sluice-io");
      io->run();
    });
  }
  return Status::Ok();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(NextExecutor(), beast::bind_front_handler(&Impl::OnAccept, this));
}

void HttpServer::Impl::OnAccept(beast::error_code ec, Socket socket) {
  if (ec == net::error::operation_aborted) return;
  // A connection accepted just as shutdown closed the acceptor is still served.
  if (!ec) {
    if (open_connections_.load() >= options_.max_connections) {
      refused_connections_.fetch_add(1);
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      StartSession(std::move(socket));
    }
  } else if (acceptor_.is_open()) {
    spdlog::warn("accept failed: {}", ec.message());
  }
  if (acceptor_.is_open()) Accept();
}

void HttpServer::Impl::StartSession(Socket socket) {
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  std::shared_ptr<SessionBase> session = MakeSession(std::move(socket), *this);
  {
    MutexLock lock(sessions_mu_);
    if (sessions_.size() >= 1024 && sessions_.size() % 1024 == 0) {
      std::erase_if(sessions_, [](const auto& weak) { return weak.expired(); });
    }
    sessions_.push_back(session);
  }
  session->Start();
}

void HttpServer::Impl::Shutdown(Clock::duration grace) {
  std::call_once(shutdown_once_, [&] {
    draining_ = true;
    if (!threads_.empty()) {
      // Connections the kernel completed before the signal are taken (and their requests
      // answered); then the listening socket closes.
      std::promise<void> closed;
      net::post(acceptor_.get_executor(), [&] {
        beast::error_code ec;
        acceptor_.non_blocking(true, ec);
        while (!ec) {
          Socket socket(NextExecutor());
          acceptor_.accept(socket, ec);
          if (!ec) StartSession(std::move(socket));
        }
        acceptor_.close(ec);
        closed.set_value();
      });
      closed.get_future().wait();
      std::vector<std::shared_ptr<SessionBase>> live;
      {
        MutexLock lock(sessions_mu_);
        for (const auto& weak : sessions_) {
          if (auto session = weak.lock()) live.push_back(std::move(session));
        }
      }
      for (const auto& session : live) session->BeginDrain();
      live.clear();
      // Every connection finishes: requests read (or arriving within the drain timeout) are
      // answered with Connection: close; idle ones close.
      const Clock::time_point until = Clock::Real().Now() + grace;
      while ((open_connections_.load() > 0 || inflight_.load() > 0) &&
             Clock::Real().Now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (open_connections_.load() > 0 || inflight_.load() > 0) {
        spdlog::warn("shutdown grace expired with {} connection(s) and {} request(s) open",
                     open_connections_.load(), inflight_.load());
      }
    }
    work_.clear();
    for (const auto& context : contexts_) context->stop();
    for (std::thread& t : threads_) t.join();
  });
}

HttpStats HttpServer::Impl::stats() const {
  HttpStats s;
  for (size_t code = 100; code < responses_.size(); ++code) {
    int64_t n = responses_[code].load();
    if (n > 0) s.responses_by_status.emplace_back(static_cast<int>(code), n);
  }
  s.open_connections = open_connections_.load();
  s.accepted_connections = accepted_connections_.load();
  s.refused_connections = refused_connections_.load();
  s.memory_budget_bytes = static_cast<int64_t>(memory_budget_.limit());
  s.memory_in_use_bytes = static_cast<int64_t>(memory_budget_.in_use());
  s.memory_refusals = memory_budget_.refusals();
  s.handoffs = handoffs_.load(std::memory_order_relaxed);
  s.answers_in_place = answers_in_place_.load(std::memory_order_relaxed);
  s.request_seconds = request_seconds_.Snapshot();
  return s;
}

HttpServer::HttpServer(HttpServerOptions options, const Router& router)
    : impl_(std::make_unique<Impl>(std::move(options), router)) {}

HttpServer::~HttpServer() { Shutdown(Clock::duration::zero()); }

Status HttpServer::Start() { return impl_->Start(); }
uint16_t HttpServer::port() const { return impl_->port(); }
void HttpServer::Shutdown(Clock::duration grace) { impl_->Shutdown(grace); }
void HttpServer::CloseConnectionsAfterResponses() { impl_->CloseConnectionsAfterResponses(); }
HttpStats HttpServer::stats() const { return impl_->stats(); }

}  // namespace sluice
