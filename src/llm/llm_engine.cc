#include "llm/llm_engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace sluice::llm {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

struct LlmEngine::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  EventCallback on_event;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  int slot = -1;
  int prefilled = 0;        // Prompt tokens in the cache.
  int32_t next_token = -1;  // Sampled, not yet in the cache (decoding once >= 0).
  int generated = 0;
  std::string held;  // Decoded text not yet sent: it may be the start of a stop string.
  Clock::time_point submitted, last_token;
  int position() const { return prefilled + std::max(0, generated - 1); }
  bool decoding() const { return next_token >= 0; }
};

LlmEngine::LlmEngine(std::unique_ptr<StepModel> model, std::unique_ptr<Tokenizer> tokenizer,
                     std::unique_ptr<ChatTemplate> chat_template, LlmServeConfig config,
                     Clock& clock)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      config_(config),
      clock_(clock),
      ttft_(Histogram::LatencySecondsBuckets()),
      inter_token_(Histogram::LatencySecondsBuckets()) {
  eos_ids_ = model_->architecture().eos_token_ids;
  const int32_t eos = tokenizer_->TokenId(tokenizer_->eos_token());
  if (eos >= 0 && std::find(eos_ids_.begin(), eos_ids_.end(), eos) == eos_ids_.end()) {
    eos_ids_.push_back(eos);
  }
  running_.resize(static_cast<size_t>(model_->slots()));
  loop_ = std::thread([this] { Loop(); });
}

LlmEngine::~LlmEngine() { Stop(); }

void LlmEngine::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (loop_.joinable()) loop_.join();
}

Status LlmEngine::CheckLength(int prompt_tokens, int& max_tokens) const {
  const int context = model_->context_length();
  if (prompt_tokens < 1) return Status::InvalidArgument("the prompt is empty");
  if (prompt_tokens >= context) {
    return Status::InvalidArgument(fmt::format(
        "This model's maximum context length is {} tokens; the prompt has {} tokens, which "
        "leaves no room to generate",
        context, prompt_tokens));
  }
  if (max_tokens <= 0) {
    max_tokens = std::min(config_.default_max_tokens, context - prompt_tokens);
  } else if (prompt_tokens + max_tokens > context) {
    return Status::InvalidArgument(fmt::format(
        "This model's maximum context length is {} tokens; you requested {} tokens ({} in the "
        "prompt, {} for the completion)",
        context, prompt_tokens + max_tokens, prompt_tokens, max_tokens));
  }
  return Status::Ok();
}

Result<uint64_t> LlmEngine::Submit(GenerationRequest request, EventCallback on_event) {
  int max_tokens = request.max_tokens;
  SLUICE_RETURN_IF_ERROR(CheckLength(static_cast<int>(request.prompt.size()), max_tokens));
  request.max_tokens = max_tokens;
  auto seq = std::make_unique<Sequence>();
  seq->sampler = std::make_unique<Sampler>(request.sampling, request.prompt);
  seq->decoder = std::make_unique<StreamDecoder>(*tokenizer_, /*skip_special=*/true);
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);
  seq->submitted = clock_.Now();
  uint64_t id = 0;
  {
    MutexLock lock(mu_);
    if (stopping_) return Status::Unavailable("the server is shutting down");
    const int free_slots = model_->slots() - busy_slots_;
    if (static_cast<int>(waiting_.size()) - free_slots >= config_.max_waiting) {
      return Status::Unavailable(fmt::format("all {} slots are busy and {} requests wait",
                                             model_->slots(), waiting_.size()));
    }
    id = seq->id = next_id_++;
    waiting_.push_back(std::move(seq));
  }
  wake_.Signal();
  return id;
}

void LlmEngine::Cancel(uint64_t id) {
  MutexLock lock(mu_);
  cancelled_.push_back(id);
}

LlmStats LlmEngine::stats() const {
  LlmStats s;
  {
    MutexLock lock(mu_);
    s.slots_busy = busy_slots_;
    s.waiting = static_cast<int>(waiting_.size());
  }
  s.slots = model_->slots();
  s.requests_finished = finished_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generated_tokens = generated_tokens_.load();
  s.steps = steps_.load();
  s.time_to_first_token = ttft_.Snapshot();
  s.inter_token = inter_token_.Snapshot();
  return s;
}

double LlmEngine::EstimatedWaitSeconds() const {
  MutexLock lock(mu_);
  // A slot frees, on average, every (tokens per request x step time) / slots.
  const double per_request = step_seconds_ * config_.default_max_tokens;
  const double waves = std::ceil(static_cast<double>(waiting_.size() + 1) / model_->slots());
  return std::max(1.0, waves * per_request);
}

GenerationEvent LlmEngine::Advance(Sequence& seq, int32_t token, Clock::time_point now) {
  GenerationEvent event;
  event.prompt_tokens = static_cast<int>(seq.request.prompt.size());
  if (seq.generated == 0) {
    ttft_.Observe(SecondsBetween(seq.submitted, now));
  } else {
    inter_token_.Observe(SecondsBetween(seq.last_token, now));
  }
  seq.last_token = now;
  ++seq.generated;
  generated_tokens_.fetch_add(1);
  seq.next_token = token;
  event.completion_tokens = seq.generated;
  const bool eos = !seq.request.ignore_eos &&
                   std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  if (eos) {
    event.text = std::move(seq.held) + seq.decoder->Flush();
    event.finish = FinishReason::kStop;
    return event;
  }
  seq.held += seq.decoder->Push(token);
  // The earliest stop string ends the text before it.
  size_t stop_at = std::string::npos;
  for (const std::string& stop : seq.request.stop) {
    if (!stop.empty()) stop_at = std::min(stop_at, seq.held.find(stop));
  }
  if (stop_at != std::string::npos) {
    event.text = seq.held.substr(0, stop_at);
    seq.held.clear();
    event.finish = FinishReason::kStop;
    return event;
  }
  if (seq.generated >= seq.request.max_tokens || seq.position() >= model_->context_length()) {
    event.text = std::move(seq.held) + seq.decoder->Flush();
    seq.held.clear();
    event.finish = FinishReason::kLength;
    return event;
  }
  // Hold back the longest tail that could begin a stop string.
  size_t hold = 0;
  for (const std::string& stop : seq.request.stop) {
    for (size_t n = std::min(stop.size() - 1, seq.held.size()); n > hold; --n) {
      if (seq.held.compare(seq.held.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  event.text = seq.held.substr(0, seq.held.size() - hold);
  seq.held.erase(0, seq.held.size() - hold);
  return event;
}

void LlmEngine::Loop() {
  const int vocab = model_->architecture().vocab_size;
  std::vector<SequenceChunk> chunks;
  std::vector<Sequence*> owners;
  std::vector<float> logits;
  std::vector<std::pair<Sequence*, GenerationEvent>> events;
  for (;;) {
    std::vector<uint64_t> cancelled;
    const bool any_running =
        std::any_of(running_.begin(), running_.end(), [](const auto& s) { return s != nullptr; });
    {
      MutexLock lock(mu_);
      while (!stopping_ && waiting_.empty() && !any_running && cancelled_.empty()) {
        wake_.Wait(lock);
      }
      if (stopping_ && waiting_.empty() && !any_running) return;
      cancelled.swap(cancelled_);
      std::erase_if(waiting_, [&](const auto& seq) {
        return std::find(cancelled.begin(), cancelled.end(), seq->id) != cancelled.end();
      });
      for (auto& slot_seq : running_) {
        if (slot_seq &&
            std::find(cancelled.begin(), cancelled.end(), slot_seq->id) != cancelled.end()) {
          slot_seq.reset();
          --busy_slots_;
        }
      }
      // Free slots, lowest first, to the oldest waiting requests: decoding slots stay a dense
      // range, which the batched attention reads without copying.
      for (size_t slot = 0; slot < running_.size() && !waiting_.empty(); ++slot) {
        if (running_[slot]) continue;
        running_[slot] = std::move(waiting_.front());
        waiting_.pop_front();
        running_[slot]->slot = static_cast<int>(slot);
        ++busy_slots_;
      }
    }

    chunks.clear();
    owners.clear();
    for (auto& seq : running_) {
      if (seq && seq->decoding()) {
        chunks.push_back(SequenceChunk{seq->slot, seq->position(), {seq->next_token}, false});
        owners.push_back(seq.get());
      }
    }
    // One prompt chunk per step, oldest first, so decoding slots keep going while it prefills.
    int budget = config_.prefill_chunk;
    std::vector<Sequence*> prefilling;
    for (auto& seq : running_) {
      if (seq && !seq->decoding()) prefilling.push_back(seq.get());
    }
    std::sort(prefilling.begin(), prefilling.end(),
              [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
    for (Sequence* seq : prefilling) {
      if (budget <= 0) break;
      const int remaining = static_cast<int>(seq->request.prompt.size()) - seq->prefilled;
      const int n = std::min(budget, remaining);
      SequenceChunk chunk{seq->slot, seq->prefilled, {}, false};
      chunk.tokens.assign(seq->request.prompt.begin() + seq->prefilled,
                          seq->request.prompt.begin() + seq->prefilled + n);
      chunks.push_back(std::move(chunk));
      owners.push_back(seq);
      budget -= n;
    }
    if (chunks.empty()) continue;

    logits.clear();
    const Clock::time_point start = clock_.Now();
    const Status status = model_->Run(chunks, &logits);
    const Clock::time_point now = clock_.Now();
    steps_.fetch_add(1);
    events.clear();
    if (!status.ok()) {
      spdlog::error("language model step failed: {}", status.message());
      for (Sequence* seq : owners) {
        GenerationEvent event;
        event.finish = FinishReason::kError;
        event.error = status;
        event.prompt_tokens = static_cast<int>(seq->request.prompt.size());
        event.completion_tokens = seq->generated;
        events.emplace_back(seq, std::move(event));
      }
    } else {
      {
        MutexLock lock(mu_);
        step_seconds_ = 0.9 * step_seconds_ + 0.1 * SecondsBetween(start, now);
      }
      for (size_t i = 0; i < chunks.size(); ++i) {
        Sequence* seq = owners[i];
        if (!seq->decoding()) {
          seq->prefilled += static_cast<int>(chunks[i].tokens.size());
          if (seq->prefilled < static_cast<int>(seq->request.prompt.size())) continue;
          prompt_tokens_.fetch_add(seq->prefilled);
        }
        const int32_t token =
            seq->sampler->Next(logits.data() + i * static_cast<size_t>(vocab), vocab);
        events.emplace_back(seq, Advance(*seq, token, now));
      }
    }
    // A finished request's slot is free (and counted) before its last event goes out.
    for (auto& [seq, event] : events) {
      if (event.finish == FinishReason::kNone) {
        seq->on_event(event);
        continue;
      }
      std::unique_ptr<Sequence> done = std::move(running_[static_cast<size_t>(seq->slot)]);
      finished_.fetch_add(1);
      {
        MutexLock lock(mu_);
        --busy_slots_;
      }
      done->on_event(event);
    }
  }
}

}  // namespace sluice::llm
