// An inference request as the engine sees it: typed tensors, a deadline, and a completion
// callback. Whatever carried the request (HTTP, the in-process benchmark) has parsed it already;
// no JSON and no torch types cross this boundary.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

using RequestId = uint64_t;

// When the request passed each stage (unset stages stay at the epoch).
struct RequestTimes {
  Clock::time_point enqueue;        // Accepted into the model's queue.
  Clock::time_point dispatch;       // Taken from the queue into a batch.
  Clock::time_point compute_start;  // Its batch began running on an instance.
  Clock::time_point compute_end;    // Its outputs were ready.
};

struct InferResponse {
  Status status;                // OK, or why it failed (kDeadlineExceeded, kCancelled, ...).
  std::vector<Tensor> outputs;  // On OK: the model's declared outputs, this request's rows only.
  RequestTimes times;
  uint64_t batch_id = 0;  // Which batch ran it (per model, from 1); 0 if it never ran.
  int batch_size = 0;     // Samples in that batch; 0 if it never ran.
  int instance = -1;      // The model instance that ran it; -1 if it never ran.
};

// Called exactly once per accepted request, on an engine thread (or the thread that cancels or
// stops). It must return quickly and must not call back into the scheduler's Stop().
using InferCallback = std::function<void(InferResponse&&)>;

struct InferRequest {
  // The model's declared inputs in order, each with this request's samples as the leading
  // dimension (the same for every input).
  std::vector<Tensor> inputs;
  // Unset: the model's default timeout (or none), counted from `arrived`. A request still queued
  // at its deadline completes with kDeadlineExceeded and is never run.
  std::optional<Clock::time_point> deadline;
  // When the request's first bytes reached the server (the epoch: not known, and the default
  // timeout counts from Submit()). Time spent reading and decoding it is then inside its deadline:
  // a front that falls behind cannot hand the model requests that have waited out their deadline.
  Clock::time_point arrived{};
  InferCallback done;

  // Set by the engine.
  RequestId id = 0;
  RequestTimes times;
  double predicted_wait_seconds = 0;  // The batcher's raw prediction when it queued the request.

  // Samples in this request: the inputs' leading dimension (0 without inputs).
  int64_t samples() const {
    return inputs.empty() || inputs[0].shape().empty() ? 0 : inputs[0].shape()[0];
  }
};

}  // namespace sluice
