// The binary-data extension: a JSON header of Inference-Header-Content-Length bytes followed by
// raw tensor bytes, and the raw-body form (header length 0).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "codec/v2_codec.h"
#include "fuzz/fuzz_models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const sluice::ModelConfig multi = sluice::fuzz::MultiInputConfig();
  static const sluice::ModelConfig echo = sluice::fuzz::EchoConfig();
  if (size < 2) return 0;
  // The first two bytes say where the JSON header ends, as the HTTP header would.
  size_t header_length = (size_t{data[0]} << 8 | data[1]) % (size - 1);
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::string_view header = rest.substr(0, header_length);
  std::string_view binary = rest.substr(header_length);
  sluice::V2Limits limits;
  limits.max_elements = 1 << 16;
  auto request = sluice::ParseV2InferRequest(header, binary, multi, limits);
  if (request.ok()) {
    if (request->inputs.size() != multi.inputs.size()) std::abort();
    (void)sluice::EncodeV2InferResponse(multi, *request, {request->inputs[0], request->inputs[1]});
  }
  auto raw = sluice::ParseV2RawInput(rest, echo);
  if (raw.ok() && raw->inputs.at(0).byte_size() != rest.size()) std::abort();
  return 0;
}
