// KServe v2 (Open Inference Protocol) REST bodies <-> typed tensors.
//
// Requests are parsed with simdjson straight into Sluice tensors in the model's declared input
// order; no JSON travels further. Both body forms are supported:
//  - JSON only: each input's "data" holds its values, flat or nested exactly as its shape.
//  - The binary-data extension: the body is a JSON header of `Inference-Header-Content-Length`
//    bytes followed by raw tensor bytes; an input with parameters.binary_data_size takes its bytes
//    from there, in input order. A header length of 0 means the whole body is the raw bytes of a
//    single-input model's only input.
// Responses are written as JSON, or JSON + binary for outputs that ask for binary_data (or all,
// with parameters.binary_data_output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

struct V2Limits {
  int64_t max_elements = int64_t{1} << 28;  // Per input tensor; larger shapes are refused (413).
};

struct V2RequestedOutput {
  std::string name;
  // parameters.binary_data: when given, it decides this output's form whatever the request's
  // binary_data_output says (the binary-data extension); when absent, that decides.
  std::optional<bool> binary;
};

struct V2InferRequest {
  std::string id;                          // Echoed in the response; may be empty.
  std::vector<Tensor> inputs;              // In the model's declared input order.
  std::vector<V2RequestedOutput> outputs;  // Empty: every output.
  bool binary_data_output = false;         // parameters.binary_data_output: all outputs binary.
};

// The spec named `name` (and its position, in `index`), or nullptr.
const TensorSpec* FindTensorSpec(const std::vector<TensorSpec>& specs, std::string_view name,
                                 size_t* index);
// kInvalidArgument unless `datatype` (a v2 name as the client sent it) is the input's datatype,
// saying whether it is a v2 type Sluice cannot hold or no v2 type at all.
Status CheckV2InputDatatype(const TensorSpec& spec, std::string_view datatype);
// Checks a client's shape for an input against the declared one (batch first: rank, fixed
// dimensions) and the limits: kInvalidArgument or kPayloadTooLarge naming the input.
Status CheckV2InputShape(const TensorSpec& spec, const Shape& shape, const V2Limits& limits);

// The spec a client's tensor for input `spec` is read against: `spec` itself or, when the model
// takes an FP32 image (preprocess.image) and the client sends `datatype` UINT8, raw pixels: UINT8
// [height, width, channels] of any size, written into `pixels` and returned.
const TensorSpec& WireSpec(const ModelConfig& config, const TensorSpec& spec,
                           std::string_view datatype, TensorSpec& pixels);
// The tensor the model is given for one parsed under `wire`: itself, or raw pixels resized,
// cropped and normalised as images are (PreprocessPixels), checked against `spec`'s shape.
Result<Tensor> FinishV2Input(const ModelConfig& config, const TensorSpec& spec,
                             const TensorSpec& wire, Tensor parsed);

// Parses a request for `config`'s model. `header` is the JSON part, `binary` the bytes after it
// (empty without the extension). Every problem is kInvalidArgument naming the input and what is
// wrong, or kPayloadTooLarge for tensors over `limits`.
Result<V2InferRequest> ParseV2InferRequest(std::string_view header, std::string_view binary,
                                           const ModelConfig& config, const V2Limits& limits = {});

// The raw-body form: the whole body is the bytes of the model's only input, samples first.
Result<V2InferRequest> ParseV2RawInput(std::string_view body, const ModelConfig& config);

struct V2EncodedResponse {
  std::string body;      // JSON, followed by binary output bytes when there are any.
  size_t json_size = 0;  // Bytes of JSON at the front (Inference-Header-Content-Length).
  bool has_binary = false;
};

// Encodes `outputs` (the model's declared outputs, in order) as a v2 infer response.
Result<V2EncodedResponse> EncodeV2InferResponse(const ModelConfig& config,
                                                const V2InferRequest& request,
                                                const std::vector<Tensor>& outputs);

// Appends `tensor`'s values as a flat JSON array, e.g. "[1,2.5,-3]".
void AppendJsonValues(const Tensor& tensor, std::string& out);

}  // namespace sluice
