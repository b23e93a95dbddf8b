// The generation loop: requests wait for a KV-cache slot, then every step runs all decoding slots
// as one batch plus a chunk of one waiting prompt (iteration-level, "continuous" batching). A new
// request joins at the next step; a slot is freed on EOS, a stop string, max_tokens, Cancel()
// (a client that disconnected), or an error. No torch here: the model is a StepModel.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "llm/text/chat_template.h"
#include "llm/sampler.h"
#include "llm/step_model.h"
#include "llm/text/tokenizer.h"

namespace sluice::llm {

enum class FinishReason { kNone, kStop, kLength, kError };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "error".

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 0;  // >= 1; the caller applies defaults and context checks (CheckLength()).
  SamplingParams sampling;
  std::vector<std::string> stop;  // Stop strings; the text before one is kept, it is not.
  bool ignore_eos = false;        // Benchmarks: generate max_tokens whatever the model says.
};

// One update on a request, delivered in order on the engine's thread; must not block.
struct GenerationEvent {
  std::string text;           // New text (whole UTF-8 characters); may be empty.
  int completion_tokens = 0;  // Generated so far.
  int prompt_tokens = 0;
  FinishReason finish = FinishReason::kNone;  // Set on the last event of the request.
  Status error;                               // With kError.
};
using EventCallback = std::function<void(const GenerationEvent&)>;

struct LlmStats {
  int slots = 0;
  int slots_busy = 0;
  int waiting = 0;
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  HistogramSnapshot time_to_first_token;  // Seconds, submit to first generated token.
  HistogramSnapshot inter_token;          // Seconds between a sequence's tokens.
};

// Thread-safe. Submit() and Cancel() from any thread; one loop thread runs the model.
class LlmEngine {
 public:
  LlmEngine(std::unique_ptr<StepModel> model, std::unique_ptr<Tokenizer> tokenizer,
            std::unique_ptr<ChatTemplate> chat_template, LlmServeConfig config,
            Clock& clock = Clock::Real());
  ~LlmEngine();  // Stop().
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // kInvalidArgument when prompt + max_tokens cannot fit the context (naming both lengths).
  // Fills a missing max_tokens (0) with the default, capped by the room left.
  Status CheckLength(int prompt_tokens, int& max_tokens) const;

  // Queues `request`. On OK, `on_event` receives every update and exactly one final event;
  // returns an id for Cancel(). kUnavailable when max_waiting requests already wait.
  Result<uint64_t> Submit(GenerationRequest request, EventCallback on_event);

  // Drops the request wherever it is: its slot is freed before the next step, and no event
  // follows but those of a step already under way.
  void Cancel(uint64_t id);

  // Finishes every accepted request (they run to completion), then stops the loop.
  void Stop();

  LlmStats stats() const;
  // Seconds a new request would wait for a slot, from the current load (for Retry-After).
  double EstimatedWaitSeconds() const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate* chat_template() const { return chat_template_.get(); }
  const StepModel& model() const { return *model_; }
  const LlmServeConfig& config() const { return config_; }

 private:
  struct Sequence;
  void Loop();
  // Appends `token` to `seq`; returns the event to deliver (finish set when it is done).
  GenerationEvent Advance(Sequence& seq, int32_t token, Clock::time_point now);

  std::unique_ptr<StepModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  const LlmServeConfig config_;
  Clock& clock_;
  std::vector<int32_t> eos_ids_;

  mutable Mutex mu_;
  CondVar wake_;
  std::deque<std::unique_ptr<Sequence>> waiting_ GUARDED_BY(mu_);
  std::vector<uint64_t> cancelled_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  int busy_slots_ GUARDED_BY(mu_) = 0;
  double step_seconds_ GUARDED_BY(mu_) = 0.05;  // Smoothed duration of a decode step.

  // Loop thread only.
  std::vector<std::unique_ptr<Sequence>> running_;  // Indexed by slot; null when free.

  std::atomic<int64_t> finished_{0}, prompt_tokens_{0}, generated_tokens_{0}, steps_{0};
  Histogram ttft_;
  Histogram inter_token_;
  std::thread loop_;
};

}  // namespace sluice::llm
