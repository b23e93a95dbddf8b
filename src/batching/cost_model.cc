#include "batching/cost_model.h"

#include <iterator>

namespace sluice {

void BatchCostModel::Observe(int samples, double seconds) {
  if (samples <= 0 || !(seconds > 0)) return;
  MutexLock lock(mu_);
  auto [it, inserted] = sizes_.try_emplace(samples, seconds, 1);
  if (!inserted) {
    auto& [mean, runs] = it->second;
    mean += kWeight * (seconds - mean);
    ++runs;
  }
}

double BatchCostModel::Estimate(int samples) const {
  MutexLock lock(mu_);
  return EstimateLocked(samples);
}

double BatchCostModel::PerSample(int samples) const {
  if (samples <= 0) return 0;
  return Estimate(samples) / samples;
}

double BatchCostModel::EstimateLocked(int samples) const {
  if (sizes_.empty() || samples <= 0) return 0;
  auto above = sizes_.lower_bound(samples);
  if (above != sizes_.end() && above->first == samples) return above->second.first;
  if (above == sizes_.begin()) return above->second.first;  // Below the smallest observed.
  auto below = std::prev(above);
  if (above == sizes_.end()) {  // Above the largest: its time per sample.
    return below->second.first * samples / below->first;
  }
  const double t = static_cast<double>(samples - below->first) / (above->first - below->first);
  return below->second.first + t * (above->second.first - below->second.first);
}

int BatchCostModel::BestSize(int limit) const {
  MutexLock lock(mu_);
  if (sizes_.empty()) return limit;
  int best = 0;
  double best_cost = 0;
  for (const auto& [samples, entry] : sizes_) {
    if (samples > limit) break;
    // One run is one noisy sample: a size is chosen on at least kExploreRuns, except the limit
    // (which must stay a candidate, or a size chosen below it would never let it run again).
    if (entry.second < kExploreRuns && samples != limit && sizes_.size() > 1) continue;
    const double cost = entry.first / samples;
    if (best == 0 || cost <= best_cost) {
      best = samples;
      best_cost = cost;
    }
  }
  // The limit itself, estimated if never run: above the largest size run it costs that size's
  // time per sample, a tie that the larger size wins, so batches grow until it has been measured.
  if (!sizes_.count(limit) && (best == 0 || EstimateLocked(limit) / limit <= best_cost)) {
    best = limit;
  }
  return best;
}

int BatchCostModel::SizeToExplore(int below) const {
  MutexLock lock(mu_);
  for (int size = 1; size < below; size *= 2) {
    auto it = sizes_.find(size);
    if (it == sizes_.end() || it->second.second < kExploreRuns) {
      // The largest such power of two: nearest the chosen size, where the choice is made.
      int largest = size;
      for (int next = size * 2; next < below; next *= 2) {
        auto n = sizes_.find(next);
        if (n == sizes_.end() || n->second.second < kExploreRuns) largest = next;
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
  for (const auto& [samples, entry] : sizes_) {
    entries.push_back({samples, entry.first, entry.second});
  }
  return entries;
}

}  // namespace sluice
