// Tests for the benchmark statistics on hand-made samples.
#include "bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sluice {
namespace {

Clock::time_point T(double seconds) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(Seconds(seconds)));
}

RequestRecord Record(double request, double response, int samples = 1,
                     StatusCode outcome = StatusCode::kOk) {
  RequestRecord r;
  r.request_time = T(request);
  r.response_time = T(response);
  r.samples = samples;
  r.outcome = outcome;
  return r;
}

TEST(PercentileTest, NearestRankDefinition) {
  std::vector<double> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(NearestRankPercentile(v, 50), 5);  // ceil(0.5 * 10) = 5th value.
  EXPECT_EQ(NearestRankPercentile(v, 90), 9);
  EXPECT_EQ(NearestRankPercentile(v, 95), 10);  // ceil(9.5) = 10th.
  EXPECT_EQ(NearestRankPercentile(v, 99), 10);
  EXPECT_EQ(NearestRankPercentile(v, 0), 1);  // Clamped to the first rank.
  EXPECT_EQ(NearestRankPercentile(v, 100), 10);
  std::vector<double> one{42};
  EXPECT_EQ(NearestRankPercentile(one, 99.9), 42);
}

TEST(PercentileTest, ThousandValues) {
  std::vector<double> v;
  for (int i = 1; i <= 1000; ++i) v.push_back(i);
  EXPECT_EQ(NearestRankPercentile(v, 99), 990);
  EXPECT_EQ(NearestRankPercentile(v, 99.9), 999);
  EXPECT_EQ(NearestRankPercentile(v, 50), 500);
}

TEST(LatencyStatsTest, MeanSampleStdMinMax) {
  LatencyStats s = ComputeLatencyStats({4, 2, 6, 8});  // Unsorted on purpose.
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(s.mean, 5);
  // Sample variance: (1 + 9 + 1 + 9) / 3.
  EXPECT_DOUBLE_EQ(s.std, std::sqrt(20.0 / 3.0));
  EXPECT_EQ(s.min, 2);
  EXPECT_EQ(s.max, 8);
  EXPECT_EQ(s.p50, 4);
  EXPECT_EQ(ComputeLatencyStats({3}).std, 0);
  EXPECT_EQ(ComputeLatencyStats({}).count, 0);
}

TEST(SummarizeTest, WarmupIsTheEarliestRequestAndIsExcluded) {
  // Given out of order: the warm-up (request at 0) is slow.
  std::vector<RequestRecord> records{Record(1.0, 1.5, 4), Record(0.0, 0.9, 4), Record(1.1, 2.0, 4)};
  Summary s = Summarize(records, /*first_is_warmup=*/true);
  ASSERT_TRUE(s.warmup_latency.has_value());
  EXPECT_DOUBLE_EQ(*s.warmup_latency, 0.9);
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.ok_samples, 8);
  EXPECT_DOUBLE_EQ(s.latency.mean, 0.7);  // (0.5 + 0.9) / 2.
  EXPECT_DOUBLE_EQ(s.latency.min, 0.5);
  EXPECT_DOUBLE_EQ(s.latency.max, 0.9);
}

TEST(SummarizeTest, ThroughputIsSamplesOverFirstRequestToLastResponse) {
  // Timed region: first request at 1.0, last response at 3.0 -> 2 s; 3 x 8 samples.
  std::vector<RequestRecord> records{Record(0.0, 0.5, 8), Record(1.0, 2.0, 8), Record(1.5, 3.0, 8),
                                     Record(2.0, 2.5, 8)};
  Summary s = Summarize(records, true);
  EXPECT_DOUBLE_EQ(s.duration_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.samples_per_second, 12.0);
  EXPECT_DOUBLE_EQ(s.requests_per_second, 1.5);
  // Without a warm-up, the first request opens the region: 4 x 8 samples over 3 s.
  Summary all = Summarize(records, false);
  EXPECT_FALSE(all.warmup_latency.has_value());
  EXPECT_DOUBLE_EQ(all.samples_per_second, 32.0 / 3.0);
}

TEST(SummarizeTest, FailuresAreCountedByKindAndKeptOutOfLatencyAndThroughput) {
  std::vector<RequestRecord> records{
      Record(0.0, 0.1), Record(1.0, 1.2, 2), Record(1.0, 1.1, 2, StatusCode::kUnavailable),
      Record(1.0, 3.0, 2, StatusCode::kInternal), Record(1.0, 1.1, 2, StatusCode::kUnavailable)};
  Summary s = Summarize(records, true);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.ok_requests, 1);
  EXPECT_EQ(s.errors.at("unavailable"), 2);
  EXPECT_EQ(s.errors.at("internal"), 1);
  EXPECT_EQ(s.latency.count, 1);
  EXPECT_NEAR(s.latency.mean, 0.2, 1e-9);
  // The failed request still bounds the region (last response at 3.0): 2 samples / 2 s.
  EXPECT_DOUBLE_EQ(s.samples_per_second, 1.0);
}

TEST(SummarizeTest, QueueAndComputeSplitWhenStartIsKnown) {
  RequestRecord a = Record(0.0, 1.0);
  RequestRecord b = Record(1.0, 2.0);
  b.start_time = T(1.25);
  RequestRecord c = Record(1.0, 3.0);
  c.start_time = T(2.0);
  std::vector<RequestRecord> records{a, b, c};
  Summary s = Summarize(records, true);
  EXPECT_DOUBLE_EQ(s.mean_queue_seconds, (0.25 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(s.mean_compute_seconds, (0.75 + 1.0) / 2);
}

TEST(SummarizeTest, BatchDistributionCountsDistinctTimedBatches) {
  auto in_batch = [](double t, uint64_t id, int size) {
    RequestRecord r = Record(t, t + 1);
    r.batch_id = id;
    r.batch_size = size;
    return r;
  };
  // Warm-up alone in batch 1; then batch 2 of 3 requests, batch 3 of 3, batch 4 of 1.
  std::vector<RequestRecord> records{in_batch(0, 1, 1),   in_batch(1, 2, 3), in_batch(1.1, 2, 3),
                                     in_batch(1.2, 2, 3), in_batch(2, 3, 3), in_batch(2.1, 3, 3),
                                     in_batch(2.2, 3, 3), in_batch(3, 4, 1)};
  Summary s = Summarize(records, /*first_is_warmup=*/true);
  EXPECT_EQ(s.batches_by_size, (std::map<int, int64_t>{{1, 1}, {3, 2}}));
  EXPECT_DOUBLE_EQ(s.mean_batch_size, 7.0 / 3.0);
  Summary unbatched = Summarize(std::vector<RequestRecord>{Record(0, 1), Record(1, 2)}, false);
  EXPECT_TRUE(unbatched.batches_by_size.empty());
  EXPECT_EQ(unbatched.mean_batch_size, 0);
}

TEST(SummarizeTest, EmptyAndWarmupOnly) {
  EXPECT_EQ(Summarize({}, true).requests, 0);
  std::vector<RequestRecord> one{Record(0, 1)};
  Summary s = Summarize(one, true);
  EXPECT_EQ(s.requests, 0);
  EXPECT_DOUBLE_EQ(*s.warmup_latency, 1.0);
  EXPECT_EQ(s.samples_per_second, 0);
}

}  // namespace
}  // namespace sluice
