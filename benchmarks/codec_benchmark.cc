// The KServe v2 JSON codec alone, per request: parsing an infer request and encoding its answer,
// for the 16-float identity model's payload and for 1,000 floats (a classifier's logits).
//   BM_ParseV2Request/N:  ParseV2InferRequest on a body of N floats.
//   BM_EncodeV2Response/N: EncodeV2InferResponse of one FP32 output of N values.
// Values are varied (not all integers), so float formatting does its usual work.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <string>

#include "codec/v2_codec.h"

namespace sluice {
namespace {

ModelConfig ConfigOf(int64_t width) {
  ModelConfig config;
  config.name = "identity";
  config.max_batch_size = 64;
  config.inputs.push_back({"input", DataType::kFp32, {width}});
  config.outputs.push_back({"output", DataType::kFp32, {width}});
  return config;
}

float ValueAt(int64_t i) { return static_cast<float>(i) * 0.37f - 3.1f; }

void BM_ParseV2Request(benchmark::State& state) {
  const int64_t n = state.range(0);
  const ModelConfig config = ConfigOf(n);
  std::string body =
      fmt::format(R"({{"inputs":[{{"name":"input","shape":[1,{}],"datatype":"FP32","data":[)", n);
  for (int64_t i = 0; i < n; ++i) body += fmt::format("{}{}", i ? "," : "", ValueAt(i));
  body += "]}]}";
  for (auto _ : state) {
    auto parsed = ParseV2InferRequest(body, {}, config);
    if (!parsed.ok()) state.SkipWithError(parsed.status().message().c_str());
    benchmark::DoNotOptimize(parsed);
  }
}
BENCHMARK(BM_ParseV2Request)->Arg(16)->Arg(1000);

void BM_EncodeV2Response(benchmark::State& state) {
  const int64_t n = state.range(0);
  const ModelConfig config = ConfigOf(n);
  V2InferRequest request;
  Tensor output = Tensor::Uninitialized(DataType::kFp32, {1, n});
  float* values = static_cast<float*>(output.mutable_data());
  for (int64_t i = 0; i < n; ++i) values[i] = ValueAt(i);
  const std::vector<Tensor> outputs = {output};
  for (auto _ : state) {
    auto encoded = EncodeV2InferResponse(config, request, outputs);
    if (!encoded.ok()) state.SkipWithError(encoded.status().message().c_str());
    benchmark::DoNotOptimize(encoded);
  }
}
BENCHMARK(BM_EncodeV2Response)->Arg(16)->Arg(1000);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
