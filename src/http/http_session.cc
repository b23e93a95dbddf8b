// One client connection of the HTTP server: reads its requests one at a time, hands them to the
// router, and writes their answers (whole, streamed, or sent in place from the instance's thread)
// in order; timeouts, body limits and the memory budget, the drain at shutdown.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <charconv>
#include <optional>
#include <utility>

#include "common/constant_time.h"
#include "common/json_writer.h"
#include "http/http_server_impl.h"
#include "http/http_wire.h"

namespace sluice {
namespace {

// How long a connection may take to deliver a request's first bytes once the server drains.
constexpr std::chrono::milliseconds kDrainReadTimeout{200};
// How long a connection closed with part of a request unread is read (and the bytes dropped)
// after the answer, so the close does not reset the connection before the client reads it.
constexpr std::chrono::seconds kLingerTimeout{2};
// A request refused at its header whose body is at most this is still read (and dropped), so its
// connection stays open; a larger one is not read and the connection closes. Photographs fit.
constexpr uint64_t kReadRefusedBodyBytes = 1u << 20;
// Refusals for overload on one connection leave at most one per this interval: the first at
// once, one that follows within the interval when it has passed. A client that sends again at
// once on every connection (load generators do) then cannot turn refusals into a loop that takes
// the cores the model needs to work its queue down; admitted requests are never held.
constexpr std::chrono::milliseconds kOverloadRefusalInterval{250};

template <typename Duration>
std::chrono::steady_clock::duration Steady(Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(d);
}

bool HasHeader(const HttpResponse& response, std::string_view name) {
  return std::any_of(response.headers.begin(), response.headers.end(),
                     [&](const auto& header) { return beast::iequals(header.first, name); });
}

// An answer sent by Session::AnswerInPlace, for the connection's thread to finish.
struct SentInPlace {
  std::string head;
  std::string body;
  size_t sent = 0;      // Bytes of head and body the socket took.
  bool failed = false;  // The send failed: the client is gone.
  int status = 0;
  bool keep_alive = false;
  Clock::time_point at;  // When the send returned.
};

// One client connection. Requests are read one at a time and answered in order; the next request
// is read only after the response is written, so pipelined requests queue in the read buffer.
class Session : public SessionBase, public std::enable_shared_from_this<Session> {
 public:
  Session(Socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)),
        server_(server),
        sink_(server.SinkFor(stream_.get_executor())),
        fd_(stream_.socket().native_handle()),
        id_(server.NextConnectionId()) {
    server_.ConnectionOpened();
    // A chunked body's next chunk is charged to the memory budget before it is read, and the
    // body's string grows once per chunk to what was charged.
    on_chunk_header_ = [this](uint64_t size, beast::string_view, beast::error_code& ec) {
      std::string& body = parser_->get().body();
      const size_t needed = body.size() + static_cast<size_t>(size);
      if (needed <= body.capacity()) return;
      const size_t capacity = std::min(std::max(needed, 2 * body.capacity()),
                                       std::max(needed, server_.options().max_body_bytes));
      if (!memory_->GrowTo(capacity)) {
        memory_refused_bytes_ = capacity - memory_->bytes();
        ec = http::error::body_limit;
        return;
      }
      body.reserve(capacity);
    };
  }
  ~Session() { server_.ConnectionClosed(); }

  void Start() override {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::ReadHeader, shared_from_this()));
  }

  void BeginDrain() override {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      // Idle between requests: end the wait now (a pending read keeps its old deadline).
      if (self->reading_header_ && self->buffer_.size() == 0) {
        beast::error_code ignored;
        self->stream_.socket().cancel(ignored);
      }
    });
  }

 private:
  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.options().max_header_bytes));
    parser_->body_limit(server_.options().max_body_bytes);
    parser_->on_chunk_header(on_chunk_header_);
    memory_.reset();
    admission_.reset();
    memory_refused_bytes_ = 0;
    refusal_.reset();
    refusal_timed_ = false;
    trace_.reset();
    traceparent_.clear();
    reading_header_ = true;
    if (buffer_.size() > 0) {
      // A pipelined request: its bytes were read with the last one's.
      read_start_ = Clock::Real().Now();
      return ReadRestOfHeader();
    }
    // Idle until the request's first bytes (idle timeout), then the header must complete within
    // the header timeout: a client trickling a byte a second cannot hold the connection for long.
    stream_.expires_after(server_.draining() ? Steady(kDrainReadTimeout)
                                             : Steady(server_.options().idle_timeout));
    stream_.async_read_some(buffer_.prepare(16384),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec == net::error::operation_aborted && self->server_.draining() &&
                                  self->stream_.socket().is_open()) {
                                // Cancelled by the drain (BeginDrain): read again under the drain's
                                // short deadline, so a request whose bytes already wait, or are on
                                // their way from a client that connected just before the listener
                                // closed, is still read and answered; a connection that stays idle
                                // closes when the deadline passes.
                                return self->ReadHeader();
                              }
                              if (ec) {
                                self->reading_header_ = false;
                                return self->OnReadError(ec);
                              }
                              // The request's arrival: its deadline and its trace start here.
                              self->read_start_ = Clock::Real().Now();
                              self->buffer_.commit(n);
                              self->ReadRestOfHeader();
                            });
  }

  // Beast's own timeout closes the socket, leaving no way to answer; a request that is too slow
  // gets its 408 through this timer, which cancels the read instead.
  void ArmRequestTimer(Seconds timeout) {
    stream_.expires_never();
    request_timer_.expires_after(Steady(timeout));
    request_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;  // Cancelled: the read finished in time.
      self->request_timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }

  // Feeds the parser what the buffer already holds. True when that completes the header (or,
  // with `whole`, the message) or fails (`ec`): no read, timer or posted completion is needed;
  // false when more bytes must be read (what was parsed stays parsed).
  bool ParseBuffered(bool whole, beast::error_code& ec) {
    auto complete = [&] { return whole ? parser_->is_done() : parser_->is_header_done(); };
    while (!complete() && buffer_.size() > 0) {
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == http::error::need_more) {
        ec = {};
        return false;
      }
      if (ec) return true;
      if (used == 0) break;
    }
    return complete();
  }

  void ReadRestOfHeader() {
    // A request that arrived whole in one read (the common case) is parsed at once.
    if (beast::error_code ec; ParseBuffered(/*whole=*/false, ec)) return OnHeader(ec, 0);
    ArmRequestTimer(server_.options().header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  // Whether the request carries the API key (when one is set and the path needs it).
  bool Authorized(const http::request<http::string_body>& raw, std::string_view path) const {
    const std::string& api_key = server_.options().api_key;
    if (api_key.empty() || path.rfind("/v2/health/", 0) == 0 ||
        server_.router().IsPublic(raw.method_string(), path)) {
      return true;
    }
    std::string_view presented = raw["X-API-Key"];
    std::string_view authorization = raw[http::field::authorization];
    if (presented.empty() && authorization.substr(0, 7) == "Bearer ") {
      presented = authorization.substr(7);
    }
    return ConstantTimeEquals(presented, api_key);
  }

  void OnHeader(beast::error_code ec, size_t) {
    reading_header_ = false;
    request_timer_.cancel();
    if (ec) return OnReadError(ec);
    auto& request = parser_->get();
    // Before the body is read (and before a client that asked is told to send it): the route's
    // admission check, then the body's declared length against the memory budget.
    std::string_view target = request.target();
    const std::string_view path = target.substr(0, target.find('?'));
    // An unauthorised request learns nothing of the models' load: it gets its 401 once read.
    Result<AdmissionTicket> admitted = Authorized(request, path)
                                           ? server_.router().Admit(request.method_string(), path)
                                           : AdmissionTicket();
    memory_ = std::make_shared<MemoryReservation>(server_.memory_budget());
    const auto length = parser_->content_length();
    const bool expects_continue = beast::iequals(request[http::field::expect], "100-continue");
    if (!admitted.ok()) {
      // A small body is read (not decoded) so the connection stays usable; a larger one, or one
      // the client waits for permission to send, is left unread and the connection closes.
      if (expects_continue || !length || *length > kReadRefusedBodyBytes ||
          !memory_->Grow(static_cast<size_t>(*length))) {
        return Refuse(HttpResponse::Error(admitted.status()));
      }
      refusal_ = HttpResponse::Error(admitted.status());
      return ReadBody();
    }
    admission_ = std::move(*admitted);
    if (length && !memory_->Grow(static_cast<size_t>(*length))) {
      return Refuse(
          HttpResponse::Error(MemoryBudgetExceeded(*memory_, static_cast<size_t>(*length))));
    }
    if (expects_continue) {
      // The client waits for permission before sending a large body.
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                     request.version());
      http::async_write(stream_, *cont,
                        [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (beast::error_code ec; ParseBuffered(/*whole=*/true, ec)) return OnRead(ec, 0);
    ArmRequestTimer(server_.options().body_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnReadError(beast::error_code ec) {
    if (ec == net::error::operation_aborted && request_timed_out_) {
      // Part of a request arrived, but not all of it in time.
      request_timed_out_ = false;
      return WriteError(408, "request not received in time");
    }
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof) {
      return Close();
    }
    if (ec == http::error::body_limit && memory_refused_bytes_ > 0) {
      return Refuse(HttpResponse::Error(MemoryBudgetExceeded(*memory_, memory_refused_bytes_)));
    }
    if (ec == http::error::body_limit) {
      return WriteError(413, fmt::format("request body exceeds the limit of {} bytes",
                                         server_.options().max_body_bytes));
    }
    if (ec == http::error::header_limit) {
      return WriteError(431, fmt::format("request header exceeds the limit of {} bytes",
                                         server_.options().max_header_bytes));
    }
    if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
      return WriteError(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    Close();
  }

  void OnRead(beast::error_code ec, size_t) {
    request_timer_.cancel();
    if (ec) return OnReadError(ec);
    if (refusal_) {
      // Refused at its header; read only to keep the connection.
      keep_alive_ = parser_->get().keep_alive();
      version_ = parser_->get().version();
      received_ = Clock::Real().Now();
      server_.RequestStarted();
      return Write(*std::exchange(refusal_, std::nullopt), /*counted=*/true);
    }
    http::request<http::string_body>& raw = parser_->get();
    keep_alive_ = raw.keep_alive();
    version_ = raw.version();

    HttpRequest request;
    request.method = std::string(raw.method_string());
    std::string_view target = raw.target();
    const size_t question = target.find('?');
    request.path = std::string(target.substr(0, question));
    if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
    request.content_type = std::string(raw[http::field::content_type]);
    request.accept_encoding = std::string(raw[http::field::accept_encoding]);
    request.if_none_match = std::string(raw[http::field::if_none_match]);
    std::string_view header_length = raw["Inference-Header-Content-Length"];
    if (!header_length.empty()) {
      size_t value = 0;
      auto [end, err] =
          std::from_chars(header_length.data(), header_length.data() + header_length.size(), value);
      if (err != std::errc() || end != header_length.data() + header_length.size()) {
        // The request itself was read whole: answer it and keep the connection.
        return WriteError(400, "Inference-Header-Content-Length must be a non-negative integer",
                          /*close=*/false);
      }
      request.inference_header_length = value;
    }
    if (!Authorized(raw, request.path)) {
      return WriteError(401, "missing or invalid API key", /*close=*/false);
    }
    request.body = std::move(raw.body());
    request.memory = std::move(memory_);
    request.admission = std::move(admission_);
    request.received = Clock::Real().Now();
    request.arrived = read_start_;
    received_ = request.received;
    StartTrace(raw, request);
    auto self = shared_from_this();
    request.post = [self](std::function<void()> work) {
      // A batch of one: nothing waits behind its answer on the instance's thread, so the answer
      // is made there and sent from there (AnswerInPlace), without waking this connection's.
      if (HandOffBatch::InPlace()) return work();
      // A model's batch gathers its answers' hand-offs: one per I/O thread, not one each.
      if (HandOffBatch::Gather(self->sink_, work)) return;
      self->server_.HandedOff();
      net::post(self->stream_.get_executor(), std::move(work));
    };
    request.on_disconnect = [self](std::function<void()> cancel) {
      self->cancel_ = std::move(cancel);
    };
    // The handler owns the request now; no read deadline while it runs.
    stream_.expires_never();
    server_.RequestStarted();
    awaiting_response_ = true;
    server_.router().Dispatch(request, [self](HttpResponse response) {
      // Finished on a model instance's thread for a batch of one: sent from there.
      if (HandOffBatch::InPlace() && self->AnswerInPlace(response)) return;
      net::dispatch(self->stream_.get_executor(), [self, response = std::move(response)]() mutable {
        self->Write(std::move(response), /*counted=*/true);
      });
    });
    // Still unanswered and cancellable: watch the socket so a disconnect cancels the request.
    if (awaiting_response_ && cancel_) WatchForDisconnect();
  }

  // Reads the request's traceparent (echoed on the answer) and, when the tracer samples it, opens
  // its trace.
  void StartTrace(const http::request<http::string_body>& raw, HttpRequest& request) {
    std::optional<TraceContext> context;
    uint64_t span_id = 0;
    if (std::string_view header = raw["traceparent"]; !header.empty()) {
      context = ParseTraceparent(header);
      if (context) {
        span_id = NewSpanId();
        traceparent_ = FormatTraceparent(*context, span_id);
      }
    }
    TraceWriter* tracer = server_.tracer();
    if (tracer == nullptr || !tracer->ShouldSample(context && context->sampled())) return;
    trace_ = std::make_shared<RequestTrace>();
    trace_->name = request.method + " " + request.path;
    trace_->start = read_start_;
    trace_->End(TraceStage::kRead, request.received);
    trace_->lane = id_;
    if (context) {
      trace_->trace_id = context->trace_id;
      trace_->parent_span_id = context->parent_id;
    }
    trace_->span_id = span_id != 0 ? span_id : NewSpanId();
    request.trace = trace_;
  }

  // The answer is on its way (kHandle ends unless the handler encoded one) or written (kWrite).
  void MarkTraceHandled(Clock::time_point at = Clock::Real().Now()) {
    if (trace_ && trace_->ends[static_cast<size_t>(TraceStage::kEncode)] == Clock::time_point{}) {
      trace_->End(TraceStage::kHandle, at);
    }
  }
  void FinishTrace(int status, Clock::time_point at = Clock::Real().Now()) {
    if (!trace_) return;
    trace_->End(TraceStage::kWrite, at);
    trace_->status = status;
    server_.tracer()->Record(std::move(*trace_));
    trace_.reset();
  }
  // A request's answer left at `at`, or could not (499, as nginx logs a client that left): its
  // trace, and its count unless the request was never counted as started.
  void Answered(int status, bool counted, Clock::time_point at = Clock::Real().Now()) {
    FinishTrace(status, at);
    if (counted) server_.RequestFinished(status, received_, at);
  }
  // The end of a whole (not streamed) answer's exchange: answered, then the connection reads the
  // next request or closes.
  void EndExchange(int status, bool counted, bool keep_alive,
                   Clock::time_point at = Clock::Real().Now()) {
    Answered(status, counted, at);
    if (status == 499 || client_gone_ || !keep_alive) return Close();
    ReadHeader();
  }

  // Waits, while a request waits for its answer, for the socket to turn readable: end-of-stream
  // means the client left. Bytes that arrive (a pipelined request) are kept for the next read.
  // A wait, not a read: nothing is read (no system call) unless something arrives.
  void WatchForDisconnect() {
    watching_ = true;
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
          size_t n = 0;
          if (!ec) {
            // Bytes, end-of-stream, a reset, or nothing: the reactor may report an edge whose
            // bytes the last read already took. A peek tells them apart without blocking.
            ec = self->Peek();
            if (ec == net::error::would_block) {
              return self->OnWatch({}, 0);  // Nothing came: watch on, or write what did.
            }
            if (!ec) n = self->stream_.socket().read_some(self->buffer_.prepare(4096), ec);
          }
          self->OnWatch(ec, n);
        });
  }

  // A look at the socket that neither blocks nor takes a byte: bytes (no error), nothing yet
  // (would_block), end-of-stream, or the error that ended the connection.
  beast::error_code Peek() {
    char byte;
    const ssize_t peeked =
        ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (peeked > 0) return {};
    if (peeked == 0) return net::error::eof;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return net::error::would_block;
    return {errno, boost::system::system_category()};
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec == net::error::operation_aborted && pending_) {
      // The watch was cancelled for an answer that came before the loop saw a close already
      // there (a busy machine): a look now, or a stream would start for nobody and its first
      // write could still succeed.
      const beast::error_code seen = Peek();
      if (seen && seen != net::error::would_block) ec = seen;
    }
    if (!ec) {
      buffer_.commit(n);
    } else if (ec != net::error::operation_aborted) {
      client_gone_ = true;
      if (cancel_) std::exchange(cancel_, nullptr)();
    }
    if (sent_in_place_) return FinishInPlace(std::exchange(sent_in_place_, nullptr));
    if (pending_) return WritePending();
    if (!ec && awaiting_response_ && buffer_.size() < 65536) WatchForDisconnect();
  }

  // Sends a whole answer from the calling thread (a model instance's, finishing a batch of one)
  // straight into the socket, so it leaves without waiting for the connection's thread, then
  // hands that thread the rest of the exchange (FinishInPlace: what the socket did not take, the
  // counts, the trace, the next read). Safe off the connection's thread: while a request awaits
  // its answer, that thread neither writes to the socket nor closes it, and what is read here was
  // set before the request was dispatched. False, with nothing done, for a streamed answer.
  bool AnswerInPlace(HttpResponse& response) {
    if (response.stream) return false;
    if (response.render) response.body = std::exchange(response.render, nullptr)();
    auto sent = std::make_shared<SentInPlace>();
    sent->status = response.status;
    sent->keep_alive = keep_alive_ && server_.keep_alive_allowed();
    AppendResponseHead(response, {version_, sent->keep_alive, traceparent_}, sent->head);
    if (HasBody(response.status)) sent->body = std::move(response.body);
    std::array<iovec, 2> parts{iovec{sent->head.data(), sent->head.size()},
                               iovec{sent->body.data(), sent->body.size()}};
    msghdr message{};
    message.msg_iov = parts.data();
    message.msg_iovlen = sent->body.empty() ? 1 : 2;
    server_.AnsweredInPlace();  // Counted before the client can see it.
    ssize_t n = 0;
    do {
      n = ::sendmsg(fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n >= 0) sent->sent = static_cast<size_t>(n);
    sent->failed = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
    sent->at = Clock::Real().Now();
    std::function<void()> finish = [self = shared_from_this(), sent]() mutable {
      self->FinishInPlace(std::move(sent));
    };
    if (!HandOffBatch::Gather(sink_, finish)) sink_.Deliver({std::move(finish)});
    return true;
  }

  // On the connection's thread, after AnswerInPlace: the watch ends first, then what the socket
  // did not take is written as any answer is, and the exchange ends as Write's does.
  void FinishInPlace(std::shared_ptr<SentInPlace> sent) {
    if (watching_) {
      sent_in_place_ = std::move(sent);  // OnWatch comes back here.
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    awaiting_response_ = false;
    memory_.reset();
    admission_.reset();
    cancel_ = nullptr;
    MarkTraceHandled(sent->at);
    const size_t total = sent->head.size() + sent->body.size();
    if (sent->failed || (client_gone_ && sent->sent < total)) {
      client_gone_ = true;
      return EndExchange(499, /*counted=*/true, /*keep_alive=*/false, sent->at);
    }
    if (sent->sent == total) {
      // Sent whole: answered, even if the client has left since.
      return EndExchange(sent->status, /*counted=*/true, sent->keep_alive, sent->at);
    }
    std::array<net::const_buffer, 2> rest{net::buffer(sent->head), net::buffer(sent->body)};
    if (sent->sent < sent->head.size()) {
      rest[0] += sent->sent;
    } else {
      rest[0] = net::const_buffer();
      rest[1] += sent->sent - sent->head.size();
    }
    stream_.expires_after(Steady(server_.options().idle_timeout));
    net::async_write(
        stream_, rest, [self = shared_from_this(), sent](beast::error_code ec, size_t) {
          self->EndExchange(ec ? 499 : sent->status, /*counted=*/true, sent->keep_alive);
        });
  }

  void WritePending() {
    HttpResponse response = std::move(*pending_);
    pending_.reset();
    Write(std::move(response), /*counted=*/true);
  }

  // An error found before the request reached a handler. With `close` (a request that could not
  // be read whole), the connection closes after the answer.
  void WriteError(int status, std::string message, bool close = true) {
    HttpResponse response = HttpResponse::Json(status, "{\"error\":" + JsonQuote(message) + "}");
    if (close) return Refuse(std::move(response));
    received_ = Clock::Real().Now();
    server_.RequestStarted();
    Write(std::move(response), /*counted=*/true);
  }

  // Answers a request whose body is left (partly) unread, then closes the connection.
  void Refuse(HttpResponse response) {
    keep_alive_ = false;
    version_ = 11;
    linger_ = true;
    received_ = Clock::Real().Now();
    server_.RequestStarted();
    Write(std::move(response), /*counted=*/true);
  }

  void Write(HttpResponse response, bool counted) {
    awaiting_response_ = false;
    if (!refusal_timed_ && keep_alive_ && response.status == 503 &&
        HasHeader(response, "Retry-After")) {
      // Refused for overload: at once, unless this connection's last refusal left less than the
      // interval ago (see kOverloadRefusalInterval).
      refusal_timed_ = true;
      const auto now = std::chrono::steady_clock::now();
      const auto due = last_overload_refusal_ + Steady(kOverloadRefusalInterval);
      last_overload_refusal_ = std::max(now, due);
      if (due > now) {
        pause_timer_.expires_at(due);
        pause_timer_.async_wait(
            [self = shared_from_this(), response = std::move(response),
             counted](beast::error_code) mutable { self->Write(std::move(response), counted); });
        return;
      }
    }
    // Whatever the handler still holds, it holds through its own pointers.
    memory_.reset();
    admission_.reset();
    std::function<void()> cancel = std::exchange(cancel_, nullptr);
    if (!watching_) MarkTraceHandled();
    if (client_gone_) {
      // Nobody to answer (499, as nginx logs it); the connection is closed.
      if (response.stream) {
        response.stream->MarkGone();
        if (cancel) cancel();
      }
      return EndExchange(499, counted, /*keep_alive=*/false);
    }
    if (watching_) {
      // The watch read must end before the write: cancel it; its handler writes this.
      if (response.stream) cancel_ = std::move(cancel);  // A stream still needs it.
      pending_ = std::move(response);
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    if (response.stream) return StartStream(std::move(response), counted, std::move(cancel));
    if (response.render) response.body = std::exchange(response.render, nullptr)();
    const bool keep_alive = keep_alive_ && server_.keep_alive_allowed();
    // The head and the body, sent together by one write without copying the body.
    auto out = std::make_shared<std::pair<std::string, std::string>>();
    AppendResponseHead(response, {version_, keep_alive, traceparent_}, out->first);
    if (HasBody(response.status)) out->second = std::move(response.body);
    const std::array<net::const_buffer, 2> buffers{net::buffer(out->first),
                                                   net::buffer(out->second)};
    const int status = response.status;
    stream_.expires_after(Steady(server_.options().idle_timeout));
    net::async_write(stream_, buffers,
                     [self = shared_from_this(), out, status, counted, keep_alive](
                         beast::error_code ec, size_t) {
                       self->EndExchange(ec ? 499 : status, counted, keep_alive);
                     });
  }

  // A streamed response: the head, then one HTTP chunk per batch of what the producer wrote,
  // then the last chunk (on HTTP/1.0: the bytes as they come, then the connection closes).
  // Meanwhile a read watches the socket, so a client that leaves cancels the producer at once.
  void StartStream(HttpResponse response, bool counted, std::function<void()> cancel) {
    stream_chunked_ = StreamsInChunks(version_);
    keep_alive_ = keep_alive_ && server_.keep_alive_allowed() && stream_chunked_;
    auto head = std::make_shared<std::string>();
    AppendResponseHead(response, {version_, keep_alive_, traceparent_}, *head);
    streaming_ = true;
    stream_body_ = std::move(response.stream);
    stream_cancel_ = std::move(cancel);
    stream_status_ = response.status;
    stream_counted_ = counted;
    stream_.expires_never();  // A stream lasts as long as generation; slow readers: see Pump.
    net::async_write(stream_, net::buffer(*head),
                     [self = shared_from_this(), head](beast::error_code ec, size_t) {
                       if (ec) return self->EndStream(ec);
                       std::weak_ptr<Session> weak = self;
                       auto executor = self->stream_.get_executor();
                       self->stream_body_->Attach([weak, executor] {
                         net::post(executor, [weak] {
                           if (auto session = weak.lock()) session->PumpStream();
                         });
                       });
                       self->WatchStream();
                       self->PumpStream();
                     });
  }

  void PumpStream() {
    if (!streaming_ || stream_writing_) return;
    bool closed = false;
    std::string data = stream_body_->Take(&closed);
    if (!data.empty()) {
      stream_writing_ = true;
      auto buffer = std::make_shared<std::string>(std::move(data));
      auto written = [self = shared_from_this(), buffer](beast::error_code ec, size_t) {
        self->stream_writing_ = false;
        if (ec) return self->EndStream(ec);
        self->PumpStream();
      };
      if (stream_chunked_) {
        net::async_write(stream_, http::make_chunk(net::buffer(*buffer)), std::move(written));
      } else {
        net::async_write(stream_, net::buffer(*buffer), std::move(written));
      }
      return;
    }
    if (closed && !stream_chunked_) return EndStream({});  // The close ends the body.
    if (closed) {
      stream_writing_ = true;
      net::async_write(stream_, http::make_chunk_last(),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->stream_writing_ = false;
                         self->EndStream(ec);
                       });
    }
  }

  void WatchStream() {
    stream_watching_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->stream_watching_ = false;
          if (!ec) {
            self->buffer_.commit(n);  // A pipelined request: read after the stream.
            if (self->streaming_ && self->buffer_.size() < 65536) self->WatchStream();
            if (!self->streaming_ && self->resume_after_stream_) {
              self->resume_after_stream_ = false;
              self->ReadHeader();
            }
            return;
          }
          if (ec == net::error::operation_aborted) {
            if (self->resume_after_stream_) {
              self->resume_after_stream_ = false;
              self->ReadHeader();
            }
            return;
          }
          self->EndStream(ec);  // The client left.
        });
  }

  // The stream is over: written whole (no `ec`), or the client left or stopped reading.
  void EndStream(beast::error_code ec) {
    if (!streaming_) return;
    streaming_ = false;
    const bool failed = static_cast<bool>(ec);
    if (failed) {
      client_gone_ = true;
      stream_body_->MarkGone();
      if (stream_cancel_) std::exchange(stream_cancel_, nullptr)();
    } else {
      stream_body_->Attach(nullptr);
    }
    stream_cancel_ = nullptr;
    stream_body_.reset();
    Answered(failed ? 499 : stream_status_, stream_counted_);
    if (failed || !keep_alive_) return Close();
    if (stream_watching_) {
      // The watch read must end first; its handler reads the next request.
      resume_after_stream_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    ReadHeader();
  }

  void Close() {
    request_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (!std::exchange(linger_, false)) return stream_.close();
    // Unread request bytes at close() make the kernel reset the connection, and a client still
    // sending may lose the answer it has not read yet: read and drop what comes for a while.
    stream_.expires_after(Steady(kLingerTimeout));
    DiscardInput();
  }

  void DiscardInput() {
    buffer_.consume(buffer_.size());
    stream_.async_read_some(buffer_.prepare(16384),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->stream_.close();
                              self->DiscardInput();
                            });
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpServer::Impl& server_;
  HandOffBatch::Sink& sink_;  // Hands work to this connection's I/O thread in batches.
  const int fd_;              // The socket's descriptor, for AnswerInPlace.
  bool keep_alive_ = false;
  unsigned version_ = 11;
  Clock::time_point received_;
  const uint64_t id_;  // This connection's number: its lane in traces.
  // On the connection's I/O thread: when the current request's first bytes arrived (its deadline
  // counts from it), its trace if sampled, and the traceparent to echo.
  Clock::time_point read_start_;
  std::shared_ptr<RequestTrace> trace_;
  std::string traceparent_;
  bool reading_header_ = false;     // Waiting for a request's header.
  bool request_timed_out_ = false;  // request_timer_ fired and cancelled the read.
  bool linger_ = false;             // Close() reads what the client still sends, for a while.
  // The request's hold on the memory budget, from its header until the handler takes it.
  std::shared_ptr<MemoryReservation> memory_;
  size_t memory_refused_bytes_ = 0;      // > 0: a chunk was refused for want of budget.
  std::optional<HttpResponse> refusal_;  // The answer to a request refused at its header.
  AdmissionTicket admission_;            // From the route, until the handler takes it.
  std::function<void(uint64_t, beast::string_view, beast::error_code&)> on_chunk_header_;
  Timer request_timer_{stream_.get_executor()};
  // When this connection's last refusal for overload left (or is due to), whether the current
  // answer's time has been decided, and the timer that holds one refusal until it is due.
  std::chrono::steady_clock::time_point last_overload_refusal_{};
  bool refusal_timed_ = false;
  Timer pause_timer_{stream_.get_executor()};
  // While a handler works on a request (all on the connection's I/O thread):
  bool awaiting_response_ = false;
  bool watching_ = false;                       // A WatchForDisconnect() read is outstanding.
  bool client_gone_ = false;                    // The client closed its side.
  std::function<void()> cancel_;                // From the handler: cancels its queued request.
  std::optional<HttpResponse> pending_;         // An answer waiting for the watch read to end.
  std::shared_ptr<SentInPlace> sent_in_place_;  // The same, for one sent in place.
  // While a streamed response is sent (all on the connection's I/O thread):
  bool streaming_ = false;
  bool stream_chunked_ = true;    // HTTP/1.1: the body goes in chunks.
  bool stream_writing_ = false;   // A chunk write is outstanding.
  bool stream_watching_ = false;  // A WatchStream() read is outstanding.
  bool resume_after_stream_ = false;
  std::shared_ptr<ResponseStream> stream_body_;
  std::function<void()> stream_cancel_;  // From the handler: stops the producer.
  int stream_status_ = 200;
  bool stream_counted_ = false;
};

}  // namespace

std::shared_ptr<SessionBase> MakeSession(Socket socket, HttpServer::Impl& server) {
  return std::make_shared<Session>(std::move(socket), server);
}

}  // namespace sluice
