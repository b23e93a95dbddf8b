// A model's request queue and dynamic batcher: requests arrive one by one and leave in batches.
//
// Semantics (DESIGN.md, "Batching"): a batch is formed when an instance is free, from queued
// requests in arrival order, up to a size limit (a request of 4 samples takes 4). Two policies:
//
// - fixed (Triton's): the limit is max_batch_size; a batch goes at once when a preferred size is
//   reached, when it cannot grow (full, or the next request does not fit), or when the oldest
//   request has waited max_queue_delay; otherwise the free instance sleeps until the earliest of
//   those.
// - adaptive (the default in configs): the limit is the size with the lowest cost per sample in
//   the cost model (learned from the batches run; max_batch_size until it knows any), and a batch
//   that has not reached it goes at once unless waiting pays: for some k of the requests expected
//   to join within what is left of max_queue_delay (from the rate at which requests arrive while
//   others wait), the wait for k more plus the batch grown by k must cost a sample at least
//   kAdaptiveMinGain less than the batch of now (the instance idles while it waits, so the wait
//   counts), and no other instance may be idle (an idle instance is capacity unused: batching
//   saves nothing then). At light load nobody comes while a request waits, so it goes at once; at
//   moderate load the wait costs more than the company saves, or another instance is free, so
//   nobody idles for it; under load the queue holds a full batch whenever an instance frees, so
//   batches fill.
//
// A free instance finding the queue empty may spin for BatcherOptions::idle_spin before it sleeps,
// so that a request arriving soon after the last answer starts without a scheduler wake-up (the
// one-request-at-a-time client's case); the spin yields its core at every turn.
//
// Requests past their deadline, or cancelled, leave the queue without running. A full queue
// rejects at once with kUnavailable, so memory stays bounded.
//
// The batcher only moves requests; it never calls their callbacks. Requests it drops (expired,
// cancelled, left over at shutdown) are handed back to the caller, which completes them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "batching/cost_model.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "sluice/request.h"
#include "sluice/status.h"

namespace sluice {

enum class BatchingPolicy { kFixed, kAdaptive };

struct BatcherOptions {
  BatchingPolicy policy = BatchingPolicy::kFixed;
  int max_batch_size = 8;                  // Samples per batch; >= 1.
  Micros max_queue_delay{1000};            // Longest the oldest request waits for company; >= 0.
  std::vector<int> preferred_batch_sizes;  // Dispatch at once on reaching one; ascending, each
                                           // <= max_batch_size. Empty: only max_batch_size.
  int max_queue_size = 1024;  // Queued samples; beyond this Enqueue() fails with kUnavailable.
  // Admission by predicted wait: a request whose predicted queue wait (the full batches queued
  // ahead of it, at the cost model's cost, spread over the instances) exceeds this, or its
  // own deadline, is refused at once with kUnavailable and a retry-after. 0: no budget (the
  // deadline still counts). Nothing is predicted before the cost model knows a cost.
  Micros max_queue_time{0};
  // A latency objective: a request whose predicted latency (queue wait plus a batch at the chosen
  // size) exceeds it is refused like one over max_queue_time; the adaptive policy also keeps its
  // batches to sizes the cost model expects to run in at most half of it (a request may wait for
  // the batch running when it arrives, then run in the next). 0: none.
  Micros latency_target{0};
  int instances = 1;
  // How long a free instance with an empty queue keeps polling for work (yielding its core to
  // any other runnable thread) before it sleeps: a request arriving within it starts without a
  // scheduler wake-up. Measured in real time, whatever the batcher's clock. 0: sleep at once.
  Micros idle_spin{0};
};

// Requests taken from the queue together, in arrival order.
struct Batch {
  std::vector<std::unique_ptr<InferRequest>> requests;
  int64_t samples = 0;
};

// What a free instance gets from the batcher.
struct BatcherPoll {
  Batch batch;  // Empty when no batch should go yet.
  // Requests whose deadline passed while queued: complete them with kDeadlineExceeded.
  std::vector<std::unique_ptr<InferRequest>> expired;
  // When to poll again if `batch` is empty: the oldest request's delay expiry or the earliest
  // deadline, whichever is sooner; time_point::max() when the queue is empty.
  Clock::time_point wake_at = Clock::time_point::max();
};

// Thread-safe. No method blocks beyond taking mu_, except WaitForBatch() and WaitForExpiry().
class DynamicBatcher {
 public:
  DynamicBatcher(BatcherOptions options, Clock& clock);
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues `request` and stamps times.enqueue. On OK takes the request; on error leaves it with
  // the caller, who must answer it: kInvalidArgument when it has no samples or more than
  // max_batch_size, kDeadlineExceeded when its deadline has passed, kUnavailable when the queue
  // is full or closed.
  Status Enqueue(std::unique_ptr<InferRequest>& request);
  // Whether Enqueue() would take a request of `samples` with `deadline` now: the same
  // queue-size and predicted-wait checks, for a request whose body is not read yet. The ticket
  // it returns counts the request as queued, ahead of later arrivals, until it is let go (once
  // the request is enqueued or dropped): requests being read and decoded are work ahead too.
  Result<std::shared_ptr<const void>> Admit(int64_t samples,
                                            std::optional<Clock::time_point> deadline);
  // Samples admitted whose tickets are still held.
  int64_t incoming_samples() const { return intake_->samples.load(); }
  // How long a request admitted at its header takes to be queued (its body read and decoded),
  // smoothed over the tickets let go; a request admitted at its header is predicted to wait this
  // much more.
  double intake_seconds() const;

  // Removes a queued request. Returns it (the caller completes it with kCancelled), or nullptr
  // when it is not queued (already dispatched, completed, or unknown).
  std::unique_ptr<InferRequest> Cancel(RequestId id);

  // Non-blocking, for a free instance: drops expired requests into `expired` and forms a batch if
  // one should go at `now` (after Close(), whatever is queued goes at once).
  BatcherPoll Poll(Clock::time_point now);

  // Blocking, for a free instance: waits until Poll() would return a batch or expired requests,
  // and returns that. Returns an empty poll (no batch, nothing expired) once the batcher is closed
  // and empty: the instance should stop.
  BatcherPoll WaitForBatch();

  // Blocking, for a timer thread: returns requests as their deadlines pass even while every
  // instance is busy. Returns an empty list once the batcher is closed.
  std::vector<std::unique_ptr<InferRequest>> WaitForExpiry();

  // Stops accepting requests (Enqueue() fails with kUnavailable) and wakes every waiter. Queued
  // requests still leave through Poll()/WaitForBatch(), at once and without waiting for company.
  void Close();

  // Removes and returns every queued request (for a stop that does not run them).
  std::vector<std::unique_ptr<InferRequest>> TakeAll();

  int64_t queued_requests() const;
  int64_t queued_samples() const;
  const BatcherOptions& options() const { return options_; }

  // The model's batch costs: the caller records each batch it runs (and the warm-up runs).
  BatchCostModel& cost_model() { return cost_model_; }
  const BatchCostModel& cost_model() const { return cost_model_; }

  // The batch size batches are formed at now: adaptive, the cost model's cheapest per sample;
  // fixed, max_batch_size.
  int64_t target_batch_size() const;

  // Samples per second arriving while another request waits in the queue (decaying over about a
  // second): the company a waiting batch can expect.
  double company_rate() const;
  // Samples per second the queue hands to instances while it holds requests and no instance is
  // idle (waiting for company does not count: it is the policy's choice, not the capacity),
  // decaying over about a second as company_rate: how fast it really drains, whatever the cost
  // model says; 0 until such a backlog has lasted a millisecond.
  double drain_rate() const;
  // Observed queue waits over the cost model's predictions, smoothed: the factor those are
  // scaled by.
  double wait_calibration() const;
  // Times an instance waiting in WaitForBatch() was woken (by work, a timeout, or the wake-up of
  // another): the thread hand-offs a request's path costs at the model, against the requests run.
  int64_t instance_wakeups() const;
  // Times an instance spinning on an empty queue (BatcherOptions::idle_spin) saw a request
  // arrive, or the batcher close, before its spin ran out: a wake-up saved.
  int64_t spin_catches() const;
  // Instances waiting in WaitForBatch() now (for work, or for company).
  int waiting_instances() const;

  // The adaptive policy waits only when the expected company, the wait included, lowers the cost
  // per sample by this fraction at least.
  static constexpr double kAdaptiveMinGain = 0.10;
  // The adaptive policy: one full batch in this many is cut to a size the cost model has not
  // measured enough (BatchCostModel::SizeToExplore), while there is one.
  static constexpr int64_t kExploreEvery = 8;

 private:
  BatcherPoll PollLocked(Clock::time_point now) REQUIRES(mu_);
  void ExpireLocked(Clock::time_point now, std::vector<std::unique_ptr<InferRequest>>& expired)
      REQUIRES(mu_);
  // Moves to `expired` the requests the next batch would take whose deadline comes before that
  // batch is expected to end (the cost model's slow run of it from `now`) and that had time for a
  // run when queued: run, they would be answered late, for their wait. Nothing while the cost model
  // knows no cost.
  void ExpireUnfinishableLocked(Clock::time_point now,
                                std::vector<std::unique_ptr<InferRequest>>& expired) REQUIRES(mu_);
  std::unique_ptr<InferRequest> RemoveAtLocked(size_t index) REQUIRES(mu_);
  Clock::time_point EarliestDeadlineLocked() const REQUIRES(mu_);
  // The company-rate sums as of `now`, decayed, with the time since the last update counted as
  // waiting if the queue held a request; AgeCompanyLocked() stores them.
  struct CompanySums {
    double samples;  // Arrived while the queue held a request.
    double drained;  // Dispatched.
    double seconds;  // The queue held a request.
    double backlog;  // The queue held a request and no instance waited in WaitForBatch().
  };
  CompanySums CompanyAtLocked(Clock::time_point now) const REQUIRES(mu_);
  void AgeCompanyLocked(Clock::time_point now) REQUIRES(mu_);
  double CompanyRateLocked(Clock::time_point now) const REQUIRES(mu_);
  double DrainRateLocked(Clock::time_point now) const REQUIRES(mu_);
  int64_t TargetSizeLocked() const REQUIRES(mu_);
  // Shortens the batch of the first `count` requests (`samples` in all) to its longest prefix of
  // at most `at_most` samples; false (nothing changed) when even the first request is larger.
  bool CutPrefixLocked(int64_t at_most, size_t& count, int64_t& samples) const REQUIRES(mu_);
  // Seconds a request joining the queue now would wait before its batch starts, 0 when unknown:
  // the samples ahead over the drain rate once the queue has been seen draining; before, the
  // cost model's prediction scaled by wait_calibration_.
  double PredictedWaitLocked(Clock::time_point now) const REQUIRES(mu_);
  // The cost model's prediction alone: the full batches ahead over the instances.
  double UncalibratedWaitLocked() const REQUIRES(mu_);
  // Samples queued, and admitted at their header and still being read: ahead of a newcomer.
  int64_t SamplesAheadLocked() const REQUIRES(mu_);
  // `intake`: the time still to come before the request can be queued (0 once it is).
  Status AdmitLocked(Clock::time_point now, int64_t samples,
                     std::optional<Clock::time_point> deadline, double intake) const REQUIRES(mu_);
  // Adaptive: whether the batch of `samples` (of at most `limit`) should wait for company.
  bool WaitingPaysLocked(Clock::time_point now, Clock::time_point give_up, int64_t samples,
                         int64_t limit) REQUIRES(mu_);

  const BatcherOptions options_;
  Clock& clock_;

  mutable Mutex mu_;
  CondVar work_cv_;      // Free instances wait here.
  CondVar deadline_cv_;  // The expiry timer waits here.
  std::deque<std::unique_ptr<InferRequest>> queue_ GUARDED_BY(mu_);
  std::multiset<Clock::time_point> deadlines_ GUARDED_BY(mu_);  // Of queued requests.
  int64_t queued_samples_ GUARDED_BY(mu_) = 0;
  // The cost model's predicted waits leave out the batch running when a request arrived and any
  // contention for the cores. The ratio of observed to those predicted waits (requests predicted
  // to wait at least kCalibrationFloor), smoothed, scales them where they are used: before the
  // queue has been seen draining (the drain rate, when known, predicts instead).
  static constexpr double kCalibrationFloor = 0.005;
  static constexpr double kCalibrationWeight = 0.1;
  static constexpr double kIntakeWeight = 0.1;
  double wait_calibration_ GUARDED_BY(mu_) = 1.0;
  // Requests admitted at their header and not yet queued (their bodies being read and decoded),
  // and how long that stage has taken a request, smoothed. Held by tickets, which may outlive the
  // batcher (the clock must not).
  // The estimate fades by e every second without news (while every header is refused no ticket
  // reports, and the contention that made bodies slow is gone).
  struct Intake {
    std::atomic<int64_t> samples{0};
    Mutex mu;
    double seconds GUARDED_BY(mu) = 0;
    Clock::time_point updated GUARDED_BY(mu);
    double Faded(Clock::time_point now) const REQUIRES(mu);
  };
  const std::shared_ptr<Intake> intake_ = std::make_shared<Intake>();
  bool closed_ GUARDED_BY(mu_) = false;
  BatchCostModel cost_model_;
  int64_t batches_since_explore_ GUARDED_BY(mu_) = 0;
  // Company and drain rates (CompanySums, stored at company_updated_): exponentially decayed
  // samples that arrived while the queue held a request over decayed seconds during which it held
  // one; decayed samples dispatched over decayed seconds during which it held one and no instance
  // was waiting.
  double company_samples_ GUARDED_BY(mu_) = 0;
  double company_seconds_ GUARDED_BY(mu_) = 0;
  double drained_samples_ GUARDED_BY(mu_) = 0;
  double backlog_seconds_ GUARDED_BY(mu_) = 0;
  int waiting_instances_ GUARDED_BY(mu_) = 0;  // In WaitForBatch(), waiting.
  int64_t instance_wakeups_ GUARDED_BY(mu_) = 0;
  // Bumped with every arrival and by Close(): what a spinning instance watches without mu_.
  std::atomic<uint64_t> work_epoch_{0};
  int64_t spin_catches_ GUARDED_BY(mu_) = 0;    // Spins that ended with work to look at.
  int spinning_instances_ GUARDED_BY(mu_) = 0;  // Spinning now: Enqueue() need not signal.
  Clock::time_point company_updated_ GUARDED_BY(mu_){};
};

// True when `a` and `b` can share a batch: the same number of inputs, and each input with the
// same datatype and the same shape beyond the leading (batch) dimension.
bool SameSampleShape(const InferRequest& a, const InferRequest& b);

}  // namespace sluice
