// The gRPC load generator behind `sluice bench --grpc`: KServe v2 ModelInfer calls driven from one
// thread, with the HTTP generator's two loops and statistics (see http_load.h):
//
//   closed loop: `concurrency` calls in flight, each followed by the next as soon as it returns;
//                latency = answer - send.
//   open loop:   calls scheduled as a Poisson process at `rate` per second, at most
//                `concurrency` in flight (the rest wait, charged from their scheduled time).
// The calls are spread over several channels (one TCP connection each), as many clients would.
// Two clients send them:
//   h2:     gRPC's wire format (length-prefixed messages, the status in the trailers) on nghttp2's
//           HTTP/2 framing over Asio sockets: a third to a half of gRPC C++'s CPU a call, which
//           on a machine shared with the server is CPU the server gets back.
//   grpc++: gRPC C++'s asynchronous client API on one completion queue, as gRPC applications call.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "bench/http_load.h"
#include "sluice/status.h"

namespace sluice {

// "127.0.0.1:8001" from "grpc://127.0.0.1:8001", "http://127.0.0.1:8001" or "127.0.0.1:8001".
Result<std::string> ParseGrpcTarget(std::string_view url);

enum class GrpcClient { kH2, kGrpcCpp };

// "h2" or "grpc++".
Result<GrpcClient> ParseGrpcClient(std::string_view name);

struct GrpcLoadOptions {
  std::string target;  // host:port.
  std::string model;
  std::string api_key;  // Sent as "authorization: Bearer <key>" when set.
  int samples_per_request = 1;
  bool raw = true;  // raw_input_contents (as Triton's clients send); false: typed contents.
  int concurrency = 1;
  double rate = 0;   // Calls per second (open loop); 0: closed loop.
  int channels = 0;  // 0: one per 16 calls in flight.
  GrpcClient client = GrpcClient::kH2;
  Seconds duration{10};
  Seconds warmup{2};
  uint64_t seed = 1;
};

// Fetches the model's metadata over gRPC, builds one request of random inputs and runs one load
// level. Fails when the server cannot be reached or describes no usable model.
Result<HttpLoadRun> RunGrpcLoad(const GrpcLoadOptions& options);

}  // namespace sluice
