// `sluice bench --llm --url ...`: streamed completions against any OpenAI-compatible server, with
// vLLM's serving-benchmark definitions:
//
//   TTFT  = first chunk carrying generated text - request sent.
//   E2EL  = last byte of the stream - request sent.
//   ITL   = the gaps between successive chunks carrying text, pooled over all requests.
//   TPOT  = (E2EL - TTFT) / (output tokens - 1), per request with more than one output token.
//   output tokens/s = sum of usage.completion_tokens / (last response - first request).
//
// Token counts come from the server's own usage chunk (stream_options.include_usage). Prompts are
// built from a fixed seeded word list, distinct per request (no shared prefix to cache) unless
// --shared-prefix-tokens opens every prompt of the run with the same preamble (a system prompt),
// and sized to --prompt-tokens by asking the server how many tokens a probe prompt has. Where the
// server reports prefix-cache counters in /metrics (Sluice's, vLLM's), each level's hit rate is
// the hits over the queries it added. --turns makes each closed-loop stream a conversation whose
// every turn resends the history.
//
// Levels: closed loop at each --concurrency (that many streams always in flight), then open loop
// at each --rate (Poisson arrivals, in flight without limit).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/http_load.h"
#include "bench/results.h"
#include "bench/stats.h"

namespace sluice {

struct LlmBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // Empty: the first of GET /v1/models.
  std::vector<int> concurrency{1, 4, 16};
  std::vector<double> rates;  // Requests/s, open loop; after the closed-loop levels.
  int requests = 0;           // Per level; 0: max(8, 2 x concurrency) (rates: 16).
  int prompt_tokens = 128;
  int shared_prefix_tokens = 0;  // Of prompt_tokens, a preamble common to every request; < it.
  // Closed-loop levels: each stream holds conversations of this many requests, each turn's
  // prompt the previous prompt + its answer + a new message of a quarter of the first prompt's
  // words (a chat whose history a prefix cache can reuse). 1: single requests.
  int turns = 1;
  int output_tokens = 128;
  bool ignore_eos = true;  // Sent as `ignore_eos` (vLLM, llama.cpp, Sluice): fixed output lengths.
  std::string api_key;
  uint64_t seed = 1;
};

// One streamed request as the client saw it. Times are seconds after the level's start.
struct LlmRequestRecord {
  double sent = 0;
  double first_token = -1;  // -1: no text arrived.
  double done = 0;
  std::vector<double> chunk_times;  // Arrival of every chunk carrying text.
  std::string text;                 // The generated text (multi-turn: the next turn's history).
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool ok = false;
  std::string error;  // When !ok: status and body, or the transport error.
};

struct LlmDistribution {  // Milliseconds.
  double mean = 0, median = 0, p90 = 0, p99 = 0;
};

struct LlmLevelSummary {
  int concurrency = 0;  // Closed loop; 0 for a rate level.
  double rate = 0;
  int requests = 0, ok = 0;
  double duration = 0;  // Seconds, first request sent to last response.
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double output_tokens_per_second = 0;
  double total_tokens_per_second = 0;
  double requests_per_second = 0;
  LlmDistribution ttft, tpot, itl, e2el;
  double prefix_hit_rate = -1;  // Prompt tokens found cached / prompt tokens; -1: not reported.
  std::vector<std::string> first_errors;
};

// Incremental server-sent-events reader: Feed() bytes as they arrive; each complete `data:` line
// is returned (without the prefix). Lines may be split anywhere across Feed() calls.
class SseReader {
 public:
  std::vector<std::string> Feed(std::string_view bytes);

 private:
  std::string pending_;
};

// What one `data:` payload of a completion stream carries.
struct StreamChunk {
  bool done = false;  // "[DONE]".
  bool has_text = false;
  std::string text;                                // The choices' text or delta content.
  int prompt_tokens = -1, completion_tokens = -1;  // From a usage object, when present.
  std::string error;                               // An {"error": ...} payload's message.
};
StreamChunk ParseStreamChunk(std::string_view data);

// The level's figures from its records (vLLM's definitions above).
LlmLevelSummary SummarizeLlmLevel(const std::vector<LlmRequestRecord>& records);

// `count` distinct prompts of `words` words each from the fixed word list; same seed, same prompts.
// The first `shared_words` of them are one preamble, the same in every prompt of every seed.
std::vector<std::string> MakeLlmPrompts(int count, int words, uint64_t seed, int shared_words = 0);

// The prefix-cache counters of a Prometheus text: Sluice's sluice_llm_prefix_cache_{queries,hits}
// _total or vLLM's vllm:prefix_cache_{queries,hits}(_total), summed over labels; nullopt when the
// text has neither.
std::optional<std::pair<double, double>> PrefixCacheCounters(std::string_view metrics);

struct LlmLevelResult {
  LlmLevelSummary summary;
  std::vector<LlmRequestRecord> records;
};

struct LlmBenchRun {
  std::string model;
  int prompt_words = 0;
  double mean_prompt_tokens = 0;  // As the server counted them.
  std::vector<LlmLevelResult> levels;
};

Result<LlmBenchRun> RunLlmBench(const LlmBenchOptions& options,
                                const std::function<void(const std::string&)>& progress);

std::string FormatLlmTable(const LlmBenchOptions& options, const LlmBenchRun& run);

// run.json, summary.json, summary.csv, requests-<level>.csv, and SVG plots of output tokens/s,
// TTFT and TPOT against concurrency.
Status WriteLlmBenchResults(const std::filesystem::path& dir, const RunInfo& info,
                            const LlmBenchOptions& options, const LlmBenchRun& run);

}  // namespace sluice
