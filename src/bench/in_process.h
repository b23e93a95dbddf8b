// The in-process benchmark: the C++ form of PyTorch's benchmarks/inference server.
//
// A generator thread stamps pre-built batches and enqueues them; a pool of workers, one per
// backend instance and each with its own thread budget, takes them from the queue and runs the
// model; a collector thread records the responses. No HTTP is involved. The engine ceiling runs
// the same instances on the same kind of threads in a tight loop, with no queue at all, so the
// pipeline's cost is the ratio of the two. In both, the warm-up request runs alone before the
// timed ones are sent: its latency is the cold start, and the timed region never opens behind it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bench/stats.h"
#include "bench/utilization.h"
#include "config/model_config.h"
#include "sluice/backend.h"

namespace sluice {

struct InProcessOptions {
  int batch_size = 32;        // Samples per request; 1..max_batch_size.
  int iterations = 100;       // Timed requests after the one warm-up request; >= 1.
  int max_in_flight = 0;      // Requests queued or running at once; 0: 2 x instances, which
                              // keeps every worker fed without an unbounded queue. In the
                              // batched pipeline: the concurrency (clients), >= 1.
  int distinct_payloads = 4;  // Pre-built input batches sent in turn; >= 1.
  uint64_t seed = 0;          // For the random payloads.
};

struct BenchRun {
  std::vector<RequestRecord> records;  // One per request, warm-up included.
  Summary summary;                     // Warm-up separated and excluded.
  UtilizationAverages utilization;     // Over the timed region.
  std::vector<UtilizationSample> utilization_samples;
};

// Runs the pipeline with one worker thread per instance. The instances must not be in use
// elsewhere; each is attached to its worker thread.
Result<BenchRun> RunInProcessPipeline(const ModelConfig& config,
                                      std::span<BackendInstance* const> instances,
                                      const InProcessOptions& options);

// Runs the batched pipeline, exactly as a server drives the engine: a closed loop of
// `max_in_flight` (the concurrency) outstanding requests of `batch_size` samples each (usually 1)
// submitted one by one to a ModelScheduler, whose dynamic batcher groups them per the config's
// max_batch_size and dynamic_batching settings onto the instances. Records carry the batch each
// request ran in, so the summary reports the achieved batch-size distribution. A request the
// scheduler refuses (queue full) is recorded with its error and its slot reused.
Result<BenchRun> RunBatchedPipeline(const ModelConfig& config,
                                    std::span<BackendInstance* const> instances,
                                    const InProcessOptions& options);

// Runs the engine ceiling: each instance on its own thread calls Run() back to back on a
// pre-built batch, together making the same number of requests as the pipeline.
Result<BenchRun> RunEngineCeiling(const ModelConfig& config,
                                  std::span<BackendInstance* const> instances,
                                  const InProcessOptions& options);

// The seed's report lines plus percentiles, e.g. "Throughput (exclude warmup): 334.85 samples/s".
std::string FormatReport(const LoadReport& load, const BenchRun& run);

}  // namespace sluice
