// Each stream runs on its own thread with a blocking Beast client: a language-model level has a
// few dozen streams at most, and a thread per stream timestamps every chunk the moment it is read.
#include "bench/llm_bench.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "bench/plot.h"
#include "common/json_writer.h"

namespace sluice {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// Everyday words: prompts read as (odd) English, so every tokenizer splits them much the same.
constexpr const char* kWords[] = {
    "the",       "river",    "carried",    "light",     "across",   "a",        "valley",
    "where",     "old",      "farmers",    "planted",   "wheat",    "and",      "barley",
    "every",     "spring",   "while",      "children",  "counted",  "clouds",   "over",
    "quiet",     "stone",    "bridges",    "near",      "market",   "town",     "history",
    "of",        "printing", "press",      "began",     "with",     "metal",    "type",
    "ink",       "paper",    "mills",      "merchants", "sold",     "books",    "to",
    "students",  "teachers", "scientists", "measured",  "distance", "between",  "stars",
    "planets",   "moons",    "engineers",  "built",     "engines",  "ships",    "railways",
    "that",      "changed",  "trade",      "forever",   "music",    "filled",   "small",
    "rooms",     "under",    "warm",       "lamps",     "winter",   "nights",   "long",
    "stories",   "about",    "kings",      "queens",    "journeys", "through",  "forests",
    "mountains", "deserts",  "seas",       "computer",  "programs", "sort",     "numbers",
    "search",    "lists",    "compress",   "files",     "send",     "messages", "networks",
    "servers",   "answer",   "requests",   "quickly",   "under",    "heavy",    "load",
    "during",    "busy",     "hours",      "cooks",     "bake",     "bread",    "simmer",
    "soup",      "slice",    "fresh",      "tomatoes",  "garden",   "birds",    "sing",
    "morning",   "evening",  "bells",      "ring",      "people",   "walk",     "slowly",
    "home",      "after",    "work",       "thinking",  "tomorrow", "weather",  "rain",
    "snow",      "wind",     "sun",        "bright",    "dark",     "cold",     "green",
    "blue",      "yellow",   "red",        "seven",     "twelve",   "hundred",  "thousand",
    "first",     "second",   "last",       "next"};
constexpr size_t kWordCount = sizeof(kWords) / sizeof(kWords[0]);

double Now(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string CompletionBody(const LlmBenchOptions& o, const std::string& model,
                           const std::string& prompt, int max_tokens, bool stream) {
  JsonWriter json;
  json.BeginObject()
      .Field("model", model)
      .Field("prompt", prompt)
      .Field("max_tokens", int64_t{max_tokens})
      .Field("temperature", 0.0);
  if (o.ignore_eos) json.Field("ignore_eos", true);
  if (stream) {
    json.Field("stream", true).Key("stream_options").BeginObject();
    json.Field("include_usage", true).EndObject();
  }
  json.EndObject();
  return json.str();
}

http::request<http::string_body> MakeRequest(const HttpTarget& target, const std::string& path,
                                             const std::string& api_key, std::string body) {
  http::request<http::string_body> request(http::verb::post, path, 11);
  request.set(http::field::host, fmt::format("{}:{}", target.host, target.port));
  request.set(http::field::content_type, "application/json");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
  request.body() = std::move(body);
  request.prepare_payload();
  return request;
}

// A blocking POST (or GET, without a body) whose whole answer is returned (probes, the model list).
Result<std::string> Call(http::verb verb, const HttpTarget& target, const std::string& path,
                         const std::string& api_key, std::string body) {
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(600));
    stream.connect(resolver.resolve(target.host, std::to_string(target.port)));
    auto request = MakeRequest(target, path, api_key, std::move(body));
    if (verb == http::verb::get) {
      request.method(verb);
      request.erase(http::field::content_type);
      request.prepare_payload();
    }
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(stream, buffer, response);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (response.result_int() != 200) {
      return Status::InvalidArgument(
          fmt::format("POST {} answered {}: {}", path, response.result_int(), response.body()));
    }
    return std::move(response.body());
  } catch (const std::exception& e) {
    return Status::Unavailable(
        fmt::format("POST http://{}:{}{} failed: {}", target.host, target.port, path, e.what()));
  }
}

// Streams one completion, timestamping every chunk that carries text.
LlmRequestRecord StreamOne(const HttpTarget& target, const std::string& api_key,
                           const std::string& body, std::chrono::steady_clock::time_point t0) {
  LlmRequestRecord record;
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(3600));
    stream.connect(resolver.resolve(target.host, std::to_string(target.port)));
    auto request = MakeRequest(target, "/v1/completions", api_key, body);
    record.sent = Now(t0);
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    SseReader sse;
    bool saw_done = false;
    auto on_chunk = [&](uint64_t, beast::string_view body, beast::error_code&) -> size_t {
      const double now = Now(t0);
      const std::string_view data(body.data(), body.size());
      for (const std::string& payload : sse.Feed(data)) {
        const StreamChunk chunk = ParseStreamChunk(payload);
        if (chunk.done) saw_done = true;
        if (!chunk.error.empty()) record.error = chunk.error;
        if (chunk.has_text) {
          if (record.first_token < 0) record.first_token = now;
          record.chunk_times.push_back(now);
          record.text += chunk.text;
        }
        if (chunk.prompt_tokens >= 0) record.prompt_tokens = chunk.prompt_tokens;
        if (chunk.completion_tokens >= 0) record.completion_tokens = chunk.completion_tokens;
      }
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    http::read_header(stream, buffer, parser);
    while (!parser.is_done()) http::read_some(stream, buffer, parser);
    record.done = Now(t0);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    const unsigned status = parser.get().result_int();
    if (status != 200) {
      record.error = fmt::format("HTTP {}: {}", status, parser.get().body());
    } else if (!saw_done && record.error.empty()) {
      record.error = "the stream ended without [DONE]";
    }
    record.ok = record.error.empty() && status == 200;
  } catch (const std::exception& e) {
    record.done = Now(t0);
    record.error = e.what();
  }
  return record;
}

LlmDistribution Distribution(std::vector<double> seconds) {
  LlmDistribution d;
  if (seconds.empty()) return d;
  std::sort(seconds.begin(), seconds.end());
  d.mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size() * 1e3;
  d.median = NearestRankPercentile(seconds, 50) * 1e3;
  d.p90 = NearestRankPercentile(seconds, 90) * 1e3;
  d.p99 = NearestRankPercentile(seconds, 99) * 1e3;
  return d;
}

// Prompt tokens the server counts for `prompt` (a non-streamed one-token completion).
Result<int> CountPromptTokens(const LlmBenchOptions& o, const HttpTarget& target,
                              const std::string& model, const std::string& prompt) {
  auto body = Call(http::verb::post, target, "/v1/completions", o.api_key,
                   CompletionBody(o, model, prompt, 1, false));
  if (!body.ok()) return body.status();
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  int64_t tokens = 0;
  if (parser.parse(*body).get(doc) || doc["usage"]["prompt_tokens"].get(tokens)) {
    return Status::InvalidArgument("the completion answer has no usage.prompt_tokens: " + *body);
  }
  return static_cast<int>(tokens);
}

}  // namespace

std::vector<std::string> SseReader::Feed(std::string_view bytes) {
  pending_.append(bytes);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with("data:")) {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      out.emplace_back(line);
    }
  }
  pending_.erase(0, start);
  return out;
}

StreamChunk ParseStreamChunk(std::string_view data) {
  StreamChunk chunk;
  if (data == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(data.data(), data.size()).get(doc)) {
    chunk.error = fmt::format("not JSON: {}", data.substr(0, 200));
    return chunk;
  }
  simdjson::dom::element error;
  if (!doc["error"].get(error)) {
    std::string_view message;
    chunk.error = error["message"].get(message) ? std::string(data) : std::string(message);
    return chunk;
  }
  simdjson::dom::array choices;
  if (!doc["choices"].get(choices)) {
    for (simdjson::dom::element choice : choices) {
      std::string_view text;
      if ((!choice["text"].get(text) || !choice["delta"]["content"].get(text)) && !text.empty()) {
        chunk.has_text = true;
        chunk.text += text;
      }
    }
  }
  simdjson::dom::element usage;
  if (!doc["usage"].get(usage) && usage.is_object()) {
    int64_t value = 0;
    if (!usage["prompt_tokens"].get(value)) chunk.prompt_tokens = static_cast<int>(value);
    if (!usage["completion_tokens"].get(value)) chunk.completion_tokens = static_cast<int>(value);
  }
  return chunk;
}

LlmLevelSummary SummarizeLlmLevel(const std::vector<LlmRequestRecord>& records) {
  LlmLevelSummary s;
  s.requests = static_cast<int>(records.size());
  if (records.empty()) return s;
  double first = records[0].sent, last = records[0].done;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const LlmRequestRecord& r : records) {
    first = std::min(first, r.sent);
    last = std::max(last, r.done);
    if (!r.ok) {
      if (s.first_errors.size() < 5) s.first_errors.push_back(r.error);
      continue;
    }
    ++s.ok;
    s.prompt_tokens += r.prompt_tokens;
    s.completion_tokens += r.completion_tokens;
    e2el.push_back(r.done - r.sent);
    if (r.first_token >= 0) {
      ttft.push_back(r.first_token - r.sent);
      if (r.completion_tokens > 1) {
        tpot.push_back((r.done - r.first_token) / (r.completion_tokens - 1));
      }
    }
    for (size_t i = 1; i < r.chunk_times.size(); ++i) {
      itl.push_back(r.chunk_times[i] - r.chunk_times[i - 1]);
    }
  }
  s.duration = last - first;
  if (s.duration > 0) {
    s.output_tokens_per_second = s.completion_tokens / s.duration;
    s.total_tokens_per_second = (s.prompt_tokens + s.completion_tokens) / s.duration;
    s.requests_per_second = s.ok / s.duration;
  }
  s.ttft = Distribution(std::move(ttft));
  s.tpot = Distribution(std::move(tpot));
  s.itl = Distribution(std::move(itl));
  s.e2el = Distribution(std::move(e2el));
  return s;
}

std::vector<std::string> MakeLlmPrompts(int count, int words, uint64_t seed, int shared_words) {
  shared_words = std::clamp(shared_words, 0, words);
  std::string preamble;
  std::mt19937_64 preamble_rng(0x5eed);  // Independent of the seed: one preamble for the run.
  std::uniform_int_distribution<size_t> pick(0, kWordCount - 1);
  for (int w = 0; w < shared_words; ++w) {
    preamble += w == 0 ? "" : " ";
    preamble += kWords[pick(preamble_rng)];
  }
  std::mt19937_64 rng(seed);
  std::vector<std::string> prompts;
  for (int i = 0; i < count; ++i) {
    // A distinct opening per request (after the preamble), so nothing else is shared.
    std::string prompt = preamble.empty() ? "" : preamble + "\n";
    prompt += fmt::format("Request {}:", i + 1);
    for (int w = shared_words; w < words; ++w) {
      prompt += ' ';
      prompt += kWords[pick(rng)];
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

std::optional<std::pair<double, double>> PrefixCacheCounters(std::string_view metrics) {
  double queries = 0, hits = 0;
  bool found = false;
  size_t start = 0;
  while (start < metrics.size()) {
    size_t end = metrics.find('\n', start);
    if (end == std::string_view::npos) end = metrics.size();
    const std::string_view line = metrics.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const std::string_view name = line.substr(0, name_end);
    double* into = nullptr;
    if (name == "sluice_llm_prefix_cache_queries_total" || name == "vllm:prefix_cache_queries" ||
        name == "vllm:prefix_cache_queries_total") {
      into = &queries;
    } else if (name == "sluice_llm_prefix_cache_hits_total" || name == "vllm:prefix_cache_hits" ||
               name == "vllm:prefix_cache_hits_total") {
      into = &hits;
    }
    const size_t space = line.rfind(' ');
    if (into == nullptr || space == std::string_view::npos) continue;
    *into += std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr);
    found = true;
  }
  if (!found) return std::nullopt;
  return std::make_pair(queries, hits);
}

Result<LlmBenchRun> RunLlmBench(const LlmBenchOptions& o,
                                const std::function<void(const std::string&)>& progress) {
  auto target = ParseHttpUrl(o.url);
  if (!target.ok()) return target.status();
  if (o.prompt_tokens < 1 || o.output_tokens < 1) {
    return Status::InvalidArgument("--prompt-tokens and --output-tokens must be >= 1");
  }
  if (o.shared_prefix_tokens < 0 || o.shared_prefix_tokens >= o.prompt_tokens) {
    return Status::InvalidArgument("--shared-prefix-tokens must lie in [0, --prompt-tokens)");
  }
  for (int c : o.concurrency) {
    if (c < 1) return Status::InvalidArgument("every --concurrency level must be >= 1");
  }
  for (double r : o.rates) {
    if (!(r > 0)) return Status::InvalidArgument("every --rate must be > 0");
  }
  if (o.turns < 1) return Status::InvalidArgument("--turns must be >= 1");
  if (o.turns > 1 && !o.rates.empty()) {
    return Status::InvalidArgument("--turns applies to --concurrency levels, not --rate");
  }
  LlmBenchRun run;
  run.model = o.model;
  if (run.model.empty()) {
    auto models = Call(http::verb::get, *target, "/v1/models", o.api_key, "");
    if (!models.ok()) return models.status();
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    std::string_view id;
    if (parser.parse(*models).get(doc) || doc["data"].at(0)["id"].get(id)) {
      return Status::InvalidArgument("GET /v1/models lists no model: " + *models);
    }
    run.model = std::string(id);
  }

  // Size the prompts: words per prompt scaled until the server counts about prompt_tokens; the
  // preamble takes its share of the words.
  int words = std::max(1, o.prompt_tokens * 3 / 4);
  int counted = 0;
  auto shared_words = [&] {
    return static_cast<int>(std::lround(double(words) * o.shared_prefix_tokens / o.prompt_tokens));
  };
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto tokens = CountPromptTokens(o, *target, run.model,
                                    MakeLlmPrompts(1, words, o.seed, shared_words())[0]);
    if (!tokens.ok()) return tokens.status();
    counted = *tokens;
    if (std::abs(counted - o.prompt_tokens) <= std::max(1, o.prompt_tokens / 50)) break;
    words = std::max(1, static_cast<int>(std::lround(words * double(o.prompt_tokens) / counted)));
  }
  run.prompt_words = words;
  progress(fmt::format("model {}: prompts of {} words ({} tokens by the server's count)", run.model,
                       words, counted));

  struct Level {
    int concurrency;
    double rate;
  };
  std::vector<Level> levels;
  for (int c : o.concurrency) levels.push_back({c, 0});
  for (double r : o.rates) levels.push_back({0, r});
  int64_t prompt_tokens_sum = 0, prompt_requests = 0;
  for (size_t li = 0; li < levels.size(); ++li) {
    const Level level = levels[li];
    int n = o.requests > 0          ? o.requests
            : level.concurrency > 0 ? std::max(8, 2 * level.concurrency)
                                    : 16;
    n = (n + o.turns - 1) / o.turns * o.turns;  // Whole conversations.
    const auto prompts = MakeLlmPrompts(n, words, o.seed + 1000 * (li + 1), shared_words());
    auto prefix_counters = [&]() -> std::optional<std::pair<double, double>> {
      auto metrics = Call(http::verb::get, *target, "/metrics", o.api_key, "");
      if (!metrics.ok()) return std::nullopt;
      return PrefixCacheCounters(*metrics);
    };
    const auto counters_before = prefix_counters();
    std::vector<std::string> bodies;
    for (const std::string& p : prompts) {
      bodies.push_back(CompletionBody(o, run.model, p, o.output_tokens, true));
    }
    progress(level.concurrency > 0 ? fmt::format("[{}/{}] concurrency {}: {} requests", li + 1,
                                                 levels.size(), level.concurrency, n)
                                   : fmt::format("[{}/{}] {} requests/s (Poisson): {} requests",
                                                 li + 1, levels.size(), level.rate, n));
    std::vector<LlmRequestRecord> records(static_cast<size_t>(n));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    std::atomic<int> next{0};  // Closed loop: the next request to send. Outlives the threads.
    // Closed loop: request i is turn i % turns of conversation i / turns; a stream takes whole
    // conversations, each turn sending the history, its answer and a new message. (Outlive the
    // threads.)
    const auto follow_ups = MakeLlmPrompts(n, std::max(1, words / 4), o.seed + 77 * (li + 1));
    const int conversations = n / o.turns;
    if (level.concurrency > 0) {
      for (int t = 0; t < std::min(level.concurrency, conversations); ++t) {
        threads.emplace_back([&] {
          for (int c; (c = next.fetch_add(1)) < conversations;) {
            std::string history = prompts[static_cast<size_t>(c * o.turns)];
            for (int turn = 0; turn < o.turns; ++turn) {
              const auto i = static_cast<size_t>(c * o.turns + turn);
              const std::string& body =
                  turn == 0 ? bodies[i]
                            : CompletionBody(o, run.model, history, o.output_tokens, true);
              records[i] = StreamOne(*target, o.api_key, body, t0);
              history += records[i].text + "\n" + follow_ups[i] + "\n";
            }
          }
        });
      }
    } else {
      std::mt19937_64 rng(o.seed + li);
      std::exponential_distribution<double> gap(level.rate);
      double at = 0;
      for (int i = 0; i < n; ++i) {
        const auto when = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(at));
        threads.emplace_back([&, i, when] {
          std::this_thread::sleep_until(when);
          records[static_cast<size_t>(i)] =
              StreamOne(*target, o.api_key, bodies[static_cast<size_t>(i)], t0);
        });
        at += gap(rng);
      }
    }
    for (std::thread& t : threads) t.join();
    LlmLevelResult result{SummarizeLlmLevel(records), std::move(records)};
    result.summary.concurrency = level.concurrency;
    result.summary.rate = level.rate;
    if (const auto counters_after = prefix_counters(); counters_before && counters_after) {
      const double queries = counters_after->first - counters_before->first;
      if (queries > 0)
        result.summary.prefix_hit_rate =
            (counters_after->second - counters_before->second) / queries;
    }
    prompt_tokens_sum += result.summary.prompt_tokens;
    prompt_requests += result.summary.ok;
    run.levels.push_back(std::move(result));
  }
  run.mean_prompt_tokens = prompt_requests > 0 ? double(prompt_tokens_sum) / prompt_requests : 0;
  return run;
}

std::string FormatLlmTable(const LlmBenchOptions& o, const LlmBenchRun& run) {
  std::string out = fmt::format(
      "LLM benchmark of {} at {}: prompts of {:.0f} tokens (server's count), {} output tokens{}, "
      "streamed; times in ms (vLLM's TTFT, TPOT, ITL, E2EL)\n",
      run.model, o.url, run.mean_prompt_tokens, o.output_tokens,
      o.ignore_eos ? " (ignore_eos)" : "");
  if (o.shared_prefix_tokens > 0) {
    out += fmt::format("every prompt opens with the same ~{} tokens\n", o.shared_prefix_tokens);
  }
  if (o.turns > 1) {
    out += fmt::format("conversations of {} turns, each resending the history\n", o.turns);
  }
  out += fmt::format(
      "{:>6} {:>6} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10}\n", "conc",
      "rate", "ok/all", "out tok/s", "tot tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
      "ITL p50", "ITL p99", "E2EL p50", "prefix hit");
  for (const LlmLevelResult& l : run.levels) {
    const LlmLevelSummary& s = l.summary;
    out += fmt::format(
        "{:>6} {:>6} {:>7} {:>9.1f} {:>9.1f} {:>8.1f} {:>8.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} "
        "{:>9.1f} {:>10}\n",
        s.concurrency > 0 ? std::to_string(s.concurrency) : std::string("-"),
        s.rate > 0 ? fmt::format("{:g}", s.rate) : std::string("closed"),
        fmt::format("{}/{}", s.ok, s.requests), s.output_tokens_per_second,
        s.total_tokens_per_second, s.ttft.median, s.ttft.p99, s.tpot.median, s.tpot.p99,
        s.itl.median, s.itl.p99, s.e2el.median,
        s.prefix_hit_rate < 0 ? std::string("n/a")
                              : fmt::format("{:.1f}%", 100 * s.prefix_hit_rate));
    for (const std::string& e : s.first_errors) out += fmt::format("       error: {}\n", e);
  }
  return out;
}

Status WriteLlmBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                            const LlmBenchOptions& o, const LlmBenchRun& run) {
  std::string run_json = RunJson(info, [&](JsonWriter& json) {
    json.BeginObject()
        .Field("url", o.url)
        .Field("model", run.model)
        .Field("prompt_tokens_target", int64_t{o.prompt_tokens})
        .Field("shared_prefix_tokens", int64_t{o.shared_prefix_tokens})
        .Field("turns", int64_t{o.turns})
        .Field("prompt_words", int64_t{run.prompt_words})
        .Field("mean_prompt_tokens", run.mean_prompt_tokens)
        .Field("output_tokens", int64_t{o.output_tokens})
        .Field("ignore_eos", o.ignore_eos)
        .Field("seed", static_cast<int64_t>(o.seed))
        .EndObject();
  });
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "run.json", run_json));
  auto dist = [](JsonWriter& json, const char* name, const LlmDistribution& d) {
    json.Key(name)
        .BeginObject()
        .Field("mean_ms", d.mean)
        .Field("median_ms", d.median)
        .Field("p90_ms", d.p90)
        .Field("p99_ms", d.p99)
        .EndObject();
  };
  JsonWriter json;
  json.BeginObject().Key("levels").BeginArray();
  std::string csv =
      "concurrency,rate,requests,ok,duration_s,prompt_tokens,completion_tokens,output_tokens_per_s,"
      "total_tokens_per_s,requests_per_s,ttft_mean_ms,ttft_median_ms,ttft_p99_ms,tpot_mean_ms,"
      "tpot_median_ms,tpot_p99_ms,itl_mean_ms,itl_median_ms,itl_p99_ms,e2el_mean_ms,"
      "e2el_median_ms,e2el_p99_ms\n";
  for (size_t i = 0; i < run.levels.size(); ++i) {
    const LlmLevelSummary& s = run.levels[i].summary;
    json.BeginObject()
        .Field("concurrency", int64_t{s.concurrency})
        .Field("rate", s.rate)
        .Field("requests", int64_t{s.requests})
        .Field("ok", int64_t{s.ok})
        .Field("duration_s", s.duration)
        .Field("prompt_tokens", s.prompt_tokens)
        .Field("completion_tokens", s.completion_tokens)
        .Field("output_tokens_per_second", s.output_tokens_per_second)
        .Field("total_tokens_per_second", s.total_tokens_per_second)
        .Field("requests_per_second", s.requests_per_second);
    dist(json, "ttft", s.ttft);
    dist(json, "tpot", s.tpot);
    dist(json, "itl", s.itl);
    dist(json, "e2el", s.e2el);
    json.Key("prefix_hit_rate");
    if (s.prefix_hit_rate < 0) {
      json.Null();
    } else {
      json.Double(s.prefix_hit_rate);
    }
    json.EndObject();
    csv += fmt::format(
        "{},{},{},{},{:.4f},{},{},{:.3f},{:.3f},{:.4f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},"
        "{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}\n",
        s.concurrency, s.rate, s.requests, s.ok, s.duration, s.prompt_tokens, s.completion_tokens,
        s.output_tokens_per_second, s.total_tokens_per_second, s.requests_per_second, s.ttft.mean,
        s.ttft.median, s.ttft.p99, s.tpot.mean, s.tpot.median, s.tpot.p99, s.itl.mean, s.itl.median,
        s.itl.p99, s.e2el.mean, s.e2el.median, s.e2el.p99);
    std::string requests =
        "request,sent_s,first_token_s,done_s,prompt_tokens,completion_tokens,chunks,ok,error\n";
    for (size_t r = 0; r < run.levels[i].records.size(); ++r) {
      const LlmRequestRecord& rec = run.levels[i].records[r];
      requests +=
          fmt::format("{},{:.6f},{:.6f},{:.6f},{},{},{},{},{}\n", r, rec.sent, rec.first_token,
                      rec.done, rec.prompt_tokens, rec.completion_tokens, rec.chunk_times.size(),
                      rec.ok ? 1 : 0, JsonQuote(rec.error.substr(0, 200)));
    }
    const std::string name = s.concurrency > 0 ? fmt::format("requests-c{}.csv", s.concurrency)
                                               : fmt::format("requests-r{:g}.csv", s.rate);
    SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / name, requests));
  }
  json.EndArray().EndObject();
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.json", json.str()));
  SLUICE_RETURN_IF_ERROR(WriteTextFile(dir / "summary.csv", csv));

  // Plots over the closed-loop levels.
  PlotSeries output{"output tokens/s", {}}, ttft{"TTFT median", {}}, ttft99{"TTFT p99", {}},
      tpot{"TPOT median", {}}, tpot99{"TPOT p99", {}};
  for (const LlmLevelResult& l : run.levels) {
    const LlmLevelSummary& s = l.summary;
    if (s.concurrency == 0) continue;
    output.points.emplace_back(s.concurrency, s.output_tokens_per_second);
    ttft.points.emplace_back(s.concurrency, s.ttft.median);
    ttft99.points.emplace_back(s.concurrency, s.ttft.p99);
    tpot.points.emplace_back(s.concurrency, s.tpot.median);
    tpot99.points.emplace_back(s.concurrency, s.tpot.p99);
  }
  if (!output.points.empty()) {
    const std::string title = fmt::format("{} ({})", run.model, o.url);
    SLUICE_RETURN_IF_ERROR(WriteTextFile(
        dir / "output_tokens.svg",
        RenderLinePlotSvg({title, "concurrent streams", "output tokens/s", true, {output}})));
    SLUICE_RETURN_IF_ERROR(WriteTextFile(
        dir / "ttft.svg",
        RenderLinePlotSvg(
            {title, "concurrent streams", "time to first token (ms)", true, {ttft, ttft99}})));
    SLUICE_RETURN_IF_ERROR(WriteTextFile(
        dir / "tpot.svg",
        RenderLinePlotSvg(
            {title, "concurrent streams", "time per output token (ms)", true, {tpot, tpot99}})));
  }
  return Status::Ok();
}

}  // namespace sluice
