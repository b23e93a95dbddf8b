#include "batching/cost_model.h"

#include <cmath>
#include <iterator>

namespace sluice {

void BatchCostModel::Observe(int samples, double seconds) {
  if (samples <= 0 || !(seconds > 0)) return;
  MutexLock lock(mu_);
  auto [it, inserted] = sizes_.try_emplace(samples, Measured{seconds, 1, false});
  if (inserted) return;
  Measured& m = it->second;
  // The first run at a size is cold (a new shape builds its kernels' plans): the second replaces
  // it; later runs are averaged in.
  if (m.warm) {
    m.spread += kWeight * (std::abs(seconds - m.seconds) - m.spread);
    m.seconds += kWeight * (seconds - m.seconds);
  } else {
    m.seconds = seconds;
  }
  m.warm = true;
  any_warm_ = true;
  ++m.runs;
}

void BatchCostModel::Seed(int samples, double seconds) {
  if (samples <= 0 || !(seconds > 0)) return;
  MutexLock lock(mu_);
  sizes_.insert_or_assign(samples, Measured{seconds, 1, true});
  any_warm_ = true;
}

double BatchCostModel::Estimate(int samples) const {
  MutexLock lock(mu_);
  return EstimateLocked(samples);
}

double BatchCostModel::EstimateSlow(int samples) const {
  MutexLock lock(mu_);
  return EstimateLocked(samples, /*slow=*/true);
}

double BatchCostModel::PerSample(int samples) const {
  if (samples <= 0) return 0;
  return Estimate(samples) / samples;
}

bool BatchCostModel::TrustedLocked(const Measured& m) const {
  // A cold run alone is trusted only while nothing warm is known.
  return m.warm || !any_warm_;
}

double BatchCostModel::EstimateLocked(int samples, bool slow) const {
  if (samples <= 0) return 0;
  auto time = [slow](const Measured& m) {
    return slow ? m.seconds + kSlowSpreads * m.spread : m.seconds;
  };
  const std::pair<const int, Measured>* below = nullptr;
  const std::pair<const int, Measured>* above = nullptr;
  for (const auto& entry : sizes_) {
    if (!TrustedLocked(entry.second)) continue;
    if (entry.first == samples) return time(entry.second);
    if (entry.first < samples) {
      below = &entry;
    } else {
      above = &entry;
      break;
    }
  }
  if (!below && !above) return 0;
  if (!below) return time(above->second);  // Below the smallest known: its time.
  if (!above) return time(below->second) * samples / below->first;  // Above: time per sample.
  const double t = static_cast<double>(samples - below->first) / (above->first - below->first);
  return time(below->second) + t * (time(above->second) - time(below->second));
}

int BatchCostModel::BestSize(int limit) const {
  MutexLock lock(mu_);
  if (sizes_.empty()) return limit;
  int best = 0;
  double best_cost = 0;
  for (const auto& [samples, m] : sizes_) {
    if (samples > limit) break;
    // A size is chosen on warm runs (a warm-up run, or the runs after its first), except the limit
    // (which must stay a candidate, or a size chosen below it would never let it run again) and
    // while only one size is known.
    if (!TrustedLocked(m) || (!m.warm && samples != limit && sizes_.size() > 1)) continue;
    const double cost = m.seconds / samples;
    if (best == 0 || cost <= best_cost) {
      best = samples;
      best_cost = cost;
    }
  }
  // The limit itself, estimated if never run (or run once, cold): above the largest size known it
  // costs that size's time per sample, a tie that the larger size wins, so batches grow until it
  // has been measured.
  auto at_limit = sizes_.find(limit);
  if ((at_limit == sizes_.end() || !TrustedLocked(at_limit->second)) &&
      (best == 0 || EstimateLocked(limit) / limit <= best_cost * (1 + 1e-9))) {
    best = limit;
  }
  return best;
}

int BatchCostModel::LargestWithin(double seconds, int limit) const {
  MutexLock lock(mu_);
  if (sizes_.empty() || EstimateLocked(limit) <= seconds) return limit;
  int low = 1, high = limit;  // EstimateLocked(high) > seconds.
  while (high - low > 1) {
    const int middle = low + (high - low) / 2;
    (EstimateLocked(middle) <= seconds ? low : high) = middle;
  }
  return low;
}

bool BatchCostModel::HasRun(int samples) const {
  MutexLock lock(mu_);
  return sizes_.count(samples) > 0;
}

int BatchCostModel::LargestRunAtMost(int samples) const {
  MutexLock lock(mu_);
  auto above = sizes_.upper_bound(samples);
  return above == sizes_.begin() ? 0 : std::prev(above)->first;
}

int BatchCostModel::SizeToExplore(int below) const {
  MutexLock lock(mu_);
  for (int size = 1; size < below; size *= 2) {
    auto it = sizes_.find(size);
    if (it == sizes_.end() || !it->second.warm) {
      // The largest such power of two: nearest the chosen size, where the choice is made.
      int largest = size;
      for (int next = size * 2; next < below; next *= 2) {
        auto n = sizes_.find(next);
        if (n == sizes_.end() || !n->second.warm) largest = next;
      }
      return largest;
    }
  }
  return 0;
}

std::vector<BatchCostModel::Entry> BatchCostModel::Snapshot() const {
  MutexLock lock(mu_);
  std::vector<Entry> entries;
  entries.reserve(sizes_.size());
  for (const auto& [samples, m] : sizes_) {
    entries.push_back({samples, m.seconds, m.spread, m.runs});
  }
  return entries;
}

}  // namespace sluice
