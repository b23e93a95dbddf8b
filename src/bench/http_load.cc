// Asynchronous Beast load generator.
#include "bench/http_load.h"

#include <fmt/format.h>

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <deque>
#include <memory>
#include <optional>
#include <random>

namespace sluice {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

StatusCode OutcomeOf(int http_status) {
  switch (http_status) {
    case 200:
      return StatusCode::kOk;
    case 400:
      return StatusCode::kInvalidArgument;
    case 404:
      return StatusCode::kNotFound;
    case 413:
      return StatusCode::kPayloadTooLarge;
    case 503:
      return StatusCode::kUnavailable;
    case 504:
      return StatusCode::kDeadlineExceeded;
    default:
      return StatusCode::kInternal;
  }
}

std::string SerializeRequest(const HttpTarget& target, const HttpPayload& p) {
  std::string out =
      fmt::format("{} {} HTTP/1.1\r\nHost: {}:{}\r\n", p.method, p.path, target.host, target.port);
  if (!p.body.empty() || p.method == "POST") {
    out += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", p.content_type, p.body.size());
  }
  for (const auto& [name, value] : p.headers) out += fmt::format("{}: {}\r\n", name, value);
  out += "\r\n";
  out += p.body;
  return out;
}

// Drives all connections of one level from the calling thread.
class LoadRunner {
 public:
  explicit LoadRunner(const HttpLoadOptions& options)
      : options_(options),
        request_(SerializeRequest(options.target, options.payload)),
        timer_(ioc_),
        rng_(options.seed) {}

  Result<HttpLoadRun> Run() {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints =
        resolver.resolve(options_.target.host, std::to_string(options_.target.port), ec);
    if (ec) return Status::InvalidArgument(fmt::format("cannot resolve {}", options_.target.host));
    endpoint_ = *endpoints.begin();
    {
      // One connection first, synchronously: a server that is not there is a clear error.
      tcp::socket probe(ioc_);
      probe.connect(endpoint_, ec);
      if (ec) {
        return Status::Unavailable(fmt::format("cannot connect to {}:{}: {}", options_.target.host,
                                               options_.target.port, ec.message()));
      }
    }
    start_ = Clock::Real().Now();
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(options_.warmup);
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(options_.duration);
    UtilizationSampler sampler;
    sampler.Start();
    for (int i = 0; i < options_.concurrency; ++i) OpenConnection();
    if (open_loop()) {
      next_arrival_ = start_;
      ScheduleArrival();
    }
    ioc_.run();
    run_.connections = static_cast<int>(conns_.size());
    FinishLoadRun(run_, sampler, measure_from_, end_, static_cast<int64_t>(pending_.size()));
    return std::move(run_);
  }

 private:
  struct Conn {
    explicit Conn(net::io_context& ioc) : socket(ioc) {}
    tcp::socket socket;
    beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> parser;
    Clock::time_point sent;       // When the request went out.
    Clock::time_point scheduled;  // Open loop: when it was due.
    bool connected = false;
    bool closed = false;  // By the generator, at the end: never reopened.
    bool busy = false;
    // The request in flight, when traced: its ids, its own bytes and when they were written.
    uint64_t trace_span = 0;  // 0: not traced.
    std::array<uint8_t, 16> trace_id{};
    std::string traced_request;
    Clock::time_point written;
  };

  bool open_loop() const { return options_.rate > 0; }
  // Closed loop: the measured period is over. Open loop: every arrival scheduled before the end
  // has been handed to a connection. (A late timer may hand one over after the end: connections
  // stay open for it.)
  bool done_sending(Clock::time_point now) const {
    return open_loop() ? arrivals_over_ && pending_.empty() : now >= end_;
  }

  void OpenConnection() {
    auto conn = std::make_shared<Conn>(ioc_);
    conns_.push_back(conn);
    Connect(conn);
  }

  void Connect(const std::shared_ptr<Conn>& conn) {
    ++connecting_;
    conn->socket.async_connect(endpoint_, [this, conn](beast::error_code ec) {
      --connecting_;
      if (conn->closed) return;  // Closed by the generator while connecting: nothing lost.
      if (ec) {
        AddTransportError(run_, fmt::format("connect: {}", ec.message()));
        // No retries past the end, even for arrivals still pending (they count as unsent): a
        // server that is gone would keep the generator retrying forever.
        if (Clock::Real().Now() >= end_) return;
        conn->socket = tcp::socket(ioc_);
        return Connect(conn);
      }
      conn->socket.set_option(tcp::no_delay(true));
      conn->connected = true;
      Next(conn);
    });
  }

  // Gives an idle connection its next request, if there is one.
  void Next(const std::shared_ptr<Conn>& conn) {
    const Clock::time_point now = Clock::Real().Now();
    if (open_loop()) {
      if (pending_.empty()) {
        conn->busy = false;
        if (done_sending(now)) Close(conn);
        return;
      }
      conn->scheduled = pending_.front();
      pending_.pop_front();
    } else {
      if (done_sending(now)) return Close(conn);
      conn->scheduled = now;
    }
    conn->busy = true;
    conn->sent = Clock::Real().Now();
    const std::string* wire = &request_;
    conn->trace_span = 0;
    if (options_.tracer != nullptr && conn->scheduled >= measure_from_ &&
        options_.tracer->ShouldSample()) {
      // This one request carries its own traceparent, after the request line and Host.
      TraceContext context;
      for (size_t half = 0; half < 2; ++half) {
        uint64_t bits = NewSpanId();
        for (size_t i = 0; i < 8; ++i, bits >>= 8) context.trace_id[half * 8 + i] = bits & 0xff;
      }
      context.flags = 1;
      conn->trace_id = context.trace_id;
      conn->trace_span = NewSpanId();
      conn->traced_request = request_;
      const size_t after_host = request_.find("\r\n", request_.find("\r\n") + 2) + 2;
      conn->traced_request.insert(
          after_host, "traceparent: " + FormatTraceparent(context, conn->trace_span) + "\r\n");
      wire = &conn->traced_request;
    }
    net::async_write(conn->socket, net::buffer(*wire), [this, conn](beast::error_code ec, size_t) {
      if (ec) return Lost(conn, "write", ec);
      if (conn->trace_span != 0) conn->written = Clock::Real().Now();
      ++run_.sent;
      Read(conn);
    });
  }

  void Read(const std::shared_ptr<Conn>& conn) {
    conn->parser.emplace();
    conn->parser->body_limit(std::numeric_limits<uint64_t>::max());
    http::async_read(conn->socket, conn->buffer, *conn->parser,
                     [this, conn](beast::error_code ec, size_t) {
                       if (ec) return Lost(conn, "read", ec);
                       const Clock::time_point now = Clock::Real().Now();
                       const auto& response = conn->parser->get();
                       ++run_.answered;
                       if (response.result() == http::status::service_unavailable &&
                           response.find(http::field::retry_after) == response.end()) {
                         ++run_.unavailable_without_retry_after;
                       }
                       Record(conn, now, static_cast<int>(response.result_int()));
                       if (!response.keep_alive()) return Reconnect(conn);
                       Next(conn);
                     });
  }

  // `http_status` 0: the connection was lost.
  void Record(const std::shared_ptr<Conn>& conn, Clock::time_point now, int http_status) {
    const Clock::time_point origin = open_loop() ? conn->scheduled : conn->sent;
    if (origin < measure_from_) return;  // Warm-up.
    RequestRecord record;
    record.request_time = origin;
    record.start_time = conn->sent;
    record.response_time = now;
    record.samples = options_.payload.samples;
    record.outcome = http_status == 0 ? StatusCode::kUnavailable : OutcomeOf(http_status);
    run_.records.push_back(record);
    if (conn->trace_span != 0) {
      RequestTrace trace;
      trace.name = options_.payload.method + " " + options_.payload.path;
      trace.start = origin;
      trace.lane = lanes_.Assign(origin, now);
      trace.status = http_status;
      if (open_loop()) trace.End(TraceStage::kDelay, conn->sent);
      if (conn->written != Clock::time_point{}) trace.End(TraceStage::kSend, conn->written);
      trace.End(TraceStage::kReceive, now);
      trace.trace_id = conn->trace_id;
      trace.span_id = conn->trace_span;
      options_.tracer->Record(std::move(trace));
      conn->trace_span = 0;
      conn->written = Clock::time_point{};
    }
  }

  // The connection failed mid-request: record the failure and carry on with a new one.
  void Lost(const std::shared_ptr<Conn>& conn, std::string_view during, beast::error_code ec) {
    AddTransportError(run_, fmt::format("{}: {}", during, ec.message()));
    Record(conn, Clock::Real().Now(), 0);
    Reconnect(conn);
  }

  void Reconnect(const std::shared_ptr<Conn>& conn) {
    beast::error_code ignored;
    conn->socket.close(ignored);
    conn->buffer.clear();
    conn->connected = false;
    conn->busy = false;
    if (done_sending(Clock::Real().Now())) return;
    conn->socket = tcp::socket(ioc_);
    Connect(conn);
  }

  void Close(const std::shared_ptr<Conn>& conn) {
    beast::error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    conn->connected = false;
    conn->closed = true;
    conn->busy = false;
  }

  // Open loop: the next Poisson arrival, then hand it to an idle connection.
  void ScheduleArrival() {
    std::exponential_distribution<double> gap(options_.rate);
    next_arrival_ += std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng_)));
    if (next_arrival_ >= end_) {
      // No more arrivals: idle connections close; busy ones close after their answer.
      arrivals_over_ = true;
      if (!pending_.empty()) return;
      for (auto& conn : conns_) {
        if (!conn->busy) Close(conn);
      }
      return;
    }
    timer_.expires_at(next_arrival_);
    timer_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      pending_.push_back(next_arrival_);
      for (auto& conn : conns_) {
        if (pending_.empty()) break;
        if (conn->connected && !conn->busy) Next(conn);
      }
      // Every connection busy: one more, unless one on its way will take this arrival.
      if (pending_.size() > static_cast<size_t>(connecting_) &&
          static_cast<int>(conns_.size()) < options_.max_connections) {
        OpenConnection();
      }
      ScheduleArrival();
    });
  }

  const HttpLoadOptions& options_;
  const std::string request_;
  TraceLanes lanes_;
  net::io_context ioc_{1};
  tcp::endpoint endpoint_;
  net::steady_timer timer_;
  std::mt19937_64 rng_;
  std::vector<std::shared_ptr<Conn>> conns_;
  std::deque<Clock::time_point> pending_;
  int connecting_ = 0;          // Connections whose connect has not completed.
  bool arrivals_over_ = false;  // Open loop: the last arrival before the end is scheduled.
  Clock::time_point start_, measure_from_, end_, next_arrival_;
  HttpLoadRun run_;  // Counts and records as they come; summarised at the end.
};

}  // namespace

void AddTransportError(HttpLoadRun& run, std::string what) {
  ++run.transport_errors;
  if (run.first_transport_errors.size() < 5) run.first_transport_errors.push_back(std::move(what));
}

void FinishLoadRun(HttpLoadRun& run, UtilizationSampler& sampler, Clock::time_point measure_from,
                   Clock::time_point end, int64_t unsent) {
  sampler.Stop();
  run.summary = Summarize(run.records, /*first_is_warmup=*/false);
  run.utilization = sampler.Average(measure_from, end);
  run.utilization_samples = sampler.samples();
  run.unsent = unsent;
}

Result<HttpTarget> ParseHttpUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument(fmt::format("URL '{}' must start with http://", url));
  }
  url.remove_prefix(kScheme.size());
  url = url.substr(0, url.find('/'));
  HttpTarget target;
  size_t colon = url.rfind(':');
  if (colon == std::string_view::npos) {
    target.host = std::string(url);
    target.port = 80;
  } else {
    target.host = std::string(url.substr(0, colon));
    std::string_view port = url.substr(colon + 1);
    unsigned value = 0;
    auto [end, err] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (err != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return Status::InvalidArgument(fmt::format("bad port in URL: '{}'", port));
    }
    target.port = static_cast<uint16_t>(value);
  }
  if (target.host.empty()) return Status::InvalidArgument("URL has no host");
  return target;
}

Result<std::string> HttpGet(const HttpTarget& target, const std::string& path) {
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(10));
    stream.connect(resolver.resolve(target.host, std::to_string(target.port)));
    http::request<http::empty_body> request(http::verb::get, path, 11);
    request.set(http::field::host, fmt::format("{}:{}", target.host, target.port));
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(stream, buffer, response);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (response.result_int() / 100 != 2) {
      return Status(
          OutcomeOf(static_cast<int>(response.result_int())),
          fmt::format("GET {} answered {}: {}", path, response.result_int(), response.body()));
    }
    return std::move(response.body());
  } catch (const std::exception& e) {
    return Status::Unavailable(
        fmt::format("GET http://{}:{}{} failed: {}", target.host, target.port, path, e.what()));
  }
}

Result<HttpLoadRun> RunHttpLoad(const HttpLoadOptions& options) {
  if (options.concurrency < 1) return Status::InvalidArgument("concurrency must be >= 1");
  if (options.rate < 0) return Status::InvalidArgument("rate must be >= 0");
  LoadRunner runner(options);
  return runner.Run();
}

std::pair<double, double> ScrapeHistogram(std::string_view metrics, std::string_view name,
                                          std::string_view model) {
  auto value_of = [&](std::string_view suffix) {
    const std::string key = fmt::format("{}{}{{model=\"{}\"}} ", name, suffix, model);
    size_t at = metrics.find(key);
    if (at == std::string_view::npos) return 0.0;
    at += key.size();
    size_t end = metrics.find('\n', at);
    return std::stod(std::string(metrics.substr(at, end - at)));
  };
  return {value_of("_sum"), value_of("_count")};
}

}  // namespace sluice
