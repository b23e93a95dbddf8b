// Dynamic batcher: queue, batch formation, deadlines, cancellation.
#include "batching/dynamic_batcher.h"

#include <fmt/format.h>

#include <algorithm>
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
    if (queued_samples_ + samples > options_.max_queue_size) {
      return Status::Unavailable(fmt::format("queue full: {} samples queued, limit {}",
                                             queued_samples_, options_.max_queue_size));
    }
    // A waiting instance needs waking only when this request can change its decision: a first
    // request starts the delay clock; a full, preferred-size or unmergeable queue goes at once.
    wake_instance = queue_.empty() || options_.max_queue_delay.count() == 0 ||
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
  }
  if (wake_instance) work_cv_.Signal();
  if (wake_timer) deadline_cv_.Signal();
  return Status::Ok();
}

std::unique_ptr<InferRequest> DynamicBatcher::Cancel(RequestId id) {
  MutexLock lock(mu_);
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (queue_[i]->id == id) return RemoveAtLocked(i);
  }
  return nullptr;
}

BatcherPoll DynamicBatcher::Poll(Clock::time_point now) {
  MutexLock lock(mu_);
  return PollLocked(now);
}

BatcherPoll DynamicBatcher::WaitForBatch() {
  MutexLock lock(mu_);
  while (true) {
    BatcherPoll poll = PollLocked(clock_.Now());
    if (!poll.batch.requests.empty() || !poll.expired.empty()) {
      // Another free instance may be able to take what is left.
      if (!queue_.empty()) work_cv_.Signal();
      return poll;
    }
    if (closed_ && queue_.empty()) return {};
    clock_.WaitUntil(work_cv_, lock, poll.wake_at);
  }
}

std::vector<std::unique_ptr<InferRequest>> DynamicBatcher::WaitForExpiry() {
  MutexLock lock(mu_);
  while (!closed_) {
    std::vector<std::unique_ptr<InferRequest>> expired;
    ExpireLocked(clock_.Now(), expired);
    if (!expired.empty()) return expired;
    clock_.WaitUntil(deadline_cv_, lock, EarliestDeadlineLocked());
  }
  return {};
}

void DynamicBatcher::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
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

BatcherPoll DynamicBatcher::PollLocked(Clock::time_point now) {
  BatcherPoll poll;
  ExpireLocked(now, poll.expired);
  if (queue_.empty()) return poll;

  // The longest prefix of the queue that fits in one batch, and the longest prefix that ends
  // exactly on a preferred size.
  const InferRequest& oldest = *queue_.front();
  int64_t samples = 0;
  size_t count = 0;
  size_t preferred_count = 0;
  int64_t preferred_samples = 0;
  bool cannot_grow = false;
  const auto& preferred = options_.preferred_batch_sizes;
  for (const auto& request : queue_) {
    const int64_t s = request->samples();
    if (samples + s > options_.max_batch_size || !SameSampleShape(oldest, *request)) {
      cannot_grow = true;
      break;
    }
    samples += s;
    ++count;
    if (std::binary_search(preferred.begin(), preferred.end(), samples)) {
      preferred_count = count;
      preferred_samples = samples;
    }
  }
  if (samples == options_.max_batch_size) cannot_grow = true;
  const bool waited_enough = now - oldest.times.enqueue >= options_.max_queue_delay;

  if (!(closed_ || cannot_grow || waited_enough)) {
    if (preferred_count == 0) {
      poll.wake_at =
          std::min(oldest.times.enqueue + options_.max_queue_delay, EarliestDeadlineLocked());
      return poll;
    }
    count = preferred_count;
    samples = preferred_samples;
  }
  poll.batch.requests.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::unique_ptr<InferRequest> request = RemoveAtLocked(0);
    request->times.dispatch = now;
    poll.batch.requests.push_back(std::move(request));
  }
  poll.batch.samples = samples;
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
