// KServe v2 gRPC messages (inference.ModelInferRequest / ModelInferResponse) <-> typed tensors.
//
// Inputs come either as typed `contents` (one repeated field per datatype family) or, as
// Triton's clients send them, as `raw_input_contents`: one bytes entry per input, in input order,
// little-endian and row-major. A request uses one form for all its inputs. Outputs go back in
// the form the inputs came in: raw when the request was raw, typed otherwise (raw for all when an
// output's datatype has no typed field, FP16 and BF16). The checks and messages are the REST
// codec's, so both protocols refuse the same requests with the same words.
#pragma once

#include <string_view>

#include "codec/v2_codec.h"
#include "config/model_config.h"
#include "grpc_predict_v2.pb.h"
#include "sluice/status.h"

namespace sluice {

// Parses a request for `config`'s model (its name and version already resolved by the caller).
// In the result, `binary_data_output` says the outputs go back raw. Every problem is
// kInvalidArgument naming the input and what is wrong, or kPayloadTooLarge for tensors over
// `limits`.
Result<V2InferRequest> ParseGrpcInferRequest(const inference::ModelInferRequest& message,
                                             const ModelConfig& config,
                                             const V2Limits& limits = {});

// Fills `message` with `outputs` (the model's declared outputs, in order) for `request`.
Status EncodeGrpcInferResponse(const ModelConfig& config, const V2InferRequest& request,
                               const std::vector<Tensor>& outputs,
                               inference::ModelInferResponse* message);

// The typed-contents field that carries `dtype` ("fp32_contents", ...); empty for FP16 and BF16,
// which travel only as raw bytes.
std::string_view TypedContentsField(DataType dtype);

}  // namespace sluice
