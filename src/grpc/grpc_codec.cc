// KServe v2 gRPC infer messages <-> tensors.
#include "grpc/grpc_codec.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "common/json_writer.h"

namespace sluice {
namespace {

using inference::InferTensorContents;

Status Invalid(std::string message) { return Status::InvalidArgument(std::move(message)); }

// Copies a repeated field into `tensor`, checking each value fits the tensor's type.
template <typename T, typename Field>
Status CopyChecked(const Field& values, std::string_view input, Tensor& tensor) {
  T* out = tensor.mutable_values<T>().data();
  for (int i = 0; i < values.size(); ++i) {
    const auto v = values.Get(i);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!std::in_range<T>(v)) {
        return Invalid(fmt::format("input '{}': value {} at {} is out of range for {}", input, v, i,
                                   DataTypeName(tensor.dtype())));
      }
    }
    out[i] = static_cast<T>(v);
  }
  return Status::Ok();
}

// The number of values `contents` holds for `dtype`'s field.
int TypedCount(const InferTensorContents& c, DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return c.bool_contents_size();
    case DataType::kUInt8:
      return c.uint_contents_size();
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
      return c.int_contents_size();
    case DataType::kInt64:
      return c.int64_contents_size();
    case DataType::kFp32:
      return c.fp32_contents_size();
    case DataType::kFp64:
      return c.fp64_contents_size();
    case DataType::kFp16:
    case DataType::kBf16:
      return 0;
  }
  return 0;
}

Status FillTyped(const InferTensorContents& c, std::string_view input, Tensor& tensor) {
  switch (tensor.dtype()) {
    case DataType::kBool:
      return CopyChecked<bool>(c.bool_contents(), input, tensor);
    case DataType::kUInt8:
      return CopyChecked<uint8_t>(c.uint_contents(), input, tensor);
    case DataType::kInt8:
      return CopyChecked<int8_t>(c.int_contents(), input, tensor);
    case DataType::kInt16:
      return CopyChecked<int16_t>(c.int_contents(), input, tensor);
    case DataType::kInt32:
      return CopyChecked<int32_t>(c.int_contents(), input, tensor);
    case DataType::kInt64:
      return CopyChecked<int64_t>(c.int64_contents(), input, tensor);
    case DataType::kFp32:
      std::memcpy(tensor.mutable_data(), c.fp32_contents().data(), tensor.byte_size());
      return Status::Ok();
    case DataType::kFp64:
      std::memcpy(tensor.mutable_data(), c.fp64_contents().data(), tensor.byte_size());
      return Status::Ok();
    case DataType::kFp16:
    case DataType::kBf16:
      break;
  }
  return Status::Internal("no typed contents for this datatype");
}

template <typename T, typename Field>
void AppendValues(const Tensor& tensor, Field* field) {
  auto values = tensor.values<T>();
  field->Reserve(static_cast<int>(values.size()));
  for (T v : values) field->AddAlreadyReserved(v);
}

void WriteTyped(const Tensor& tensor, InferTensorContents* c) {
  switch (tensor.dtype()) {
    case DataType::kBool:
      AppendValues<bool>(tensor, c->mutable_bool_contents());
      break;
    case DataType::kUInt8:
      AppendValues<uint8_t>(tensor, c->mutable_uint_contents());
      break;
    case DataType::kInt8:
      AppendValues<int8_t>(tensor, c->mutable_int_contents());
      break;
    case DataType::kInt16:
      AppendValues<int16_t>(tensor, c->mutable_int_contents());
      break;
    case DataType::kInt32:
      AppendValues<int32_t>(tensor, c->mutable_int_contents());
      break;
    case DataType::kInt64:
      AppendValues<int64_t>(tensor, c->mutable_int64_contents());
      break;
    case DataType::kFp32:
      AppendValues<float>(tensor, c->mutable_fp32_contents());
      break;
    case DataType::kFp64:
      AppendValues<double>(tensor, c->mutable_fp64_contents());
      break;
    case DataType::kFp16:
    case DataType::kBf16:
      break;  // Never typed (see EncodeGrpcInferResponse).
  }
}

}  // namespace

std::string_view TypedContentsField(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return "bool_contents";
    case DataType::kUInt8:
      return "uint_contents";
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
      return "int_contents";
    case DataType::kInt64:
      return "int64_contents";
    case DataType::kFp32:
      return "fp32_contents";
    case DataType::kFp64:
      return "fp64_contents";
    case DataType::kFp16:
    case DataType::kBf16:
      return "";
  }
  return "";
}

Result<V2InferRequest> ParseGrpcInferRequest(const inference::ModelInferRequest& message,
                                             const ModelConfig& config, const V2Limits& limits) {
  V2InferRequest request;
  request.id = message.id();
  const bool raw = message.raw_input_contents_size() > 0;
  request.binary_data_output = raw;
  if (message.inputs_size() == 0) return Invalid("the request has no inputs");
  if (raw && message.raw_input_contents_size() != message.inputs_size()) {
    return Invalid(fmt::format("raw_input_contents holds {} entries for {} inputs",
                               message.raw_input_contents_size(), message.inputs_size()));
  }
  request.inputs.resize(config.inputs.size());
  std::vector<bool> seen(config.inputs.size(), false);
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& input = message.inputs(i);
    size_t index;
    const TensorSpec* spec = FindTensorSpec(config.inputs, input.name(), &index);
    if (!spec) {
      return Invalid(
          fmt::format("model '{}' has no input {}", config.name, JsonQuote(input.name())));
    }
    if (seen[index]) return Invalid(fmt::format("input '{}' is given twice", spec->name));
    seen[index] = true;
    TensorSpec pixels;
    const TensorSpec& wire = WireSpec(config, *spec, input.datatype(), pixels);
    SLUICE_RETURN_IF_ERROR(CheckV2InputDatatype(wire, input.datatype()));
    if (input.shape_size() > 16) {
      return Invalid(fmt::format("input '{}': shape has over 16 dims", spec->name));
    }
    Shape shape(input.shape().begin(), input.shape().end());
    for (int64_t d : shape) {
      if (d < 0) {
        return Invalid(
            fmt::format("input '{}': shape must hold non-negative integers", spec->name));
      }
    }
    SLUICE_RETURN_IF_ERROR(CheckV2InputShape(wire, shape, limits));
    const int64_t count = *ElementCount(shape);
    const size_t bytes = static_cast<size_t>(count) * DataTypeSize(wire.datatype);
    if (raw) {
      if (input.has_contents()) {
        return Invalid(fmt::format(
            "input '{}': has typed contents, but the request uses raw_input_contents; use one "
            "form for every input",
            spec->name));
      }
      const std::string& data = message.raw_input_contents(i);
      if (data.size() != bytes) {
        return Invalid(fmt::format(
            "input '{}': raw_input_contents holds {} bytes, shape {} of {} "
            "needs {}",
            spec->name, data.size(), ShapeToString(shape), DataTypeName(wire.datatype), bytes));
      }
      Tensor tensor = Tensor::Uninitialized(wire.datatype, shape);
      if (bytes > 0) std::memcpy(tensor.mutable_data(), data.data(), bytes);
      auto finished = FinishV2Input(config, *spec, wire, std::move(tensor));
      if (!finished.ok()) return finished.status();
      request.inputs[index] = std::move(*finished);
      continue;
    }
    const std::string_view field = TypedContentsField(wire.datatype);
    if (field.empty()) {
      return Invalid(
          fmt::format("input '{}': {} has no typed contents field; send its bytes in "
                      "raw_input_contents",
                      spec->name, DataTypeName(wire.datatype)));
    }
    const int given = TypedCount(input.contents(), wire.datatype);
    if (given != count) {
      return Invalid(fmt::format("input '{}': contents.{} holds {} values, shape {} needs {}",
                                 spec->name, field, given, ShapeToString(shape), count));
    }
    Tensor tensor = Tensor::Uninitialized(wire.datatype, shape);
    SLUICE_RETURN_IF_ERROR(FillTyped(input.contents(), spec->name, tensor));
    auto finished = FinishV2Input(config, *spec, wire, std::move(tensor));
    if (!finished.ok()) return finished.status();
    request.inputs[index] = std::move(*finished);
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) return Invalid(fmt::format("input '{}' is missing", config.inputs[i].name));
  }
  for (const auto& output : message.outputs()) {
    size_t index;
    if (!FindTensorSpec(config.outputs, output.name(), &index)) {
      return Invalid(
          fmt::format("model '{}' has no output {}", config.name, JsonQuote(output.name())));
    }
    request.outputs.push_back(V2RequestedOutput{output.name(), std::nullopt});
  }
  return request;
}

Status EncodeGrpcInferResponse(const ModelConfig& config, const V2InferRequest& request,
                               const std::vector<Tensor>& outputs,
                               inference::ModelInferResponse* message) {
  if (outputs.size() != config.outputs.size()) {
    return Status::Internal(fmt::format("model '{}' returned {} outputs, its config declares {}",
                                        config.name, outputs.size(), config.outputs.size()));
  }
  std::vector<size_t> chosen;
  if (request.outputs.empty()) {
    for (size_t i = 0; i < outputs.size(); ++i) chosen.push_back(i);
  } else {
    for (const V2RequestedOutput& r : request.outputs) {
      size_t index = 0;
      FindTensorSpec(config.outputs, r.name, &index);
      chosen.push_back(index);
    }
  }
  // The protocol allows raw or typed, not both: any output without a typed field makes all raw.
  bool raw = request.binary_data_output;
  for (size_t index : chosen) raw = raw || TypedContentsField(outputs[index].dtype()).empty();
  message->set_model_name(config.name);
  message->set_model_version("1");
  if (!request.id.empty()) message->set_id(request.id);
  for (size_t index : chosen) {
    const Tensor& tensor = outputs[index];
    auto* out = message->add_outputs();
    out->set_name(config.outputs[index].name);
    out->set_datatype(std::string(DataTypeName(tensor.dtype())));
    for (int64_t d : tensor.shape()) out->add_shape(d);
    if (raw) {
      message->add_raw_output_contents()->assign(static_cast<const char*>(tensor.data()),
                                                 tensor.byte_size());
    } else {
      WriteTyped(tensor, out->mutable_contents());
    }
  }
  return Status::Ok();
}

}  // namespace sluice
