// Dynamic batcher: queue, batch formation, deadlines, cancellation.
#include "batching/dynamic_batcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>

namespace sluice {

bool SameSampleShape(const InferRequest& a, const InferRequest& b) {
  if (a.inputs.size() != b.inputs.size()) return false;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const Tensor& x = a.inputs[i];
    const Tensor& y = b.inputs[i];
    if (x.dtype() != y.dtype() || x.shape().size() != y.shape().size()) return false;
    if (!std::equal(x.shape().begin() + 1, x.shape().end(), y.shape().begin() + 1)) return false;
  }
  return true;
}

DynamicBatcher::DynamicBatcher(BatcherOptions options, Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

Status DynamicBatcher::Enqueue(std::unique_ptr<InferRequest>& request) {
  const int64_t samples = request->samples();
  if (samples < 1) {
    return Status::InvalidArgument("request has no samples (leading dimension must be >= 1)");
  }
  if (samples > options_.max_batch_size) {
    return Status::InvalidArgument(
        fmt::format("request has {} samples; the model's max_batch_size is {}", samples,
                    options_.max_batch_size));
  }
  bool wake_instance = false;
  bool wake_timer = false;
  {
    MutexLock lock(mu_);
    if (closed_) return Status::Unavailable("model is stopping and accepts no new requests");
    const Clock::time_point now = clock_.Now();
    if (request->deadline && *request->deadline <= now) {
      return Status::DeadlineExceeded("request deadline passed before it was queued");
    }
    SLUICE_RETURN_IF_ERROR(AdmitLocked(now, samples, request->deadline, 0.0));
    request->predicted_wait_seconds = UncalibratedWaitLocked();
    AgeCompanyLocked(now);
    if (!queue_.empty()) company_samples_ += static_cast<double>(samples);
    // A waiting instance needs waking only when this request can change its decision: a first
    // request starts the delay clock; a full, preferred-size or unmergeable queue goes at once;
    // under the adaptive policy every arrival changes the sums that decide.
    wake_instance = queue_.empty() || options_.max_queue_delay.count() == 0 ||
                    options_.policy == BatchingPolicy::kAdaptive ||
                    !options_.preferred_batch_sizes.empty() ||
                    queued_samples_ + samples >= options_.max_batch_size ||
                    !SameSampleShape(*queue_.front(), *request);
    if (request->deadline) {
      wake_timer = deadlines_.empty() || *request->deadline < *deadlines_.begin();
      deadlines_.insert(*request->deadline);
    }
    request->times.enqueue = now;
    queued_samples_ += samples;
    queue_.push_back(std::move(request));
    work_epoch_.fetch_add(1, std::memory_order_release);
    // A spinning instance sees the arrival and polls under mu_ before it could sleep.
    if (spinning_instances_ > 0) wake_instance = false;
  }
  if (wake_instance) work_cv_.Signal();
  if (wake_timer) deadline_cv_.Signal();
  return Status::Ok();
}

std::unique_ptr<InferRequest> DynamicBatcher::Cancel(RequestId id) {
  MutexLock lock(mu_);
  AgeCompanyLocked(clock_.Now());
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (queue_[i]->id == id) return RemoveAtLocked(i);
  }
  return nullptr;
}

BatcherPoll DynamicBatcher::Poll(Clock::time_point now) {
  MutexLock lock(mu_);
  return PollLocked(now);
}

namespace {

// Polls `epoch` until it moves from `seen` or `spin` of real time passes; true when it moved.
// Each turn yields the core, so a thread woken there (the one about to bring work) runs first.
bool SpinWhileUnchanged(const std::atomic<uint64_t>& epoch, uint64_t seen, Micros spin) {
  const auto give_up = std::chrono::steady_clock::now() + spin;
  while (epoch.load(std::memory_order_acquire) == seen) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

BatcherPoll DynamicBatcher::WaitForBatch() {
  MutexLock lock(mu_);
  bool spun = false;
  while (true) {
    BatcherPoll poll = PollLocked(clock_.Now());
    if (!poll.batch.requests.empty() || !poll.expired.empty()) {
      // Another free instance may be able to take what is left.
      if (!queue_.empty()) work_cv_.Signal();
      return poll;
    }
    if (closed_ && queue_.empty()) return {};
    // An instance waiting (for company, or for work) is capacity unused: the time does not count
    // towards the drain rate.
    ++waiting_instances_;
    if (!spun && options_.idle_spin.count() > 0 && queue_.empty()) {
      // Once per wait, and only for an empty queue: waiting for company has a time to wake at.
      spun = true;
      const uint64_t seen = work_epoch_.load(std::memory_order_acquire);
      ++spinning_instances_;
      lock.Unlock();
      const bool caught = SpinWhileUnchanged(work_epoch_, seen, options_.idle_spin);
      lock.Lock();
      --spinning_instances_;
      if (caught) ++spin_catches_;
    } else {
      clock_.WaitUntil(work_cv_, lock, poll.wake_at);
      ++instance_wakeups_;
    }
    AgeCompanyLocked(clock_.Now());
    --waiting_instances_;
  }
}

std::vector<std::unique_ptr<InferRequest>> DynamicBatcher::WaitForExpiry() {
  MutexLock lock(mu_);
  while (!closed_) {
    std::vector<std::unique_ptr<InferRequest>> expired;
    const Clock::time_point now = clock_.Now();
    AgeCompanyLocked(now);
    ExpireLocked(now, expired);
    if (!expired.empty()) return expired;
    clock_.WaitUntil(deadline_cv_, lock, EarliestDeadlineLocked());
  }
  return {};
}

void DynamicBatcher::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
    work_epoch_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.SignalAll();
  deadline_cv_.SignalAll();
}

std::vector<std::unique_ptr<InferRequest>> DynamicBatcher::TakeAll() {
  MutexLock lock(mu_);
  std::vector<std::unique_ptr<InferRequest>> all;
  all.reserve(queue_.size());
  for (auto& request : queue_) all.push_back(std::move(request));
  queue_.clear();
  deadlines_.clear();
  queued_samples_ = 0;
  return all;
}

int64_t DynamicBatcher::queued_requests() const {
  MutexLock lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t DynamicBatcher::queued_samples() const {
  MutexLock lock(mu_);
  return queued_samples_;
}

int64_t DynamicBatcher::target_batch_size() const {
  MutexLock lock(mu_);
  return TargetSizeLocked();
}

int DynamicBatcher::waiting_instances() const {
  MutexLock lock(mu_);
  return waiting_instances_;
}

int64_t DynamicBatcher::instance_wakeups() const {
  MutexLock lock(mu_);
  return instance_wakeups_;
}

int64_t DynamicBatcher::spin_catches() const {
  MutexLock lock(mu_);
  return spin_catches_;
}

double DynamicBatcher::company_rate() const {
  MutexLock lock(mu_);
  return CompanyRateLocked(clock_.Now());
}

namespace {
constexpr double kCompanyDecaySeconds = 1.0;
}  // namespace

DynamicBatcher::CompanySums DynamicBatcher::CompanyAtLocked(Clock::time_point now) const {
  CompanySums sums{company_samples_, drained_samples_, company_seconds_, backlog_seconds_};
  if (company_updated_ == Clock::time_point{} || now <= company_updated_) return sums;
  const double elapsed = std::chrono::duration<double>(now - company_updated_).count();
  const double keep = std::exp(-elapsed / kCompanyDecaySeconds);
  sums.samples *= keep;
  sums.drained *= keep;
  // The queue held a request throughout the interval or not at all: it only changes at an update.
  sums.seconds = sums.seconds * keep + (queue_.empty() ? 0.0 : elapsed);
  // So did the number of instances waiting.
  sums.backlog = sums.backlog * keep + (queue_.empty() || waiting_instances_ > 0 ? 0.0 : elapsed);
  return sums;
}

void DynamicBatcher::AgeCompanyLocked(Clock::time_point now) {
  if (company_updated_ == Clock::time_point{}) company_updated_ = now;
  if (now <= company_updated_) return;
  const CompanySums sums = CompanyAtLocked(now);
  company_samples_ = sums.samples;
  drained_samples_ = sums.drained;
  company_seconds_ = sums.seconds;
  backlog_seconds_ = sums.backlog;
  company_updated_ = now;
}

double DynamicBatcher::CompanyRateLocked(Clock::time_point now) const {
  const CompanySums sums = CompanyAtLocked(now);
  // Less than a millisecond of waiting observed says nothing yet: expect no company.
  return sums.seconds < 1e-3 ? 0.0 : sums.samples / sums.seconds;
}

double DynamicBatcher::drain_rate() const {
  MutexLock lock(mu_);
  return DrainRateLocked(clock_.Now());
}

double DynamicBatcher::DrainRateLocked(Clock::time_point now) const {
  const CompanySums sums = CompanyAtLocked(now);
  return sums.backlog < 1e-3 ? 0.0 : sums.drained / sums.backlog;
}

int64_t DynamicBatcher::TargetSizeLocked() const {
  if (options_.policy != BatchingPolicy::kAdaptive) return options_.max_batch_size;
  int limit = options_.max_batch_size;
  if (options_.latency_target.count() > 0) {
    const double half = std::chrono::duration<double>(options_.latency_target).count() / 2;
    limit = cost_model_.LargestWithin(half, limit);
  }
  return cost_model_.BestSize(limit);
}

Result<std::shared_ptr<const void>> DynamicBatcher::Admit(
    int64_t samples, std::optional<Clock::time_point> deadline) {
  {
    MutexLock lock(mu_);
    if (closed_) return Status::Unavailable("model is stopping and accepts no new requests");
    SLUICE_RETURN_IF_ERROR(AdmitLocked(clock_.Now(), samples, deadline, intake_seconds()));
  }
  intake_->samples.fetch_add(samples);
  Clock* clock = &clock_;
  const Clock::time_point admitted = clock_.Now();
  // One slow upload must not stop everyone's: a report counts for at most the queue-time budget.
  const double cap = options_.max_queue_time.count() > 0
                         ? std::chrono::duration<double>(options_.max_queue_time).count()
                         : std::numeric_limits<double>::infinity();
  return std::shared_ptr<const void>(
      intake_.get(), [intake = intake_, samples, clock, admitted, cap](const void*) {
        intake->samples.fetch_sub(samples);
        const Clock::time_point now = clock->Now();
        const double took = std::min(cap, std::chrono::duration<double>(now - admitted).count());
        MutexLock lock(intake->mu);
        const double faded = intake->Faded(now);
        intake->seconds = faded + kIntakeWeight * (took - faded);
        intake->updated = now;
      });
}

double DynamicBatcher::Intake::Faded(Clock::time_point now) const {
  const double since = std::chrono::duration<double>(now - updated).count();
  return since > 0 ? seconds * std::exp(-since) : seconds;
}

double DynamicBatcher::intake_seconds() const {
  MutexLock lock(intake_->mu);
  return intake_->Faded(clock_.Now());
}

Status DynamicBatcher::AdmitLocked(Clock::time_point now, int64_t samples,
                                   std::optional<Clock::time_point> deadline, double intake) const {
  if (queued_samples_ + samples > options_.max_queue_size) {
    return Status::Unavailable(fmt::format("queue full: {} samples queued, limit {}",
                                           queued_samples_, options_.max_queue_size));
  }
  const double wait = PredictedWaitLocked(now) + intake;
  // The batch the request will run in, as slow as such batches have lately run (0 while no cost
  // is known): Poll() runs it only if it would end by the deadline even then.
  const double own_batch = cost_model_.EstimateSlow(static_cast<int>(TargetSizeLocked()));
  if (deadline) {
    // A request is answered only if its batch can end by its deadline (see Poll()): one predicted
    // to wait past that is refused now, when the client can still go elsewhere, instead of
    // expiring in the queue.
    const double left = std::chrono::duration<double>(*deadline - now).count();
    if (wait > 0 && wait + own_batch > left) {
      return Status::Unavailable(
                 fmt::format("predicted queue wait {:.0f} ms and run {:.0f} ms exceed the "
                             "request's deadline ({:.0f} ms)",
                             wait * 1e3, own_batch * 1e3, left * 1e3))
          .WithRetryAfter(wait + own_batch - left);
    }
  }
  const double budget = std::chrono::duration<double>(options_.max_queue_time).count();
  if (budget > 0 && wait > budget) {
    return Status::Unavailable(
               fmt::format("predicted queue wait {:.0f} ms exceeds the model's queue-time "
                           "budget ({:.0f} ms)",
                           wait * 1e3, budget * 1e3))
        .WithRetryAfter(wait - budget);
  }
  if (options_.latency_target.count() > 0) {
    const double target = std::chrono::duration<double>(options_.latency_target).count();
    if (own_batch > 0 && wait + own_batch > target) {
      return Status::Unavailable(
                 fmt::format("predicted latency {:.0f} ms (queue {:.0f} ms, batch {:.0f} ms) "
                             "exceeds the model's SLO p99 of {:.0f} ms",
                             (wait + own_batch) * 1e3, wait * 1e3, own_batch * 1e3, target * 1e3))
          .WithRetryAfter(wait + own_batch - target);
    }
  }
  return Status::Ok();
}

double DynamicBatcher::wait_calibration() const {
  MutexLock lock(mu_);
  return wait_calibration_;
}

double DynamicBatcher::PredictedWaitLocked(Clock::time_point now) const {
  // What the queue has really drained at, when it has been seen draining: it holds what the
  // cost model cannot (the cores shared with reading and decoding other requests, batches slower
  // than their warm runs) as soon as it happens, where the calibration learns only from requests
  // that already waited. Until then, the cost model's prediction, calibrated.
  const double rate = DrainRateLocked(now);
  if (rate <= 0) return wait_calibration_ * UncalibratedWaitLocked();
  return static_cast<double>(SamplesAheadLocked()) / rate;
}

int64_t DynamicBatcher::SamplesAheadLocked() const {
  return queued_samples_ + intake_->samples.load();
}

double DynamicBatcher::UncalibratedWaitLocked() const {
  const int64_t target = TargetSizeLocked();
  const double batch_seconds = cost_model_.Estimate(static_cast<int>(target));
  if (batch_seconds <= 0) return 0;
  // The full batches queued (or admitted and still being read) ahead of the one this request
  // joins start first; its own batch starts when they are done (the batches running now are not
  // counted).
  const int64_t batches_ahead = SamplesAheadLocked() / target;
  return static_cast<double>(batches_ahead) * batch_seconds / std::max(1, options_.instances);
}

bool DynamicBatcher::WaitingPaysLocked(Clock::time_point now, Clock::time_point give_up,
                                       int64_t samples, int64_t limit) {
  if (now >= give_up) return false;
  const double left = std::chrono::duration<double>(give_up - now).count();
  const double rate = CompanyRateLocked(now);
  // Whole requests expected within the delay, and no more than the batch can take.
  const int64_t expected = std::min<int64_t>(limit - samples, static_cast<int64_t>(rate * left));
  if (expected < 1) return false;
  const double now_cost = cost_model_.Estimate(static_cast<int>(samples));
  // Without costs yet, company is assumed to pay, as under the fixed policy.
  if (now_cost <= 0) return true;
  // The instance idles while it waits: waiting for k more pays only when the wait plus the
  // larger batch costs a sample at least kAdaptiveMinGain less than the batch of now does.
  const double bar = (1.0 - kAdaptiveMinGain) * now_cost / static_cast<double>(samples);
  for (int64_t k = 1; k <= expected; ++k) {
    const int64_t grown = samples + k;
    const double per_sample =
        (static_cast<double>(k) / rate + cost_model_.Estimate(static_cast<int>(grown))) /
        static_cast<double>(grown);
    if (per_sample <= bar) return true;
  }
  return false;
}

bool DynamicBatcher::CutPrefixLocked(int64_t at_most, size_t& count, int64_t& samples) const {
  int64_t cut = 0;
  size_t cut_count = 0;
  for (const auto& request : queue_) {
    if (cut_count == count || cut + request->samples() > at_most) break;
    cut += request->samples();
    ++cut_count;
  }
  if (cut_count == 0) return false;
  count = cut_count;
  samples = cut;
  return true;
}

BatcherPoll DynamicBatcher::PollLocked(Clock::time_point now) {
  BatcherPoll poll;
  AgeCompanyLocked(now);
  ExpireLocked(now, poll.expired);
  ExpireUnfinishableLocked(now, poll.expired);
  if (queue_.empty()) return poll;

  const bool adaptive = options_.policy == BatchingPolicy::kAdaptive;
  const int64_t limit = TargetSizeLocked();
  bool exploring = false;  // This batch measures a size on purpose.
  // The longest prefix of the queue that fits in one batch, and the longest prefix that ends
  // exactly on a preferred size (fixed policy).
  const InferRequest& oldest = *queue_.front();
  int64_t samples = 0;
  size_t count = 0;
  size_t preferred_count = 0;
  int64_t preferred_samples = 0;
  bool cannot_grow = false;
  const auto& preferred = options_.preferred_batch_sizes;
  for (const auto& request : queue_) {
    const int64_t s = request->samples();
    if (samples + s > limit || !SameSampleShape(oldest, *request)) {
      cannot_grow = true;
      break;
    }
    samples += s;
    ++count;
    if (!adaptive && std::binary_search(preferred.begin(), preferred.end(), samples)) {
      preferred_count = count;
      preferred_samples = samples;
    }
  }
  if (adaptive && samples >= limit &&
      ++batches_since_explore_ >= kExploreEvery) {  // A full batch: maybe measure a smaller size.
    if (const int explore = cost_model_.SizeToExplore(static_cast<int>(limit)); explore > 0) {
      batches_since_explore_ = 0;
      exploring = CutPrefixLocked(explore, count, samples);
    }
  }
  if (count == 0) {  // The oldest request alone is larger than the adaptive limit: it goes alone.
    count = 1;
    samples = oldest.samples();
    cannot_grow = true;
  }
  if (samples >= limit) cannot_grow = true;
  const Clock::time_point give_up = oldest.times.enqueue + options_.max_queue_delay;
  const bool waited_enough = now >= give_up;

  if (!(closed_ || cannot_grow || waited_enough)) {
    if (adaptive) {
      // Another instance idle is capacity unused: nothing to save by waiting (a waiting instance
      // is one: who waits for company, waits in WaitForBatch).
      if (waiting_instances_ == 0 && WaitingPaysLocked(now, give_up, samples, limit)) {
        poll.wake_at = std::min(give_up, EarliestDeadlineLocked());
        return poll;
      }
    } else if (preferred_count == 0) {
      poll.wake_at = std::min(give_up, EarliestDeadlineLocked());
      return poll;
    } else {
      count = preferred_count;
      samples = preferred_samples;
    }
  }
  const int known = adaptive && !exploring && samples < limit
                        ? cost_model_.LargestRunAtMost(static_cast<int>(samples))
                        : static_cast<int>(samples);
  if (known < samples && 2 * known > samples) {
    // A size never run is cold: its first run builds the kernels' plans for a new shape (seen at
    // 2-3x a warm run's time). Send the largest prefix of a size already run, when that is more
    // than half the batch; the rest goes in the next.
    CutPrefixLocked(known, count, samples);
  }
  poll.batch.requests.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::unique_ptr<InferRequest> request = RemoveAtLocked(0);
    request->times.dispatch = now;
    if (request->predicted_wait_seconds >= kCalibrationFloor) {
      // The factor moves towards this request's observed over (unscaled) predicted wait, within
      // [0.5, 20].
      const double observed = std::chrono::duration<double>(now - request->times.enqueue).count();
      const double ratio = observed / request->predicted_wait_seconds;
      wait_calibration_ = std::clamp(
          wait_calibration_ + kCalibrationWeight * (ratio - wait_calibration_), 0.5, 20.0);
    }
    poll.batch.requests.push_back(std::move(request));
  }
  poll.batch.samples = samples;
  drained_samples_ += static_cast<double>(samples);  // Aged by AgeCompanyLocked above.
  return poll;
}

void DynamicBatcher::ExpireLocked(Clock::time_point now,
                                  std::vector<std::unique_ptr<InferRequest>>& expired) {
  if (deadlines_.empty() || *deadlines_.begin() > now) return;
  for (size_t i = 0; i < queue_.size();) {
    if (queue_[i]->deadline && *queue_[i]->deadline <= now) {
      expired.push_back(RemoveAtLocked(i));
    } else {
      ++i;
    }
  }
}

void DynamicBatcher::ExpireUnfinishableLocked(Clock::time_point now,
                                              std::vector<std::unique_ptr<InferRequest>>& expired) {
  if (deadlines_.empty() || queue_.empty()) return;
  const int64_t next_batch = std::min(queued_samples_, TargetSizeLocked());
  // A batch whose run varies (a CPU shared with other tenants) is judged on a slow run: run on
  // its average, half of the batches started near the deadline would end after it.
  const double run = cost_model_.EstimateSlow(static_cast<int>(next_batch));
  if (run <= 0) return;
  const Clock::time_point ends =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(run));
  if (*deadlines_.begin() >= ends) return;
  const auto run_time = ends - now;
  int64_t taken = 0;
  for (size_t i = 0; i < queue_.size() && taken < next_batch;) {
    const InferRequest& request = *queue_[i];
    // Only what its wait made late: a deadline that left less than a run from the start (a
    // model slower than its timeout) is run all the same, as it would be with an empty queue.
    if (request.deadline && *request.deadline < ends &&
        *request.deadline - request.times.enqueue >= run_time) {
      expired.push_back(RemoveAtLocked(i));
    } else {
      taken += queue_[i]->samples();
      ++i;
    }
  }
}

std::unique_ptr<InferRequest> DynamicBatcher::RemoveAtLocked(size_t index) {
  std::unique_ptr<InferRequest> request = std::move(queue_[index]);
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(index));
  queued_samples_ -= request->samples();
  if (request->deadline) deadlines_.erase(deadlines_.find(*request->deadline));
  return request;
}

Clock::time_point DynamicBatcher::EarliestDeadlineLocked() const {
  return deadlines_.empty() ? Clock::time_point::max() : *deadlines_.begin();
}

}  // namespace sluice
