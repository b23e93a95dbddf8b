// KServe v2 JSON request bodies -> tensors, and what parses back out as a response.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "codec/v2_codec.h"
#include "fuzz/fuzz_models.h"

namespace {

void ParseAndEncode(std::string_view body, const sluice::ModelConfig& config) {
  sluice::V2Limits limits;
  limits.max_elements = 1 << 16;
  auto request = sluice::ParseV2InferRequest(body, {}, config, limits);
  if (!request.ok()) {
    // Every refusal is a client error with a message.
    if (request.status().message().empty()) std::abort();
    return;
  }
  if (request->inputs.size() != config.inputs.size()) std::abort();
  // Echo the inputs as outputs where the declared outputs match them, as a model would answer.
  std::vector<sluice::Tensor> outputs;
  for (const auto& spec : config.outputs) {
    for (size_t i = 0; i < config.inputs.size(); ++i) {
      if (config.inputs[i].name == spec.name) outputs.push_back(request->inputs[i]);
    }
  }
  if (outputs.size() == config.outputs.size()) {
    (void)sluice::EncodeV2InferResponse(config, *request, outputs);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const sluice::ModelConfig multi = sluice::fuzz::MultiInputConfig();
  static const sluice::ModelConfig types = sluice::fuzz::TypesConfig();
  std::string_view body(reinterpret_cast<const char*>(data), size);
  ParseAndEncode(body, multi);
  ParseAndEncode(body, types);
  return 0;
}
