// Request traces.
#include "metrics/trace.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cmath>
#include <random>
#include <unordered_map>

#include "common/json_writer.h"
#include "common/system_info.h"

namespace sluice {
namespace {

constexpr uint64_t kInstanceLaneBase = 1'000'000;
// The writer thread writes what is pending this often, or at once when this much is.
constexpr auto kWriterPeriod = std::chrono::milliseconds(20);
constexpr size_t kWakeAt = 4096;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // Upper case is invalid in traceparent.
}

// `out` from the 2 * out.size() lower-case hex digits of `hex`.
bool ParseHex(std::string_view hex, uint8_t* out, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

std::string Hex(const uint8_t* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string SpanHex(uint64_t id) {
  std::array<uint8_t, 8> bytes{};
  for (int i = 7; i >= 0; --i, id >>= 8) bytes[static_cast<size_t>(i)] = id & 0xff;
  return Hex(bytes.data(), bytes.size());
}

// Appends JSON text: literals, integers and microseconds from nanoseconds, by hand (a request's
// dozen events are formatted on the writer thread at the server's request rate).
class TraceText {
 public:
  explicit TraceText(std::string& out) : out_(out) {}
  TraceText& operator<<(std::string_view text) {
    out_.append(text);
    return *this;
  }
  TraceText& Int(int64_t v) {
    std::array<char, 24> digits{};
    auto end = std::to_chars(digits.data(), digits.data() + digits.size(), v).ptr;
    out_.append(digits.data(), static_cast<size_t>(end - digits.data()));
    return *this;
  }
  // `ns` (>= 0) as microseconds with three decimals.
  TraceText& Micros(int64_t ns) {
    Int(ns / 1000);
    const int64_t frac = ns % 1000;
    const char decimals[4] = {'.', static_cast<char>('0' + frac / 100),
                              static_cast<char>('0' + frac / 10 % 10),
                              static_cast<char>('0' + frac % 10)};
    out_.append(decimals, 4);
    return *this;
  }
  // A JSON string: as is when nothing in it needs escaping, else through JsonQuote.
  TraceText& Quoted(std::string_view v) {
    for (char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u >= 0x80 || c == '"' || c == '\\') {
        out_.append(JsonQuote(v));
        return *this;
      }
    }
    out_.push_back('"');
    out_.append(v);
    out_.push_back('"');
    return *this;
  }

 private:
  std::string& out_;
};

}  // namespace

std::optional<TraceContext> ParseTraceparent(std::string_view header) {
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  while (!header.empty() && (header.front() == ' ' || header.front() == '\t')) {
    header.remove_prefix(1);
  }
  while (!header.empty() && (header.back() == ' ' || header.back() == '\t')) {
    header.remove_suffix(1);
  }
  if (header.size() < 55 || header[2] != '-' || header[35] != '-' || header[52] != '-') {
    return std::nullopt;
  }
  uint8_t version = 0;
  if (!ParseHex(header.substr(0, 2), &version, 1) || version == 0xff) return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append "-..." fields.
  if (header.size() > 55 && (version == 0 || header[55] != '-')) return std::nullopt;
  TraceContext context;
  std::array<uint8_t, 8> parent{};
  if (!ParseHex(header.substr(3, 32), context.trace_id.data(), 16) ||
      !ParseHex(header.substr(36, 16), parent.data(), 8) ||
      !ParseHex(header.substr(53, 2), &context.flags, 1)) {
    return std::nullopt;
  }
  for (uint8_t b : parent) context.parent_id = (context.parent_id << 8) | b;
  bool zero_trace = true;
  for (uint8_t b : context.trace_id) zero_trace &= b == 0;
  if (zero_trace || context.parent_id == 0) return std::nullopt;
  return context;
}

std::string FormatTraceparent(const TraceContext& context, uint64_t span_id) {
  return fmt::format("00-{}-{}-{}", Hex(context.trace_id.data(), 16), SpanHex(span_id),
                     Hex(&context.flags, 1));
}

uint64_t NewSpanId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

const char* TraceStageName(TraceStage stage) {
  switch (stage) {
    case TraceStage::kDelay:
      return "delay";
    case TraceStage::kSend:
      return "send";
    case TraceStage::kSubmit:
      return "submit";
    case TraceStage::kReceive:
      return "receive";
    case TraceStage::kComplete:
      return "complete";
    case TraceStage::kRead:
      return "read";
    case TraceStage::kDecode:
      return "decode";
    case TraceStage::kQueue:
      return "queue";
    case TraceStage::kBatch:
      return "batch";
    case TraceStage::kCompute:
      return "compute";
    case TraceStage::kRespond:
      return "respond";
    case TraceStage::kEncode:
      return "encode";
    case TraceStage::kWrite:
      return "write";
    case TraceStage::kHandle:
      return "handle";
  }
  return "?";
}

uint64_t TraceLanes::Assign(Clock::time_point start, Clock::time_point end) {
  for (size_t lane = 0; lane < ends_.size(); ++lane) {
    if (ends_[lane] <= start) {
      ends_[lane] = std::max(ends_[lane], end);
      return lane + 1;
    }
  }
  ends_.push_back(end);
  return ends_.size();
}

void RequestTrace::SetEngineTimes(const InferResponse& response) {
  const RequestTimes& t = response.times;
  End(TraceStage::kDecode, t.enqueue);
  End(TraceStage::kQueue, t.dispatch);
  End(TraceStage::kBatch, t.compute_start);
  End(TraceStage::kCompute, t.compute_end);
  batch_id = response.batch_id;
  batch_size = response.batch_size;
  instance = response.instance;
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::Open(TraceOptions options) {
  if (!(options.sample_rate >= 0 && options.sample_rate <= 1)) {
    return Status::InvalidArgument(
        fmt::format("the trace sample rate must be in [0, 1] (got {})", options.sample_rate));
  }
  std::FILE* file = std::fopen(options.path.c_str(), "wb");
  if (file == nullptr) {
    return Status::InvalidArgument(
        fmt::format("cannot write the trace file {}: {}", options.path.string(),
                    std::error_code(errno, std::generic_category()).message()));
  }
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(options), file));
}

TraceWriter::TraceWriter(TraceOptions options, std::FILE* file)
    : options_(std::move(options)), origin_(Clock::Real().Now()), file_(file) {
  std::string head = fmt::format(
      "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"started\":{},\"sample_rate\":{}}},"
      "\"traceEvents\":[\n"
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{{\"name\":{}}}}}",
      JsonQuote(LocalTimestamp()), options_.sample_rate, JsonQuote(options_.process_name));
  bytes_ = std::fwrite(head.data(), 1, head.size(), file_);
  writer_ = std::thread([this] { WriterLoop(); });
}

TraceWriter::~TraceWriter() { (void)Close(); }  // A failure was logged by Close()'s caller, if any.

bool TraceWriter::ShouldSample(bool forced) {
  if (forced || options_.sample_rate >= 1) return true;
  if (options_.sample_rate <= 0) return false;
  // Request n is traced when floor((n + 1) * rate) passes an integer: exactly rate of them, evenly
  // spread.
  const uint64_t n = sample_counter_.fetch_add(1, std::memory_order_relaxed);
  return std::floor(static_cast<double>(n + 1) * options_.sample_rate) >
         std::floor(static_cast<double>(n) * options_.sample_rate);
}

void TraceWriter::Record(RequestTrace trace) {
  MutexLock lock(mu_);
  if (closing_ || pending_.size() >= options_.max_pending) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  pending_.push_back(std::move(trace));
  // The writer wakes on its own every kWriterPeriod; a burst wakes it early. Waking it for each
  // request would cost a context switch per request.
  if (pending_.size() == kWakeAt) wake_.Signal();
}

Status TraceWriter::Close() {
  {
    MutexLock lock(mu_);
    if (closed_) return close_status_;
    closing_ = true;
    wake_.SignalAll();
  }
  if (writer_.joinable()) writer_.join();
  MutexLock lock(mu_);
  if (!closed_) {
    closed_ = true;
    static constexpr std::string_view kTail = "\n]}\n";
    const bool ok = std::fwrite(kTail.data(), 1, kTail.size(), file_) == kTail.size();
    if (std::fclose(file_) != 0 || !ok) {
      close_status_ =
          Status::Internal(fmt::format("cannot finish the trace file {}", options_.path.string()));
    }
    if (dropped() > 0) {
      spdlog::warn("trace {}: {} request(s) traced, {} dropped (writer behind or file full)",
                   options_.path.string(), written(), dropped());
    }
  }
  return close_status_;
}

int64_t TraceWriter::Nanos(Clock::time_point t) const {
  // Time before the file was opened (a request already under way) is clamped to its opening.
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count());
}

void TraceWriter::WriterLoop() {
  std::vector<RequestTrace> batch;
  std::string out;
  while (true) {
    bool closing = false;
    {
      MutexLock lock(mu_);
      while (pending_.size() < kWakeAt && !closing_) {
        if (!wake_.WaitFor(lock, kWriterPeriod) && !pending_.empty()) break;  // Timed out.
      }
      batch.swap(pending_);
      closing = closing_;
    }
    out.clear();
    for (const RequestTrace& trace : batch) {
      if (full_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const size_t before = out.size();
      Format(trace, out);
      if (bytes_ + out.size() > options_.max_bytes) {
        out.resize(before);
        full_ = true;
        spdlog::warn("trace {}: reached {} bytes; later requests are not traced",
                     options_.path.string(), options_.max_bytes);
        dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      written_.fetch_add(1, std::memory_order_relaxed);
    }
    bytes_ += std::fwrite(out.data(), 1, out.size(), file_);
    batch.clear();
    if (closing) {
      MutexLock lock(mu_);
      if (pending_.empty()) return;
    }
  }
}

void TraceWriter::Format(const RequestTrace& trace, std::string& text) {
  TraceText out(text);
  if (named_lanes_.insert(trace.lane).second) {
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":";
    out.Int(static_cast<int64_t>(trace.lane)) << ",\"args\":{\"name\":";
    out.Quoted(fmt::format("{} {}", options_.lane_prefix, trace.lane)) << "}}";
  }
  // The stages, back to back from the start, in integer nanoseconds from the origin.
  struct Span {
    TraceStage stage;
    int64_t start, end;
  };
  std::array<Span, kTraceStageCount> spans{};
  size_t count = 0;
  int64_t at = Nanos(trace.start);
  const int64_t start = at;
  for (int s = 0; s < kTraceStageCount; ++s) {
    const Clock::time_point end = trace.ends[static_cast<size_t>(s)];
    if (end == Clock::time_point{}) continue;
    const int64_t end_ns = std::max(at, Nanos(end));
    spans[count++] = {static_cast<TraceStage>(s), at, end_ns};
    at = end_ns;
  }
  const int64_t lane = static_cast<int64_t>(trace.lane);
  out << ",\n{\"name\":";
  out.Quoted(trace.name) << ",\"cat\":\"request\",\"ph\":\"X\",\"ts\":";
  out.Micros(start) << ",\"dur\":";
  out.Micros(at - start) << ",\"pid\":1,\"tid\":";
  out.Int(lane) << ",\"args\":{\"status\":";
  out.Int(trace.status);
  if (!trace.model.empty()) {
    out << ",\"model\":";
    out.Quoted(trace.model);
    if (trace.batch_id != 0) {
      out << ",\"batch_id\":";
      out.Int(static_cast<int64_t>(trace.batch_id)) << ",\"batch_size\":";
      out.Int(trace.batch_size) << ",\"instance\":";
      out.Int(trace.instance);
    }
  }
  if (trace.trace_id != std::array<uint8_t, 16>{}) {
    out << ",\"trace_id\":\"" << Hex(trace.trace_id.data(), 16) << "\"";
  }
  if (trace.parent_span_id != 0) {
    out << ",\"parent_span_id\":\"" << SpanHex(trace.parent_span_id) << "\"";
  }
  if (trace.span_id != 0) out << ",\"span_id\":\"" << SpanHex(trace.span_id) << "\"";
  out << "}}";
  for (size_t i = 0; i < count; ++i) {
    const Span& s = spans[i];
    out << ",\n{\"name\":\"" << TraceStageName(s.stage)
        << "\",\"cat\":\"stage\",\"ph\":\"X\",\"ts\":";
    out.Micros(s.start) << ",\"dur\":";
    out.Micros(s.end - s.start) << ",\"pid\":1,\"tid\":";
    out.Int(lane);
    const bool batch = s.stage == TraceStage::kCompute && trace.batch_id != 0;
    if (batch) {
      out << ",\"args\":{\"instance\":";
      out.Int(trace.instance) << ",\"batch_id\":";
      out.Int(static_cast<int64_t>(trace.batch_id)) << ",\"batch_size\":";
      out.Int(trace.batch_size) << "}";
    }
    out << "}";
    // The batch itself, once, on its instance's lane.
    if (!batch || trace.instance < 0) continue;
    if (batches_seen_.size() > 100'000) batches_seen_.clear();
    const uint64_t key =
        std::hash<std::string>()(trace.model) * 0x9e3779b97f4a7c15ULL ^ trace.batch_id;
    if (!batches_seen_.insert(key).second) continue;
    const std::string instance_name = fmt::format("{} instance {}", trace.model, trace.instance);
    auto [instance_lane, inserted] =
        instance_lanes_.try_emplace(instance_name, kInstanceLaneBase + instance_lanes_.size());
    const int64_t batch_lane = static_cast<int64_t>(instance_lane->second);
    if (inserted) {
      out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":";
      out.Int(batch_lane) << ",\"args\":{\"name\":";
      out.Quoted(instance_name) << "}}";
    }
    out << ",\n{\"name\":\"batch ";
    out.Int(static_cast<int64_t>(trace.batch_id)) << "\",\"cat\":\"batch\",\"ph\":\"X\",\"ts\":";
    out.Micros(s.start) << ",\"dur\":";
    out.Micros(s.end - s.start) << ",\"pid\":1,\"tid\":";
    out.Int(batch_lane) << ",\"args\":{\"model\":";
    out.Quoted(trace.model) << ",\"batch_id\":";
    out.Int(static_cast<int64_t>(trace.batch_id)) << ",\"batch_size\":";
    out.Int(trace.batch_size) << "}}";
  }
}

}  // namespace sluice
