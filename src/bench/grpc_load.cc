// gRPC load generators: nghttp2 over Asio, and gRPC C++'s asynchronous client.
#include "bench/grpc_load.h"

#include <fmt/format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <nghttp2/nghttp2.h>

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <unordered_set>

#include "bench/payload.h"
#include "grpc_predict_v2.grpc.pb.h"

namespace sluice {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr const char* kModelInfer = "/inference.GRPCInferenceService/ModelInfer";

StatusCode OutcomeOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kPayloadTooLarge;
    case grpc::StatusCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kCancelled;
    default:
      return StatusCode::kInternal;
  }
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Its own connection: channels with different arguments share no subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("sluice.bench_channel", index);
  // A load generator's channel: no retries (no copy of each request kept for them), no optional
  // filters, no bandwidth probes, no channelz bookkeeping.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The request every call sends: the model's inputs, random, shaped from its metadata.
Result<inference::ModelInferRequest> BuildRequest(inference::GRPCInferenceService::Stub& stub,
                                                  const GrpcLoadOptions& o) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!o.api_key.empty()) context.AddMetadata("authorization", "Bearer " + o.api_key);
  inference::ModelMetadataRequest request;
  request.set_name(o.model);
  inference::ModelMetadataResponse metadata;
  grpc::Status status = stub.ModelMetadata(&context, request, &metadata);
  if (!status.ok()) {
    return Status::Unavailable(fmt::format("ModelMetadata for '{}' at {} failed: {} ({})", o.model,
                                           o.target, status.error_message(),
                                           static_cast<int>(status.error_code())));
  }
  ModelConfig config;
  config.name = o.model;
  for (const auto& input : metadata.inputs()) {
    auto dtype = ParseDataType(input.datatype());
    if (!dtype) {
      return Status::InvalidArgument(
          fmt::format("input '{}' has datatype {}, which random payloads do not cover",
                      input.name(), input.datatype()));
    }
    // The first (batch) dimension is ours to choose.
    config.inputs.push_back(
        TensorSpec{input.name(), *dtype, Shape(input.shape().begin() + 1, input.shape().end())});
  }
  auto inputs = MakeRandomInputs(config, o.samples_per_request, o.seed);
  if (!inputs.ok()) return inputs.status();
  inference::ModelInferRequest infer;
  infer.set_model_name(o.model);
  for (size_t i = 0; i < inputs->size(); ++i) {
    const Tensor& t = (*inputs)[i];
    auto* input = infer.add_inputs();
    input->set_name(config.inputs[i].name);
    input->set_datatype(std::string(DataTypeName(t.dtype())));
    for (int64_t d : t.shape()) input->add_shape(d);
    if (o.raw) {
      infer.add_raw_input_contents()->assign(static_cast<const char*>(t.data()), t.byte_size());
      continue;
    }
    auto* c = input->mutable_contents();
    auto copy = [&t](auto* field, auto sample) {
      using T = decltype(sample);
      for (T v : t.values<T>()) field->Add(v);
    };
    switch (t.dtype()) {
      case DataType::kBool:
        copy(c->mutable_bool_contents(), bool{});
        break;
      case DataType::kUInt8:
        copy(c->mutable_uint_contents(), uint8_t{});
        break;
      case DataType::kInt8:
        copy(c->mutable_int_contents(), int8_t{});
        break;
      case DataType::kInt16:
        copy(c->mutable_int_contents(), int16_t{});
        break;
      case DataType::kInt32:
        copy(c->mutable_int_contents(), int32_t{});
        break;
      case DataType::kInt64:
        copy(c->mutable_int64_contents(), int64_t{});
        break;
      case DataType::kFp32:
        copy(c->mutable_fp32_contents(), float{});
        break;
      case DataType::kFp64:
        copy(c->mutable_fp64_contents(), double{});
        break;
      case DataType::kFp16:
      case DataType::kBf16:
        return Status::InvalidArgument(fmt::format(
            "input '{}' is {}, which has no typed contents: use raw contents (--binary)",
            config.inputs[i].name, DataTypeName(t.dtype())));
    }
  }
  return infer;
}

// Past the warm-up, records a call that was due at `scheduled` (open loop; else sent at `sent`)
// and ended at `now`.
void RecordCall(HttpLoadRun& run, const GrpcLoadOptions& o, Clock::time_point measure_from,
                Clock::time_point scheduled, Clock::time_point sent, Clock::time_point now,
                StatusCode outcome) {
  const Clock::time_point origin = o.rate > 0 ? scheduled : sent;
  if (origin < measure_from) return;
  RequestRecord record;
  record.request_time = origin;
  record.start_time = sent;
  record.response_time = now;
  record.samples = o.samples_per_request;
  record.outcome = outcome;
  run.records.push_back(record);
}

// Drives every call of one level from the calling thread, on one completion queue: that thread
// polls the connections, records each answer and starts the next call, with no hand-off between
// threads (as the HTTP generator does with its one event loop).
class GrpcLoadRunner {
 public:
  // Every call sends `request`, serialized once (calls share its bytes, as the HTTP generator's
  // connections share one request); answers are checked by status, not parsed, as the HTTP
  // generator does not parse bodies.
  GrpcLoadRunner(const GrpcLoadOptions& options, const inference::ModelInferRequest& request,
                 const std::vector<std::shared_ptr<grpc::Channel>>& channels)
      : options_(options) {
    grpc::Slice bytes(request.SerializeAsString());
    request_ = grpc::ByteBuffer(&bytes, 1);
    for (const auto& channel : channels)
      stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
  }

  HttpLoadRun Run() {
    start_ = Clock::Real().Now();
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(options_.warmup);
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(options_.duration);
    UtilizationSampler sampler;
    sampler.Start();
    std::mt19937_64 rng(options_.seed);
    std::exponential_distribution<double> gap(options_.rate > 0 ? options_.rate : 1.0);
    std::optional<Clock::time_point> next_arrival;
    if (open_loop()) {
      next_arrival = start_ + std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng)));
    } else {
      for (int i = 0; i < options_.concurrency; ++i) Issue(Clock::Real().Now());
    }
    for (;;) {
      // Open loop: arrivals now due go out, or wait their turn for a free call.
      while (next_arrival && *next_arrival <= Clock::Real().Now()) {
        if (*next_arrival >= end_) {
          next_arrival.reset();
          break;
        }
        if (in_flight_ < options_.concurrency) {
          Issue(*next_arrival);
        } else {
          pending_.push_back(*next_arrival);
        }
        *next_arrival += std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng)));
      }
      if (in_flight_ == 0 && !next_arrival) break;
      void* tag = nullptr;
      bool ok = false;
      const auto wake = next_arrival ? ToSystem(*next_arrival)
                                     : std::chrono::system_clock::now() + std::chrono::seconds(1);
      const auto event = queue_.AsyncNext(&tag, &ok, wake);
      if (event == grpc::CompletionQueue::SHUTDOWN) break;
      if (event == grpc::CompletionQueue::GOT_EVENT) Done(static_cast<Call*>(tag));
    }
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
    FinishLoadRun(run_, sampler, measure_from_, end_, static_cast<int64_t>(pending_.size()));
    return std::move(run_);
  }

 private:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    Clock::time_point scheduled;
    Clock::time_point sent;
  };

  bool open_loop() const { return options_.rate > 0; }

  static std::chrono::system_clock::time_point ToSystem(Clock::time_point t) {
    return std::chrono::system_clock::now() +
           std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::Real().Now());
  }

  // Starts a call that was due at `scheduled`.
  void Issue(Clock::time_point scheduled) {
    auto* call = new Call;
    call->scheduled = scheduled;
    if (!options_.api_key.empty()) {
      call->context.AddMetadata("authorization", "Bearer " + options_.api_key);
    }
    auto& stub = *stubs_[next_stub_++ % stubs_.size()];
    call->sent = Clock::Real().Now();
    call->reader = stub.PrepareUnaryCall(&call->context, kModelInfer, request_, &queue_);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
    ++in_flight_;
    ++run_.sent;
  }

  void Done(Call* call) {
    const Clock::time_point now = Clock::Real().Now();
    --in_flight_;
    const grpc::Status& status = call->status;
    const bool refused = status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (refused && call->context.GetServerTrailingMetadata().count("retry-after") == 0) {
      // No answer from the service itself: the transport failed.
      AddTransportError(run_, status.error_message());
      ++run_.unavailable_without_retry_after;
    } else {
      ++run_.answered;
    }
    RecordCall(run_, options_, measure_from_, call->scheduled, call->sent, now,
               OutcomeOf(status.error_code()));
    delete call;
    if (open_loop()) {
      if (!pending_.empty()) {
        const Clock::time_point next = pending_.front();
        pending_.pop_front();
        Issue(next);
      }
    } else if (now < end_) {
      Issue(now);
    }
  }

  const GrpcLoadOptions& options_;
  grpc::ByteBuffer request_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  grpc::CompletionQueue queue_;
  size_t next_stub_ = 0;
  int in_flight_ = 0;
  Clock::time_point start_, measure_from_, end_;
  std::deque<Clock::time_point> pending_;
  HttpLoadRun run_;  // Counts and records as they come; summarised at the end.
};

// Drives every call of one level from the calling thread with nghttp2's HTTP/2 framing over Asio
// sockets, in gRPC's wire format: each call a POST of the length-prefixed request with
// `content-type: application/grpc` and `te: trailers`, its outcome the `grpc-status` trailer.
class H2LoadRunner {
 public:
  // Every call sends `request`, serialized once; answers are checked by status, not parsed.
  H2LoadRunner(const GrpcLoadOptions& options, const inference::ModelInferRequest& request,
               int connections)
      : options_(options), connections_(connections), timer_(ioc_), rng_(options.seed) {
    const std::string message = request.SerializeAsString();
    const uint32_t length = static_cast<uint32_t>(message.size());
    body_.reserve(5 + message.size());
    body_.push_back('\0');  // Not compressed.
    for (int shift = 24; shift >= 0; shift -= 8)
      body_.push_back(static_cast<char>(length >> shift));
    body_ += message;
    authorization_ = options.api_key.empty() ? "" : "Bearer " + options.api_key;
    nghttp2_session_callbacks_new(&callbacks_);
    nghttp2_session_callbacks_set_on_header_callback(callbacks_, &H2LoadRunner::OnHeader);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks_, &H2LoadRunner::OnClose);
  }
  ~H2LoadRunner() {
    conns_.clear();
    nghttp2_session_callbacks_del(callbacks_);
  }
  H2LoadRunner(const H2LoadRunner&) = delete;
  H2LoadRunner& operator=(const H2LoadRunner&) = delete;

  Result<HttpLoadRun> Run() {
    const size_t colon = options_.target.rfind(':');
    boost::system::error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints =
        resolver.resolve(options_.target.substr(0, colon), options_.target.substr(colon + 1), ec);
    if (ec || endpoints.empty()) {
      return Status::InvalidArgument(fmt::format("cannot resolve {}", options_.target));
    }
    endpoint_ = *endpoints.begin();
    start_ = Clock::Real().Now();
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(options_.warmup);
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(options_.duration);
    UtilizationSampler sampler;
    sampler.Start();
    // Each connection keeps its share of the calls in flight.
    for (int i = 0; i < connections_; ++i) {
      auto conn = std::make_unique<Conn>(this, ioc_);
      conn->quota = options_.concurrency / connections_ + (i < options_.concurrency % connections_);
      Connect(*conn);
      conns_.push_back(std::move(conn));
    }
    if (open_loop()) {
      next_arrival_ = start_;
      ScheduleArrival();
    }
    ioc_.run();
    FinishLoadRun(run_, sampler, measure_from_, end_, static_cast<int64_t>(pending_.size()));
    return std::move(run_);
  }

 private:
  struct Call {
    Clock::time_point scheduled;
    Clock::time_point sent;
    size_t sent_bytes = 0;  // Of the body.
    int grpc_status = -1;   // From the trailers; -1: none (yet).
    bool retry_after = false;
  };

  struct Conn {
    Conn(H2LoadRunner* runner, net::io_context& ioc) : runner(runner), socket(ioc) {}
    ~Conn() { EndSession(); }
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;
    void EndSession() {
      if (session != nullptr) nghttp2_session_del(session);
      session = nullptr;
      for (Call* call : calls) delete call;
      calls.clear();
    }

    H2LoadRunner* runner;
    tcp::socket socket;
    nghttp2_session* session = nullptr;  // While connected.
    std::unordered_set<Call*> calls;     // In flight.
    int quota = 0;                       // Calls it keeps in flight.
    std::array<uint8_t, 64 * 1024> in;
    std::string out;      // Frames nghttp2 produced, not yet handed to the socket.
    std::string writing;  // Frames being written.
    bool write_pending = false;
    uint64_t generation = 0;  // Sessions so far: a handler of an earlier one does nothing.
  };

  bool open_loop() const { return options_.rate > 0; }
  bool sending_over(Clock::time_point now) const {
    return open_loop() ? arrivals_over_ && pending_.empty() : now >= end_;
  }

  void Connect(Conn& conn) {
    conn.socket.async_connect(endpoint_, [this, &conn](boost::system::error_code ec) {
      if (ec) {
        AddTransportError(run_, fmt::format("connect: {}", ec.message()));
        if (sending_over(Clock::Real().Now())) return;
        conn.socket = tcp::socket(ioc_);
        return Connect(conn);
      }
      conn.socket.set_option(tcp::no_delay(true));
      nghttp2_session_client_new(&conn.session, callbacks_, &conn);
      // Large windows: answers (and requests) of any size flow without waiting for updates.
      const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                                 {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 30}};
      nghttp2_submit_settings(conn.session, NGHTTP2_FLAG_NONE, settings, 2);
      nghttp2_session_set_local_window_size(conn.session, NGHTTP2_FLAG_NONE, 0, 1 << 30);
      Fill(conn);
      Flush(conn);
      Read(conn);
    });
  }

  // Starts calls on `conn` up to its quota: closed loop until the end, open loop those due.
  void Fill(Conn& conn) {
    while (static_cast<int>(conn.calls.size()) < conn.quota) {
      const Clock::time_point now = Clock::Real().Now();
      Clock::time_point scheduled = now;
      if (open_loop()) {
        if (pending_.empty()) return;
        scheduled = pending_.front();
        pending_.pop_front();
      } else if (now >= end_) {
        return;
      }
      Issue(conn, scheduled, now);
    }
  }

  void Issue(Conn& conn, Clock::time_point scheduled, Clock::time_point now) {
    auto* call = new Call;
    call->scheduled = scheduled;
    call->sent = now;
    auto header = [](const char* name, const std::string_view value) {
      return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                        reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())),
                        std::strlen(name), value.size(),
                        NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
    };
    const nghttp2_nv headers[] = {header(":method", "POST"),
                                  header(":scheme", "http"),
                                  header(":path", kModelInfer),
                                  header(":authority", options_.target),
                                  header("content-type", "application/grpc"),
                                  header("te", "trailers"),
                                  header("authorization", authorization_)};
    nghttp2_data_provider body;
    body.source.ptr = call;
    body.read_callback = &H2LoadRunner::ReadBody;
    const size_t count = std::size(headers) - (authorization_.empty() ? 1 : 0);
    const int32_t stream =
        nghttp2_submit_request(conn.session, nullptr, headers, count, &body, call);
    if (stream < 0) {
      AddTransportError(run_, fmt::format("HTTP/2 request: {}", nghttp2_strerror(stream)));
      delete call;
      return;
    }
    conn.calls.insert(call);
    ++run_.sent;
  }

  static ssize_t ReadBody(nghttp2_session*, int32_t, uint8_t* buffer, size_t length,
                          uint32_t* flags, nghttp2_data_source* source, void* user_data) {
    auto* call = static_cast<Call*>(source->ptr);
    const std::string& body = static_cast<Conn*>(user_data)->runner->body_;
    const size_t n = std::min(length, body.size() - call->sent_bytes);
    std::memcpy(buffer, body.data() + call->sent_bytes, n);
    call->sent_bytes += n;
    if (call->sent_bytes == body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  static int OnHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                      size_t name_length, const uint8_t* value, size_t value_length, uint8_t,
                      void*) {
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    auto* call =
        static_cast<Call*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
    if (call == nullptr) return 0;
    const std::string_view header(reinterpret_cast<const char*>(name), name_length);
    const char* text = reinterpret_cast<const char*>(value);
    if (header == "grpc-status") {
      int code = -1;
      std::from_chars(text, text + value_length, code);
      call->grpc_status = code;
    } else if (header == "retry-after") {
      call->retry_after = true;
    }
    return 0;
  }

  static int OnClose(nghttp2_session* session, int32_t stream, uint32_t error_code,
                     void* user_data) {
    auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(session, stream));
    if (call == nullptr) return 0;
    auto& conn = *static_cast<Conn*>(user_data);
    conn.calls.erase(call);
    conn.runner->Done(call, error_code);
    return 0;
  }

  void Done(Call* call, uint32_t error_code) {
    const Clock::time_point now = Clock::Real().Now();
    StatusCode outcome = StatusCode::kUnavailable;
    if (call->grpc_status < 0) {
      // No answer from the service: the stream was reset or refused.
      AddTransportError(run_, fmt::format("stream closed without a gRPC status (HTTP/2 {})",
                                          nghttp2_http2_strerror(error_code)));
    } else {
      ++run_.answered;
      const auto code = static_cast<grpc::StatusCode>(call->grpc_status);
      if (code == grpc::StatusCode::UNAVAILABLE && !call->retry_after) {
        ++run_.unavailable_without_retry_after;
      }
      outcome = OutcomeOf(code);
    }
    RecordCall(run_, options_, measure_from_, call->scheduled, call->sent, now, outcome);
    delete call;
  }

  void Read(Conn& conn) {
    conn.socket.async_read_some(net::buffer(conn.in), [this, &conn, generation = conn.generation](
                                                          boost::system::error_code ec, size_t n) {
      if (conn.generation != generation) return;  // Closed meanwhile.
      if (ec) return Lost(conn, fmt::format("read: {}", ec.message()));
      const ssize_t used = nghttp2_session_mem_recv(conn.session, conn.in.data(), n);
      if (used < 0) return Lost(conn, fmt::format("HTTP/2: {}", nghttp2_strerror(used)));
      Fill(conn);
      if (!Flush(conn)) return;
      if (conn.calls.empty() && sending_over(Clock::Real().Now())) return Close(conn);
      Read(conn);
    });
  }

  // Hands what nghttp2 has to send to the socket, one write at a time. False when the connection
  // was lost.
  bool Flush(Conn& conn) {
    if (conn.write_pending) return true;  // The write's completion flushes again.
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(conn.session, &data);
      if (n < 0) {
        Lost(conn, fmt::format("HTTP/2: {}", nghttp2_strerror(static_cast<int>(n))));
        return false;
      }
      if (n == 0) break;
      conn.out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (conn.out.empty()) return true;
    std::swap(conn.out, conn.writing);
    conn.out.clear();
    conn.write_pending = true;
    net::async_write(
        conn.socket, net::buffer(conn.writing),
        [this, &conn, generation = conn.generation](boost::system::error_code ec, size_t) {
          if (conn.generation != generation) return;  // Closed meanwhile.
          conn.write_pending = false;
          if (ec) return Lost(conn, fmt::format("write: {}", ec.message()));
          Flush(conn);
        });
    return true;
  }

  // The connection failed: its calls in flight are lost; carry on with a new one.
  void Lost(Conn& conn, std::string what) {
    AddTransportError(run_, std::move(what));
    const Clock::time_point now = Clock::Real().Now();
    for (Call* call : conn.calls) {
      RecordCall(run_, options_, measure_from_, call->scheduled, call->sent, now,
                 StatusCode::kUnavailable);
    }
    Close(conn);
    if (sending_over(now)) return;
    conn.socket = tcp::socket(ioc_);
    Connect(conn);
  }

  void Close(Conn& conn) {
    conn.EndSession();
    ++conn.generation;
    conn.out.clear();
    conn.write_pending = false;
    boost::system::error_code ignored;
    conn.socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn.socket.close(ignored);
  }

  // Open loop: the next Poisson arrival, then hand it to a connection with room.
  void ScheduleArrival() {
    std::exponential_distribution<double> gap(options_.rate);
    next_arrival_ += std::chrono::duration_cast<Clock::duration>(Seconds(gap(rng_)));
    if (next_arrival_ >= end_) {
      // No more arrivals: idle connections close; busy ones after their last answer.
      arrivals_over_ = true;
      for (auto& conn : conns_) {
        if (conn->session != nullptr && conn->calls.empty() && pending_.empty()) Close(*conn);
      }
      return;
    }
    timer_.expires_at(next_arrival_);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      pending_.push_back(next_arrival_);
      for (size_t i = 0; i < conns_.size() && !pending_.empty(); ++i) {
        Conn& conn = *conns_[next_conn_++ % conns_.size()];
        if (conn.session == nullptr) continue;
        Fill(conn);
        Flush(conn);
      }
      ScheduleArrival();
    });
  }

  const GrpcLoadOptions& options_;
  const int connections_;
  std::string body_;           // The length-prefixed request.
  std::string authorization_;  // "Bearer <key>", or empty.
  nghttp2_session_callbacks* callbacks_ = nullptr;
  net::io_context ioc_{1};
  tcp::endpoint endpoint_;
  net::steady_timer timer_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Conn>> conns_;
  size_t next_conn_ = 0;
  std::deque<Clock::time_point> pending_;
  bool arrivals_over_ = false;
  Clock::time_point start_, measure_from_, end_, next_arrival_;
  HttpLoadRun run_;  // Counts and records as they come; summarised at the end.
};

}  // namespace

Result<std::string> ParseGrpcTarget(std::string_view url) {
  for (std::string_view scheme : {"grpc://", "http://"}) {
    if (url.substr(0, scheme.size()) == scheme) url.remove_prefix(scheme.size());
  }
  if (const size_t slash = url.find('/'); slash != std::string_view::npos) {
    url = url.substr(0, slash);
  }
  const size_t colon = url.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == url.size()) {
    return Status::InvalidArgument(
        fmt::format("a gRPC address is host:port, e.g. 127.0.0.1:8001 (got '{}')", url));
  }
  return std::string(url);
}

Result<GrpcClient> ParseGrpcClient(std::string_view name) {
  if (name == "h2") return GrpcClient::kH2;
  if (name == "grpc++") return GrpcClient::kGrpcCpp;
  return Status::InvalidArgument(
      fmt::format("--grpc-client is h2 (nghttp2) or grpc++ (gRPC C++), not '{}'", name));
}

Result<HttpLoadRun> RunGrpcLoad(const GrpcLoadOptions& options) {
  if (options.concurrency < 1) return Status::InvalidArgument("--concurrency must be >= 1");
  const int channels = std::min(
      options.concurrency,
      options.channels > 0 ? options.channels : std::max(1, (options.concurrency + 15) / 16));
  std::vector<std::shared_ptr<grpc::Channel>> pool{MakeChannel(options.target, 0)};
  auto metadata_stub = inference::GRPCInferenceService::NewStub(pool[0]);
  auto request = BuildRequest(*metadata_stub, options);
  if (!request.ok()) return request.status();
  if (options.client == GrpcClient::kH2) {
    H2LoadRunner runner(options, *request, channels);
    return runner.Run();
  }
  for (int i = 1; i < channels; ++i) pool.push_back(MakeChannel(options.target, i));
  GrpcLoadRunner runner(options, *request, pool);
  return runner.Run();
}

}  // namespace sluice
