// The gRPC load generator behind `sluice bench --grpc`: KServe v2 ModelInfer calls on gRPC's
// asynchronous client API (one completion queue, one thread), with the HTTP generator's two loops and statistics (see http_load.h):
//
//   closed loop: `concurrency` calls in flight, each followed by the next as soon as it returns;
//                latency = answer - send.
//   open loop:   calls scheduled as a Poisson process at `rate` per second, at most
//                `concurrency` in flight (the rest wait, charged from their scheduled time).
// The calls are spread over several channels (one TCP connection each), as many clients would.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "bench/http_load.h"
#include "sluice/status.h"

namespace sluice {

// "127.0.0.1:8001" from "grpc://127.0.0.1:8001", "http://127.0.0.1:8001" or "127.0.0.1:8001".
Result<std::string> ParseGrpcTarget(std::string_view url);

struct GrpcLoadOptions {
  std::string target;  // host:port.
  std::string model;
  std::string api_key;  // Sent as "authorization: Bearer <key>" when set.
  int samples_per_request = 1;
  bool raw = true;  // raw_input_contents (as Triton's clients send); false: typed contents.
  int concurrency = 1;
  double rate = 0;   // Calls per second (open loop); 0: closed loop.
  int channels = 0;  // 0: one per 16 calls in flight.
  Seconds duration{10};
  Seconds warmup{2};
  uint64_t seed = 1;
};

// Fetches the model's metadata over gRPC, builds one request of random inputs and runs one load
// level. Fails when the server cannot be reached or describes no usable model.
Result<HttpLoadRun> RunGrpcLoad(const GrpcLoadOptions& options);

}  // namespace sluice
