// What a batch costs on one instance of a model, learned from the batches it runs.
//
// Per batch size, an exponentially weighted mean of the measured seconds (each new run weighs
// kWeight), seeded by the warm-up runs, and likewise the mean distance of a run from that mean
// (its spread): a slow run is the mean plus kSlowSpreads spreads, about the 95th percentile of
// the runs' times (2 mean deviations are 1.6 standard deviations of a normal distribution), so
// that a batch that must end by a deadline is judged on how long it may take, not on its average
// (under a CPU shared with other tenants, batches of one size took 50-120 ms, 54 on average). The
// first run at a size is cold (a new shape builds its kernels' plans, and may take many times
// longer): the second run replaces it, and while a size has only that cold run, it counts for
// nothing once any warm figure is known. Sizes not known are estimated from their neighbours:
// linearly between two known sizes, the smallest known size's time below it, and the largest's time
// per sample above it. The batcher uses it to choose the batch size with the lowest cost per sample
// and to judge whether waiting for company pays.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace sluice {

// Thread-safe.
class BatchCostModel {
 public:
  static constexpr double kWeight = 0.2;
  static constexpr double kSlowSpreads = 2.0;

  // Records a batch of `samples` that ran in `seconds` (ignored unless both are positive).
  void Observe(int samples, double seconds);
  // Records a warm run (a warm-up's last), replacing what was known of that size.
  void Seed(int samples, double seconds);

  // Expected seconds of a batch of `samples`; 0 while nothing has been observed.
  double Estimate(int samples) const;
  // Seconds a slow batch of `samples` takes (the estimate plus kSlowSpreads spreads); 0 while
  // nothing has been observed.
  double EstimateSlow(int samples) const;

  // Expected seconds per sample at `samples`; 0 while nothing has been observed.
  double PerSample(int samples) const;

  // The largest size at most `limit` expected to run in at most `seconds` (costs growing with the
  // size); 1 when none is, `limit` while nothing is known.
  int LargestWithin(double seconds, int limit) const;

  // Whether a batch of `samples` has run (or been seeded).
  bool HasRun(int samples) const;
  // The largest size at most `samples` that has run, or 0.
  int LargestRunAtMost(int samples) const;

  // Of the sizes with a warm figure (any, while only one size is known), at most `limit`, and
  // `limit` itself (measured or, if never run warm, estimated), the one with the lowest seconds
  // per sample (the largest such on a tie); `limit` when nothing has been observed.
  int BestSize(int limit) const;

  // A power of two below `below` with no warm figure yet (the largest such), or 0: the batcher
  // runs one such batch now and then, so that sizes it would never pick by itself get measured
  // (a batch of 64 may be slower per sample than one of 32).
  int SizeToExplore(int below) const;

  // (batch size, smoothed seconds, their spread, batches observed) for every size observed,
  // ascending.
  struct Entry {
    int samples;
    double seconds;
    double spread;
    int64_t batches;
  };
  std::vector<Entry> Snapshot() const;

 private:
  struct Measured {
    double seconds;
    int64_t runs;
    bool warm;          // Seeded, or run more than once.
    double spread = 0;  // Smoothed |run - seconds|, over the runs after the first warm one.
  };
  // `slow`: the slow run's seconds instead of the mean.
  double EstimateLocked(int samples, bool slow = false) const REQUIRES(mu_);
  bool TrustedLocked(const Measured& m) const REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<int, Measured> sizes_ GUARDED_BY(mu_);  // By batch size.
  bool any_warm_ GUARDED_BY(mu_) = false;
};

}  // namespace sluice
