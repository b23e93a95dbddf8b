#include "llm/llm_engine.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/system_info.h"

namespace sluice::llm {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kError:
      return "error";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kNone:
      break;
  }
  return "";
}

// What the loop keeps of a request beside the scheduler's part: its sampler and its events.
struct LlmEngine::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  EventCallback on_event;
  std::unique_ptr<Sampler> sampler;
  Clock::time_point submitted, last_token;
  std::deque<TokenLogprobs> logprobs;       // Of sampled tokens, for their events.
  std::unique_ptr<GrammarMatcher> matcher;  // With a response format.
  bool grammar_failed = false;              // A sampled token the grammar refused.
  std::vector<float> pooled;                // An embedding model's, as the prompt runs.
};

namespace {

// config.yaml's settings with what it leaves to the model filled in.
LlmServeConfig WithModelDefaults(LlmServeConfig config, const StepModel& model) {
  if (config.max_step_tokens <= 0) config.max_step_tokens = model.default_step_tokens();
  return config;
}

SchedulerOptions OptionsFor(const StepModel& model, const Tokenizer& tokenizer,
                            const LlmServeConfig& config) {
  SchedulerOptions options;
  options.eos_ids = model.architecture().eos_token_ids;
  auto add = [&](int32_t id) {
    if (id >= 0 &&
        std::find(options.eos_ids.begin(), options.eos_ids.end(), id) == options.eos_ids.end()) {
      options.eos_ids.push_back(id);
    }
  };
  add(tokenizer.TokenId(tokenizer.eos_token()));
  // A harmony vocabulary (gpt-oss's): a reply ends at <|return|> (its answer) or <|call|> (a
  // tool call), never at <|end|>, which ends its reasoning's message (as llama.cpp and vLLM
  // treat these files; the GGUF converter names <|return|> alone).
  const int32_t call = tokenizer.TokenId("<|call|>"), ret = tokenizer.TokenId("<|return|>");
  if (call >= 0 && ret >= 0 && tokenizer.TokenId("<|channel|>") >= 0) {
    add(call);
    add(ret);
    std::erase(options.eos_ids, tokenizer.TokenId("<|end|>"));
  }
  options.slots = model.slots();
  options.context_length = model.context_length();
  options.block_size = model.kv_block_size();
  options.blocks = model.kv_blocks();
  options.max_step_tokens = config.max_step_tokens;  // Resolved (WithModelDefaults).
  options.prefill_chunk = config.prefill_chunk;
  options.speculative_tokens = config.speculative_tokens;
  options.speculative_ngram = config.speculative_ngram;
  // An embedding's mean or first-token pooling needs every prompt token run: no cached prefix.
  options.prefix_caching = config.prefix_caching && config.pooling == Pooling::kNone;
  options.all_prompt_rows = config.pooling != Pooling::kNone;
  options.whole_prompts = model.whole_sequences();
  return options;
}

}  // namespace

LlmEngine::LlmEngine(std::unique_ptr<StepModel> model, std::unique_ptr<Tokenizer> tokenizer,
                     std::unique_ptr<ChatTemplate> chat_template, LlmServeConfig config,
                     Clock& clock)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      config_(WithModelDefaults(std::move(config), *model_)),
      clock_(clock),
      scheduler_(OptionsFor(*model_, *tokenizer_, config_)),
      grammars_(std::make_unique<GrammarCompiler>(*tokenizer_, model_->architecture().vocab_size,
                                                  scheduler_.options().eos_ids)),
      ttft_(Histogram::LatencySecondsBuckets()),
      inter_token_(Histogram::LatencySecondsBuckets()) {
  loop_ = std::thread([this] {
    NameThisThread("sluice-llm");
    Loop();
  });
}

LlmEngine::~LlmEngine() { Stop(); }

LlmEngine::TrimOnDestruction::~TrimOnDestruction() { malloc_trim(0); }

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
  if (config_.pooling != Pooling::kNone) {  // The input alone runs: it may fill the context.
    if (prompt_tokens > context) {
      return Status::InvalidArgument(
          fmt::format("This model's maximum context length is {} tokens; the input has {} tokens",
                      context, prompt_tokens));
    }
    max_tokens = 1;
    return Status::Ok();
  }
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

Result<std::unique_ptr<LlmEngine::Sequence>> LlmEngine::Prepare(GenerationRequest request,
                                                                EventCallback on_event) {
  if (config_.pooling != Pooling::kNone) {
    // The prompt alone runs; the one "generated" token only ends the sequence.
    request.max_tokens = 1;
    request.ignore_eos = true;
    request.grammar = nullptr;
    request.top_logprobs = -1;
    request.shares_prompt_of = 0;
  }
  int max_tokens = request.max_tokens;
  SLUICE_RETURN_IF_ERROR(CheckLength(static_cast<int>(request.prompt.size()), max_tokens));
  request.max_tokens = max_tokens;
  if (request.grammar != nullptr && request.ignore_eos) {
    return Status::InvalidArgument("a response format cannot be combined with ignore_eos");
  }
  auto seq = std::make_unique<Sequence>();
  if (request.grammar != nullptr) seq->matcher = std::make_unique<GrammarMatcher>(request.grammar);
  seq->sampler = std::make_unique<Sampler>(request.sampling, request.prompt);
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);
  seq->submitted = clock_.Now();
  return seq;
}

Result<uint64_t> LlmEngine::Submit(GenerationRequest request, EventCallback on_event) {
  std::vector<GenerationRequest> requests;
  requests.push_back(std::move(request));
  std::vector<EventCallback> callbacks;
  callbacks.push_back(std::move(on_event));
  auto ids = SubmitAll(std::move(requests), std::move(callbacks));
  if (!ids.ok()) return ids.status();
  return ids->front();
}

Result<std::vector<uint64_t>> LlmEngine::SubmitAll(std::vector<GenerationRequest> requests,
                                                   std::vector<EventCallback> callbacks) {
  std::vector<std::unique_ptr<Sequence>> prepared;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto seq = Prepare(std::move(requests[i]), std::move(callbacks[i]));
    if (!seq.ok()) return seq.status();
    prepared.push_back(std::move(*seq));
  }
  std::vector<uint64_t> ids;
  {
    MutexLock lock(mu_);
    if (stopping_) return Status::Unavailable("the server is shutting down");
    const int free_slots = model_->slots() - busy_slots_;
    const int waiting = static_cast<int>(incoming_.size()) + scheduled_waiting_;
    const int adding = static_cast<int>(prepared.size());
    if (waiting + adding - 1 - free_slots >= config_.max_waiting) {
      return Status::Unavailable(
          fmt::format("all {} slots are busy and {} requests wait", model_->slots(), waiting));
    }
    for (auto& seq : prepared) {
      ids.push_back(seq->id = next_id_++);
      incoming_.push_back(std::move(seq));
    }
  }
  wake_.Signal();
  return ids;
}

void LlmEngine::Cancel(uint64_t id) {
  MutexLock lock(mu_);
  cancelled_.emplace_back(id, false);
}

void LlmEngine::EndEarly(uint64_t id) {
  MutexLock lock(mu_);
  cancelled_.emplace_back(id, true);
}

LlmStats LlmEngine::stats() const {
  LlmStats s;
  {
    MutexLock lock(mu_);
    s.slots_busy = busy_slots_;
    s.waiting = static_cast<int>(incoming_.size()) + scheduled_waiting_;
    s.running_adapters = running_adapters_;
    s.waiting_adapters = waiting_adapters_;
  }
  s.slots = model_->slots();
  s.max_loras = config_.max_loras;
  s.requests_finished = finished_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generated_tokens = generated_tokens_.load();
  s.steps = steps_.load();
  s.draft_tokens = draft_tokens_.load();
  s.accepted_draft_tokens = accepted_draft_tokens_.load();
  s.prefix_cache_queries = prefix_queries_.load();
  s.prefix_cache_hits = prefix_hits_.load();
  s.kv_blocks = model_->kv_blocks();
  s.kv_blocks_used = kv_blocks_used_.load();
  s.time_to_first_token = ttft_.Snapshot();
  s.inter_token = inter_token_.Snapshot();
  return s;
}

double LlmEngine::EstimatedWaitSeconds() const {
  MutexLock lock(mu_);
  // A slot frees, on average, every (tokens per request x step time) / slots.
  const double per_request = step_seconds_ * config_.default_max_tokens;
  const double waiting = static_cast<double>(incoming_.size() + scheduled_waiting_);
  const double waves = std::ceil((waiting + 1) / model_->slots());
  return std::max(1.0, waves * per_request);
}

GenerationEvent LlmEngine::Advance(Sequence& seq, const TokenUpdate& update,
                                   Clock::time_point now) {
  GenerationEvent event;
  event.prompt_tokens = static_cast<int>(seq.request.prompt.size());
  if (update.generated == 1) {
    ttft_.Observe(SecondsBetween(seq.submitted, now));
    prompt_tokens_.fetch_add(event.prompt_tokens);
  } else {
    inter_token_.Observe(SecondsBetween(seq.last_token, now));
  }
  seq.last_token = now;
  if (config_.pooling != Pooling::kNone) {
    event.finish = FinishReason::kLength;
    event.embedding = std::move(seq.pooled);
    return event;
  }
  generated_tokens_.fetch_add(1);
  event.completion_tokens = update.generated;
  event.cached_prompt_tokens = update.cached_prompt_tokens;
  if (!seq.logprobs.empty()) {
    event.logprobs = std::move(seq.logprobs.front());
    seq.logprobs.pop_front();
  }
  event.token = update.token;
  if (update.eos) {
    event.finish = FinishReason::kStop;
  } else if (update.length) {
    event.finish = FinishReason::kLength;
  }
  return event;
}

void LlmEngine::GroupByAdapter(StepPlan& plan) const {
  const size_t n = plan.chunks.size();
  std::vector<const LoraAdapter*> adapters(n);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    adapters[i] = sequences_.at(plan.ids[i])->request.adapter.get();
    plan.chunks[i].lora = adapters[i];
    any = any || adapters[i] != nullptr;
  }
  if (!any) return;
  // Each adapter's chunks side by side (the base's first): its rows are one range of the step.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const uint64_t a = adapters[x] != nullptr ? adapters[x]->id : 0;
    const uint64_t b = adapters[y] != nullptr ? adapters[y]->id : 0;
    return a < b;
  });
  StepPlan sorted;
  for (const size_t i : order) {
    sorted.chunks.push_back(std::move(plan.chunks[i]));
    sorted.ids.push_back(plan.ids[i]);
    sorted.rows.push_back(plan.rows[i]);
    sorted.samples.push_back(plan.samples[i]);
  }
  plan.chunks = std::move(sorted.chunks);
  plan.ids = std::move(sorted.ids);
  plan.rows = std::move(sorted.rows);
  plan.samples = std::move(sorted.samples);
}

void LlmEngine::SetKvEvents(std::shared_ptr<KvEventPublisher> publisher, std::string topic) {
  MutexLock lock(mu_);
  kv_events_ = std::move(publisher);
  kv_topic_ = std::move(topic);
  if (kv_events_ == nullptr) return;
  kv_events_->Publish(ClearedKvEventBatch(kv_topic_, model_->kv_block_size()));
}

void LlmEngine::SetKvDisk(std::shared_ptr<KvDiskStore> store) {
  MutexLock lock(mu_);
  kv_disk_ = std::move(store);
}

void LlmEngine::WriteThrough() {
  if (disk_in_use_ == nullptr) return;
  std::string data;
  for (StoredBlock& block : scheduler_.TakeStoredBlocks()) {
    // An adapter's blocks stay in memory: their hashes hold for this process only.
    if (block.adapter != 0 || disk_in_use_->Contains(block.hash)) continue;
    // Read now: the block is intact until the next step's plan hands it out again.
    if (Status read = model_->ReadKvBlock(block.id, &data); !read.ok()) {
      spdlog::warn("kv_cache_disk: {}", read.message());
      continue;
    }
    disk_in_use_->Put(block.hash, block.parent, std::move(block.tokens), std::move(data));
    data = std::string();
  }
}

void LlmEngine::PublishKvEvents() {
  std::vector<KvEvent> events = scheduler_.TakeKvEvents();
  if (events.empty()) return;
  MutexLock lock(mu_);
  if (kv_events_ == nullptr) return;
  KvEventBatch batch = NewKvEventBatch(kv_topic_, model_->kv_block_size());
  for (const KvEvent& event : events) {
    if (event.adapter == 0 || batch.adapter_names.count(event.adapter) != 0) continue;
    for (const auto& [name, adapter] : adapters_) {
      if (adapter->id == event.adapter) batch.adapter_names.emplace(adapter->id, name);
    }
  }
  batch.events = std::move(events);
  kv_events_->Publish(std::move(batch));
}

void LlmEngine::PublishCounts() {
  prefix_queries_.store(scheduler_.prefix_queries());
  prefix_hits_.store(scheduler_.prefix_hits());
  kv_blocks_used_.store(scheduler_.kv_blocks_used());
  std::vector<std::string> running, waiting;
  if (config_.max_loras > 0) {
    auto add = [](std::vector<std::string>& names, const std::string& name) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    };
    for (const auto& [id, seq] : sequences_) {
      if (seq->request.adapter == nullptr) continue;
      add(scheduler_.admitted(id) ? running : waiting, seq->request.adapter->name);
    }
  }
  MutexLock lock(mu_);
  busy_slots_ = scheduler_.running();
  scheduled_waiting_ = scheduler_.waiting();
  if (config_.max_loras > 0) {
    for (const auto& seq : incoming_) {
      if (seq->request.adapter == nullptr) continue;
      if (std::find(waiting.begin(), waiting.end(), seq->request.adapter->name) == waiting.end()) {
        waiting.push_back(seq->request.adapter->name);
      }
    }
    running_adapters_ = std::move(running);
    waiting_adapters_ = std::move(waiting);
  }
}

Status LlmEngine::LoadAdapter(const std::string& name, const std::string& dir) {
  if (config_.max_loras <= 0) {
    return Status::InvalidArgument(
        "this model serves no LoRA adapters (config.yaml's llm.lora sets max_loras)");
  }
  if (config_.pooling != Pooling::kNone) {
    return Status::InvalidArgument("LoRA adapters are not served on embedding models");
  }
  SLUICE_RETURN_IF_ERROR(model_->CanApplyLora());
  {
    MutexLock lock(mu_);
    if (adapters_.count(name) > 0) {
      return Status::InvalidArgument(fmt::format("an adapter named '{}' is loaded", name));
    }
    if (static_cast<int>(adapters_.size()) >= config_.max_loras) {
      return Status::InvalidArgument(
          fmt::format("{} adapters are loaded, max_loras; unload one first", adapters_.size()));
    }
  }
  auto adapter = LoadLoraAdapter(name, dir, model_->architecture(), config_.max_lora_rank);
  if (!adapter.ok()) return adapter.status();
  MutexLock lock(mu_);
  if (adapters_.count(name) > 0 || static_cast<int>(adapters_.size()) >= config_.max_loras) {
    return Status::InvalidArgument(
        fmt::format("adapter '{}' was loaded meanwhile, or the table "
                    "filled",
                    name));
  }
  adapters_.emplace(name, std::move(*adapter));
  return Status::Ok();
}

Status LlmEngine::UnloadAdapter(const std::string& name) {
  MutexLock lock(mu_);
  if (adapters_.erase(name) == 0) {
    return Status::NotFound(fmt::format("no LoRA adapter named '{}' is loaded", name));
  }
  return Status::Ok();
}

std::shared_ptr<const LoraAdapter> LlmEngine::FindAdapter(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = adapters_.find(name);
  return it == adapters_.end() ? nullptr : it->second;
}

std::vector<std::string> LlmEngine::AdapterNames() const {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, adapter] : adapters_) names.push_back(name);
  return names;
}

void LlmEngine::PoolStep(const StepPlan& plan, std::vector<std::vector<int32_t>>* tokens) {
  const auto hidden = static_cast<size_t>(model_->row_width());
  tokens->assign(plan.chunks.size(), {});
  size_t row = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Sequence& seq = *sequences_.at(plan.ids[i]);
    const auto rows = static_cast<size_t>(plan.rows[i]);
    const float* first = logits_.data() + row * hidden;
    row += rows;
    std::vector<float>& pooled = seq.pooled;
    pooled.resize(hidden, 0.0f);
    switch (config_.pooling) {
      case Pooling::kMean:
        for (size_t r = 0; r < rows; ++r) {
          for (size_t c = 0; c < hidden; ++c) pooled[c] += first[r * hidden + c];
        }
        break;
      case Pooling::kLast:
        if (plan.samples[i]) pooled.assign(first + (rows - 1) * hidden, first + rows * hidden);
        break;
      case Pooling::kCls:
        if (plan.chunks[i].start == 0) pooled.assign(first, first + hidden);
        break;
      case Pooling::kNone:
        break;
    }
    if (!plan.samples[i]) continue;  // More of the prompt to come.
    if (config_.pooling == Pooling::kMean) {
      const auto n = static_cast<float>(seq.request.prompt.size());
      for (float& v : pooled) v /= n;
    }
    if (config_.normalize) {
      double norm = 0;
      for (const float v : pooled) norm += static_cast<double>(v) * v;
      norm = std::sqrt(norm);
      if (norm > 0) {
        for (float& v : pooled) v = static_cast<float>(v / norm);
      }
    }
    (*tokens)[i].push_back(0);  // Ends the sequence (max_tokens 1).
  }
}

void LlmEngine::MarkPicks(StepPlan& plan) {
  const int vocab = model_->architecture().vocab_size;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    TokenPick& pick = plan.chunks[i].pick;
    pick = TokenPick{};
    if (!plan.samples[i]) {
      pick.kind = TokenPick::kGreedy;  // Nobody reads its token.
      continue;
    }
    const Sequence& seq = *sequences_.at(plan.ids[i]);
    const SamplingParams& s = seq.request.sampling;
    const bool greedy = s.temperature <= 0.0 || s.top_k == 1;  // Next's first largest.
    const bool penalties =
        s.repetition_penalty != 1.0 || s.frequency_penalty != 0.0 || s.presence_penalty != 0.0;
    // A draft's row takes a draw, the counts or the grammar's state of the rows before it (and
    // reports its log-probabilities) only once they are kept: drafts that sample, are
    // penalised, follow a grammar or report log-probabilities stay on the host.
    if (plan.rows[i] > 1 &&
        (!greedy || penalties || seq.matcher != nullptr || seq.request.top_logprobs >= 0)) {
      continue;
    }
    pick.logprobs = seq.request.top_logprobs;
    if (seq.matcher != nullptr) seq.matcher->Allowed(vocab, &pick.allowed);
    if (penalties) {
      pick.repetition = static_cast<float>(s.repetition_penalty);
      seq.sampler->PenaltyEdits(&pick.repeated, &pick.counted, &pick.amounts);
    }
    if (greedy) {
      pick.kind = TokenPick::kGreedy;
    } else {
      pick.kind = TokenPick::kSample;
      pick.temperature = s.temperature;
      pick.top_k = s.top_k;
      pick.top_p = s.top_p;
      pick.draw = seq.sampler->Draw();
    }
  }
}

Status LlmEngine::RunStep(const StepPlan& plan, std::vector<std::vector<int32_t>>* tokens) {
  logits_.clear();
  picked_.clear();
  picked_logprobs_.clear();
  const Clock::time_point start = clock_.Now();
  // Blocks from the disk tier first: a copy this step may read one.
  for (const auto& [block, data] : plan.loads) {
    SLUICE_RETURN_IF_ERROR(model_->WriteKvBlock(block, *data));
  }
  if (!plan.copies.empty()) SLUICE_RETURN_IF_ERROR(model_->CopyBlocks(plan.copies));
  SLUICE_RETURN_IF_ERROR(model_->RunPicking(plan.chunks, &logits_, &picked_, &picked_logprobs_));
  {
    MutexLock lock(mu_);
    step_seconds_ = 0.9 * step_seconds_ + 0.1 * SecondsBetween(start, clock_.Now());
  }
  if (config_.pooling != Pooling::kNone) {
    PoolStep(plan, tokens);
    return Status::Ok();
  }
  const int vocab = model_->architecture().vocab_size;
  tokens->assign(plan.chunks.size(), {});
  const bool picks = model_->picks_tokens();
  // Logits rows, picked tokens and their log-probabilities taken so far.
  size_t row = 0, pick = 0, scored = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const std::vector<int32_t>& input = plan.chunks[i].tokens;
    const auto rows = static_cast<size_t>(plan.rows[i]);
    // The model picked this chunk's tokens itself (StepModel::RunPicking): no logits for it.
    const bool picked = picks && plan.chunks[i].pick.kind != TokenPick::kHost;
    if (picked && pick + rows > picked_.size()) {
      return Status::Internal(
          fmt::format("the model picked {} tokens; the step needs more", picked_.size()));
    }
    if (plan.samples[i]) {
      Sequence& seq = *sequences_.at(plan.ids[i]);
      const int top_logprobs = seq.request.top_logprobs;
      // Row j follows input[j]: its token is what plain decoding would have sampled there, so a
      // draft (input[j + 1]) is kept while it equals it, and the first that differs is replaced.
      for (size_t j = 0; j < rows; ++j) {
        int32_t token = 0;
        if (picked) {
          token = picked_[pick + j];
          seq.sampler->Record(token);  // The counts its later penalties read.
          if (seq.matcher != nullptr && !seq.matcher->Accept(token)) seq.grammar_failed = true;
          if (top_logprobs >= 0) {
            if (scored >= picked_logprobs_.size()) {
              return Status::Internal("the model scored fewer picked tokens than asked");
            }
            seq.logprobs.push_back(std::move(picked_logprobs_[scored++]));
          }
        } else {
          float* logits = logits_.data() + (row + j) * vocab;
          // The sampler rewrites the row (penalties, temperature): log-probabilities need it raw.
          if (top_logprobs >= 0) raw_row_.assign(logits, logits + vocab);
          // Drafts need no rollback: the matcher follows each sampled token, and a row is only
          // sampled while the tokens before it were the ones sampled.
          if (seq.matcher != nullptr) seq.matcher->Mask(logits, vocab);
          token = seq.sampler->Next(logits, vocab);
          if (seq.matcher != nullptr && !seq.matcher->Accept(token)) seq.grammar_failed = true;
          if (top_logprobs >= 0) {
            seq.logprobs.push_back(LogProbabilities(raw_row_.data(), vocab, token, top_logprobs));
          }
        }
        (*tokens)[i].push_back(token);
        if (j + 1 >= input.size() || token != input[j + 1]) break;
      }
      if (plan.rows[i] > 1) {
        draft_tokens_.fetch_add(plan.rows[i] - 1);
        accepted_draft_tokens_.fetch_add(static_cast<int64_t>((*tokens)[i].size()) - 1);
      }
    }
    (picked ? pick : row) += rows;
  }
  return Status::Ok();
}

void LlmEngine::Loop() {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::pair<std::unique_ptr<Sequence>, GenerationEvent>> finished;
  std::vector<std::pair<Sequence*, GenerationEvent>> events;
  for (;;) {
    std::vector<std::pair<uint64_t, bool>> cancelled;
    std::deque<std::unique_ptr<Sequence>> arrived;
    bool record_kv_events = false;
    std::shared_ptr<KvDiskStore> disk;
    {
      MutexLock lock(mu_);
      while (!stopping_ && incoming_.empty() && sequences_.empty() && cancelled_.empty()) {
        wake_.Wait(lock);
      }
      if (stopping_ && incoming_.empty() && sequences_.empty()) return;
      cancelled.swap(cancelled_);
      arrived.swap(incoming_);
      record_kv_events = kv_events_ != nullptr;
      disk = kv_disk_;
    }
    scheduler_.RecordKvEvents(record_kv_events);
    if (disk != disk_in_use_) {
      disk_in_use_ = disk;
      scheduler_.SetDiskTier(disk == nullptr ? Scheduler::DiskLookup()
                                             : [disk](uint64_t hash) { return disk->Get(hash); });
    }
    for (auto& seq : arrived) {
      // Cached blocks are shared by requests of the same adapter whose prompts the model computes
      // alike (LongRoPE's factors by the prompt's length).
      const uint64_t adapter = seq->request.adapter != nullptr ? seq->request.adapter->id : 0;
      const uint64_t salt =
          adapter ^
          (model_->CacheSalt(static_cast<int>(seq->request.prompt.size())) * 0x9e3779b97f4a7c15ull);
      scheduler_.Add(ScheduledRequest{seq->id, seq->request.prompt, seq->request.max_tokens,
                                      seq->request.ignore_eos, seq->request.shares_prompt_of, salt,
                                      adapter});
      sequences_.emplace(seq->id, std::move(seq));
    }
    int64_t ended = 0;
    for (const auto& [id, finished] : cancelled) {
      if (scheduler_.Remove(id) && sequences_.erase(id) > 0 && finished) ++ended;
    }
    finished_.fetch_add(ended);
    StepPlan plan = scheduler_.Schedule();
    PublishCounts();
    if (plan.empty()) continue;
    if (config_.max_loras > 0) GroupByAdapter(plan);
    if (model_->picks_tokens() && config_.pooling == Pooling::kNone) MarkPicks(plan);

    const Status status = RunStep(plan, &tokens);
    const Clock::time_point now = clock_.Now();
    steps_.fetch_add(1);
    events.clear();
    finished.clear();
    if (!status.ok()) {
      spdlog::error("language model step failed: {}", status.message());
      for (const uint64_t id : plan.ids) {
        auto it = sequences_.find(id);
        if (it == sequences_.end()) continue;
        GenerationEvent event;
        event.finish = FinishReason::kError;
        event.error = status;
        event.prompt_tokens = static_cast<int>(it->second->request.prompt.size());
        scheduler_.Remove(id);
        finished.emplace_back(std::move(it->second), std::move(event));
        sequences_.erase(it);
      }
    } else {
      for (const TokenUpdate& update : scheduler_.Update(plan, tokens)) {
        auto it = sequences_.find(update.id);
        if (it == sequences_.end()) continue;
        if (it->second->grammar_failed) {
          GenerationEvent event;
          event.finish = FinishReason::kError;
          event.error = Status::Internal("the response format's grammar allowed no token");
          event.prompt_tokens = static_cast<int>(it->second->request.prompt.size());
          if (!update.eos && !update.length) scheduler_.Remove(update.id);
          finished.emplace_back(std::move(it->second), std::move(event));
          sequences_.erase(it);
          continue;
        }
        GenerationEvent event = Advance(*it->second, update, now);
        if (event.finish == FinishReason::kNone) {
          events.emplace_back(it->second.get(), std::move(event));
          continue;
        }
        finished.emplace_back(std::move(it->second), std::move(event));
        sequences_.erase(it);
      }
    }
    // A finished request's slot is free (and counted) before its last event goes out.
    PublishCounts();
    PublishKvEvents();
    WriteThrough();
    finished_.fetch_add(static_cast<int64_t>(finished.size()));
    for (auto& [seq, event] : events) seq->on_event(event);
    for (auto& [seq, event] : finished) seq->on_event(event);
    // Now, not at the next step: a request's callback may hold its connection open.
    finished.clear();
  }
}

}  // namespace sluice::llm
