// KServe v2 request parsing (simdjson DOM) and response encoding.
#include "codec/v2_codec.h"

#include <fmt/compile.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "codec/image.h"
#include "common/half.h"
#include "common/json_writer.h"

namespace sluice {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

Status Invalid(std::string message) { return Status::InvalidArgument(std::move(message)); }

// Writes JSON scalars into a tensor of one datatype, in order, checking each value's type and
// range.
class ValueWriter {
 public:
  ValueWriter(Tensor& tensor, std::string_view input) : tensor_(tensor), input_(input) {}

  Status Put(element value) {
    if (index_ >= tensor_.element_count()) {
      return Invalid(
          fmt::format("input '{}': data holds more than the {} elements its shape "
                      "declares",
                      input_, tensor_.element_count()));
    }
    switch (tensor_.dtype()) {
      case DataType::kBool: {
        bool b;
        if (value.get_bool().get(b)) return TypeError(value, "true or false");
        Store<uint8_t>(b ? 1 : 0);
        return Status::Ok();
      }
      case DataType::kUInt8:
        return PutInteger<uint8_t>(value);
      case DataType::kInt8:
        return PutInteger<int8_t>(value);
      case DataType::kInt16:
        return PutInteger<int16_t>(value);
      case DataType::kInt32:
        return PutInteger<int32_t>(value);
      case DataType::kInt64:
        return PutInteger<int64_t>(value);
      case DataType::kFp16:
      case DataType::kBf16:
      case DataType::kFp32: {
        double d;
        if (value.get_double().get(d)) return TypeError(value, "a number");
        if (std::fabs(d) > std::numeric_limits<float>::max()) return RangeError(d);
        float f = static_cast<float>(d);
        if (tensor_.dtype() == DataType::kFp32) {
          Store<float>(f);
        } else {
          Store<uint16_t>(tensor_.dtype() == DataType::kFp16 ? FloatToHalf(f) : FloatToBf16(f));
        }
        return Status::Ok();
      }
      case DataType::kFp64: {
        double d;
        if (value.get_double().get(d)) return TypeError(value, "a number");
        Store<double>(d);
        return Status::Ok();
      }
    }
    return Status::Internal("unhandled datatype");
  }

  int64_t written() const { return index_; }

 private:
  template <typename T>
  void Store(T v) {
    static_cast<T*>(tensor_.mutable_data())[index_++] = v;
  }

  template <typename T>
  Status PutInteger(element value) {
    int64_t i;
    if (value.type() != element_type::INT64 || value.get_int64().get(i)) {
      if (value.type() == element_type::UINT64) return RangeError(value.get_double().value());
      return TypeError(value, "an integer");
    }
    if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) {
      return RangeError(static_cast<double>(i));
    }
    Store<T>(static_cast<T>(i));
    return Status::Ok();
  }

  Status TypeError(element value, std::string_view expected) {
    return Invalid(fmt::format("input '{}': data element {} is {}, expected {} for {}", input_,
                               index_, TypeName(value), expected, DataTypeName(tensor_.dtype())));
  }
  Status RangeError(double v) {
    return Invalid(fmt::format("input '{}': data element {} ({}) is out of range for {}", input_,
                               index_, v, DataTypeName(tensor_.dtype())));
  }
  static std::string_view TypeName(element value) {
    switch (value.type()) {
      case element_type::ARRAY:
        return "an array";
      case element_type::OBJECT:
        return "an object";
      case element_type::STRING:
        return "a string";
      case element_type::BOOL:
        return "a boolean";
      case element_type::NULL_VALUE:
        return "null";
      default:
        return "a number";
    }
  }

  Tensor& tensor_;
  std::string_view input_;
  int64_t index_ = 0;
};

// Fills from "data": a flat array of every element, or arrays nested exactly as `shape`.
Status FillFromJson(element data, const Shape& shape, std::string_view input, Tensor& tensor) {
  simdjson::dom::array top;
  if (data.get_array().get(top)) {
    return Invalid(fmt::format("input '{}': \"data\" must be an array", input));
  }
  ValueWriter writer(tensor, input);
  const bool flat = top.size() == 0 || (*top.begin()).type() != element_type::ARRAY;
  if (flat) {
    for (element value : top) SLUICE_RETURN_IF_ERROR(writer.Put(value));
  } else {
    // Iterative walk, one stack frame per dimension; depth is bounded by the shape's rank.
    struct Frame {
      simdjson::dom::array::iterator it, end;
    };
    std::vector<Frame> stack;
    if (static_cast<int64_t>(top.size()) != shape[0]) {
      return Invalid(
          fmt::format("input '{}': \"data\" has {} entries at depth 0, shape {} "
                      "needs {}",
                      input, top.size(), ShapeToString(shape), shape[0]));
    }
    stack.push_back({top.begin(), top.end()});
    while (!stack.empty()) {
      Frame& frame = stack.back();
      if (frame.it == frame.end) {
        stack.pop_back();
        continue;
      }
      element value = *frame.it;
      ++frame.it;
      const size_t depth = stack.size();  // Depth of `value`.
      if (depth < shape.size()) {
        simdjson::dom::array inner;
        if (value.get_array().get(inner) || static_cast<int64_t>(inner.size()) != shape[depth]) {
          return Invalid(fmt::format(
              "input '{}': \"data\" does not match shape {} at depth {} (ragged or mis-nested)",
              input, ShapeToString(shape), depth));
        }
        stack.push_back({inner.begin(), inner.end()});
      } else {
        if (value.type() == element_type::ARRAY) {
          return Invalid(fmt::format("input '{}': \"data\" is nested deeper than shape {}", input,
                                     ShapeToString(shape)));
        }
        SLUICE_RETURN_IF_ERROR(writer.Put(value));
      }
    }
  }
  if (writer.written() != tensor.element_count()) {
    return Invalid(fmt::format("input '{}': data holds {} elements, shape {} needs {}", input,
                               writer.written(), ShapeToString(shape), tensor.element_count()));
  }
  return Status::Ok();
}

Result<Shape> ReadShape(element value, std::string_view input) {
  simdjson::dom::array dims;
  if (value.get_array().get(dims)) {
    return Invalid(fmt::format("input '{}': \"shape\" must be an array of integers", input));
  }
  Shape shape;
  for (element dim : dims) {
    int64_t d;
    if (dim.type() != element_type::INT64 || dim.get_int64().get(d) || d < 0) {
      return Invalid(fmt::format("input '{}': \"shape\" must hold non-negative integers", input));
    }
    shape.push_back(d);
    if (shape.size() > 16) return Invalid(fmt::format("input '{}': shape has over 16 dims", input));
  }
  return shape;
}

Result<bool> ReadBool(element value, std::string_view what) {
  bool b;
  if (value.get_bool().get(b)) return Invalid(fmt::format("\"{}\" must be true or false", what));
  return b;
}

}  // namespace

const TensorSpec* FindTensorSpec(const std::vector<TensorSpec>& specs, std::string_view name,
                                 size_t* index) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) {
      *index = i;
      return &specs[i];
    }
  }
  return nullptr;
}

Status CheckV2InputDatatype(const TensorSpec& spec, std::string_view datatype) {
  if (!ParseDataType(datatype)) {
    const bool known =
        datatype == "BYTES" || datatype == "UINT16" || datatype == "UINT32" || datatype == "UINT64";
    return Invalid(
        fmt::format("input '{}': datatype {} {}", spec.name, JsonQuote(datatype),
                    known ? "is a KServe v2 type that libtorch tensors cannot hold, so Sluice does "
                            "not accept it"
                          : "is not a KServe v2 datatype"));
  }
  if (datatype != DataTypeName(spec.datatype)) {
    return Invalid(fmt::format("input '{}': datatype {} does not match the model's {}", spec.name,
                               JsonQuote(datatype), DataTypeName(spec.datatype)));
  }
  return Status::Ok();
}

Status CheckV2InputShape(const TensorSpec& spec, const Shape& shape, const V2Limits& limits) {
  bool ok = shape.size() == spec.shape.size() + 1;
  for (size_t d = 0; ok && d < spec.shape.size(); ++d) {
    ok = spec.shape[d] < 0 || shape[d + 1] == spec.shape[d];
  }
  if (!ok) {
    Shape expected = spec.shape;
    expected.insert(expected.begin(), -1);
    return Invalid(fmt::format("input '{}': shape {} does not match the model's {}", spec.name,
                               ShapeToString(shape), ShapeToString(expected)));
  }
  auto count = ElementCount(shape);
  if (!count) {
    return Invalid(fmt::format("input '{}': shape {} overflows", spec.name, ShapeToString(shape)));
  }
  if (*count > limits.max_elements) {
    return Status::PayloadTooLarge(fmt::format("input '{}': shape {} has {} elements, limit {}",
                                               spec.name, ShapeToString(shape), *count,
                                               limits.max_elements));
  }
  return Status::Ok();
}

const TensorSpec& WireSpec(const ModelConfig& config, const TensorSpec& spec,
                           std::string_view datatype, TensorSpec& pixels) {
  if (!config.preprocess_image || spec.datatype != DataType::kFp32 || datatype != "UINT8" ||
      config.inputs.size() != 1) {
    return spec;
  }
  pixels = TensorSpec{spec.name, DataType::kUInt8, {-1, -1, config.preprocess_image->channels}};
  return pixels;
}

Result<Tensor> FinishV2Input(const ModelConfig& config, const TensorSpec& spec,
                             const TensorSpec& wire, Tensor parsed) {
  if (&wire == &spec) return parsed;
  auto tensor = PreprocessPixels(parsed, *config.preprocess_image);
  if (!tensor.ok()) {
    return Invalid(fmt::format("input '{}': {}", spec.name, tensor.status().message()));
  }
  Shape sample(tensor->shape().begin() + 1, tensor->shape().end());
  bool fits = sample.size() == spec.shape.size();
  for (size_t d = 0; fits && d < sample.size(); ++d) {
    fits = spec.shape[d] < 0 || spec.shape[d] == sample[d];
  }
  if (!fits) {
    return Invalid(fmt::format("input '{}': the preprocessed pixels are {} but the model takes {}",
                               spec.name, ShapeToString(sample), ShapeToString(spec.shape)));
  }
  return tensor;
}

Result<V2InferRequest> ParseV2InferRequest(std::string_view header, std::string_view binary,
                                           const ModelConfig& config, const V2Limits& limits) {
  thread_local simdjson::dom::parser parser;
  element doc;
  if (auto error = parser.parse(header.data(), header.size()).get(doc)) {
    return Invalid(fmt::format("malformed JSON: {}", simdjson::error_message(error)));
  }
  simdjson::dom::object root;
  if (doc.get_object().get(root)) return Invalid("the request body must be a JSON object");

  V2InferRequest request;
  request.inputs.resize(config.inputs.size());
  std::vector<bool> seen(config.inputs.size(), false);
  size_t binary_offset = 0;
  bool has_inputs = false;

  for (auto [key, value] : root) {
    if (key == "id") {
      std::string_view id;
      if (value.get_string().get(id)) return Invalid("\"id\" must be a string");
      request.id = std::string(id);
    } else if (key == "parameters") {
      simdjson::dom::object params;
      if (value.get_object().get(params)) return Invalid("\"parameters\" must be an object");
      element flag;
      if (!params["binary_data_output"].get(flag)) {
        auto b = ReadBool(flag, "parameters.binary_data_output");
        if (!b.ok()) return b.status();
        request.binary_data_output = *b;
      }
    } else if (key == "outputs") {
      simdjson::dom::array outputs;
      if (value.get_array().get(outputs)) return Invalid("\"outputs\" must be an array");
      for (element output : outputs) {
        std::string_view name;
        if (output["name"].get_string().get(name)) {
          return Invalid("each requested output needs a \"name\" string");
        }
        size_t index;
        if (!FindTensorSpec(config.outputs, name, &index)) {
          return Status::InvalidArgument(
              fmt::format("model '{}' has no output {}", config.name, JsonQuote(name)));
        }
        V2RequestedOutput requested{std::string(name), std::nullopt};
        element flag;
        if (!output["parameters"]["binary_data"].get(flag)) {
          auto b = ReadBool(flag, "parameters.binary_data");
          if (!b.ok()) return b.status();
          requested.binary = *b;
        }
        request.outputs.push_back(std::move(requested));
      }
    } else if (key == "inputs") {
      has_inputs = true;
      simdjson::dom::array inputs;
      if (value.get_array().get(inputs)) return Invalid("\"inputs\" must be an array");
      for (element input : inputs) {
        simdjson::dom::object fields;
        if (input.get_object().get(fields)) return Invalid("each input must be an object");
        std::string_view name, datatype;
        if (fields["name"].get_string().get(name)) return Invalid("an input has no \"name\"");
        size_t index;
        const TensorSpec* spec = FindTensorSpec(config.inputs, name, &index);
        if (!spec) {
          return Invalid(fmt::format("model '{}' has no input {}", config.name, JsonQuote(name)));
        }
        if (seen[index]) return Invalid(fmt::format("input '{}' is given twice", spec->name));
        seen[index] = true;
        if (fields["datatype"].get_string().get(datatype)) {
          return Invalid(fmt::format("input '{}': \"datatype\" is missing", spec->name));
        }
        TensorSpec pixels;
        const TensorSpec& wire = WireSpec(config, *spec, datatype, pixels);
        SLUICE_RETURN_IF_ERROR(CheckV2InputDatatype(wire, datatype));
        element shape_value;
        if (fields["shape"].get(shape_value)) {
          return Invalid(fmt::format("input '{}': \"shape\" is missing", spec->name));
        }
        auto shape = ReadShape(shape_value, spec->name);
        if (!shape.ok()) return shape.status();
        SLUICE_RETURN_IF_ERROR(CheckV2InputShape(wire, *shape, limits));
        const int64_t count = *ElementCount(*shape);
        const size_t bytes = static_cast<size_t>(count) * DataTypeSize(wire.datatype);

        element size_value;
        if (!fields["parameters"]["binary_data_size"].get(size_value)) {
          uint64_t size;
          if (size_value.get_uint64().get(size)) {
            return Invalid(
                fmt::format("input '{}': binary_data_size must be a non-negative "
                            "integer",
                            spec->name));
          }
          if (size != bytes) {
            return Invalid(fmt::format(
                "input '{}': binary_data_size {} but shape {} of {} needs "
                "{} bytes",
                spec->name, size, ShapeToString(*shape), DataTypeName(wire.datatype), bytes));
          }
          if (binary.size() - binary_offset < size) {
            return Invalid(
                fmt::format("input '{}': the body holds {} binary bytes after the "
                            "JSON header, {} needed",
                            spec->name, binary.size() - binary_offset, size));
          }
          Tensor tensor = Tensor::Uninitialized(wire.datatype, *shape);
          std::memcpy(tensor.mutable_data(), binary.data() + binary_offset, bytes);
          binary_offset += size;
          auto finished = FinishV2Input(config, *spec, wire, std::move(tensor));
          if (!finished.ok()) return finished.status();
          request.inputs[index] = std::move(*finished);
        } else {
          element data;
          if (fields["data"].get(data)) {
            return Invalid(
                fmt::format("input '{}': neither \"data\" nor "
                            "parameters.binary_data_size is given",
                            spec->name));
          }
          // Each JSON value takes at least one byte of the header: a cheap bound that stops a
          // shape claiming billions of elements before anything is allocated.
          if (static_cast<uint64_t>(count) > header.size()) {
            return Invalid(
                fmt::format("input '{}': shape {} claims {} elements, more than the "
                            "request holds",
                            spec->name, ShapeToString(*shape), count));
          }
          Tensor tensor = Tensor::Uninitialized(wire.datatype, *shape);
          SLUICE_RETURN_IF_ERROR(FillFromJson(data, *shape, spec->name, tensor));
          auto finished = FinishV2Input(config, *spec, wire, std::move(tensor));
          if (!finished.ok()) return finished.status();
          request.inputs[index] = std::move(*finished);
        }
      }
    }
    // Other keys are ignored, as the protocol allows extensions.
  }
  if (!has_inputs) return Invalid("the request has no \"inputs\"");
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) return Invalid(fmt::format("input '{}' is missing", config.inputs[i].name));
  }
  if (binary_offset != binary.size()) {
    return Invalid(fmt::format("{} binary bytes follow the JSON header but inputs use {}",
                               binary.size(), binary_offset));
  }
  const int64_t samples = request.inputs[0].shape()[0];
  for (size_t i = 1; i < request.inputs.size(); ++i) {
    if (request.inputs[i].shape()[0] != samples) {
      return Invalid(fmt::format("inputs disagree on the batch size: '{}' has {}, '{}' has {}",
                                 config.inputs[0].name, samples, config.inputs[i].name,
                                 request.inputs[i].shape()[0]));
    }
  }
  return request;
}

Result<V2InferRequest> ParseV2RawInput(std::string_view body, const ModelConfig& config) {
  if (config.inputs.size() != 1) {
    return Invalid(fmt::format("a raw binary body needs a single-input model; '{}' has {} inputs",
                               config.name, config.inputs.size()));
  }
  const TensorSpec& spec = config.inputs[0];
  Shape shape{0};
  int64_t sample_bytes = static_cast<int64_t>(DataTypeSize(spec.datatype));
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return Invalid(fmt::format("a raw binary body needs fixed dimensions; input '{}' is {}",
                                 spec.name, ShapeToString(spec.shape)));
    }
    shape.push_back(d);
    sample_bytes *= d;
  }
  if (sample_bytes == 0 || body.empty() || body.size() % static_cast<size_t>(sample_bytes) != 0) {
    return Invalid(
        fmt::format("a raw body for input '{}' must be a whole number of {}-byte "
                    "samples; got {} bytes",
                    spec.name, sample_bytes, body.size()));
  }
  shape[0] = static_cast<int64_t>(body.size()) / sample_bytes;
  Tensor tensor = Tensor::Uninitialized(spec.datatype, shape);
  std::memcpy(tensor.mutable_data(), body.data(), body.size());
  V2InferRequest request;
  request.inputs.push_back(std::move(tensor));
  request.binary_data_output = true;
  return request;
}

namespace {

// Appends each of `n` values from `data` to `out`, comma-separated, each as `put(value, buffer)`
// writes it into a stack buffer and returns its end: one append per value, no format string
// parsed at run time, no growth of `out` past the first estimate in the common case.
template <typename T, typename Put>
void AppendEach(const T* data, int64_t n, std::string& out, Put put) {
  char buffer[64];  // fmt's shortest form of any double or 64-bit integer, and a comma, fit.
  for (int64_t i = 0; i < n; ++i) {
    char* at = buffer;
    if (i) *at++ = ',';
    out.append(buffer, put(data[i], at));
  }
}

// Integers and finite floats as fmt's "{}" writes them (the shortest form that reads back the same
// value); NaN and infinities as null: JSON has neither.
template <typename T>
char* PutNumber(T value, char* at) {
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) return std::copy_n("null", 4, at);
  }
  return fmt::format_to(at, FMT_COMPILE("{}"), value);
}

}  // namespace

void AppendJsonValues(const Tensor& tensor, std::string& out) {
  const int64_t n = tensor.element_count();
  const void* data = tensor.data();
  out.push_back('[');
  // Most values of a model's output take at most 12 characters and their comma.
  out.reserve(out.size() + static_cast<size_t>(n) * 13 + 1);
  // Unary plus widens 8-bit integers, so that fmt writes a number rather than a character.
  auto number = [](auto value, char* at) { return PutNumber(+value, at); };
  switch (tensor.dtype()) {
    case DataType::kBool:
      AppendEach(static_cast<const uint8_t*>(data), n, out, [](uint8_t v, char* at) {
        return v ? std::copy_n("true", 4, at) : std::copy_n("false", 5, at);
      });
      break;
    case DataType::kUInt8:
      AppendEach(static_cast<const uint8_t*>(data), n, out, number);
      break;
    case DataType::kInt8:
      AppendEach(static_cast<const int8_t*>(data), n, out, number);
      break;
    case DataType::kInt16:
      AppendEach(static_cast<const int16_t*>(data), n, out, number);
      break;
    case DataType::kInt32:
      AppendEach(static_cast<const int32_t*>(data), n, out, number);
      break;
    case DataType::kInt64:
      AppendEach(static_cast<const int64_t*>(data), n, out, number);
      break;
    case DataType::kFp16:
      AppendEach(static_cast<const uint16_t*>(data), n, out,
                 [](uint16_t v, char* at) { return PutNumber(HalfToFloat(v), at); });
      break;
    case DataType::kBf16:
      AppendEach(static_cast<const uint16_t*>(data), n, out,
                 [](uint16_t v, char* at) { return PutNumber(Bf16ToFloat(v), at); });
      break;
    case DataType::kFp32:
      AppendEach(static_cast<const float*>(data), n, out, number);
      break;
    case DataType::kFp64:
      AppendEach(static_cast<const double*>(data), n, out, number);
      break;
  }
  out.push_back(']');
}

Result<V2EncodedResponse> EncodeV2InferResponse(const ModelConfig& config,
                                                const V2InferRequest& request,
                                                const std::vector<Tensor>& outputs) {
  if (outputs.size() != config.outputs.size()) {
    return Status::Internal(fmt::format("model '{}' returned {} outputs, its config declares {}",
                                        config.name, outputs.size(), config.outputs.size()));
  }
  // Which outputs, in which form.
  std::vector<std::pair<size_t, bool>> chosen;  // (output index, binary)
  if (request.outputs.empty()) {
    for (size_t i = 0; i < outputs.size(); ++i) chosen.emplace_back(i, request.binary_data_output);
  } else {
    for (const V2RequestedOutput& r : request.outputs) {
      size_t index = 0;
      FindTensorSpec(config.outputs, r.name, &index);
      chosen.emplace_back(index, r.binary.value_or(request.binary_data_output));
    }
  }
  V2EncodedResponse response;
  std::string& out = response.body;
  out.reserve(256);
  out += "{\"model_name\":";
  out += JsonQuote(config.name);
  out += ",\"model_version\":\"1\"";
  if (!request.id.empty()) {
    out += ",\"id\":";
    out += JsonQuote(request.id);
  }
  out += ",\"outputs\":[";
  size_t binary_bytes = 0;
  for (size_t c = 0; c < chosen.size(); ++c) {
    const auto [index, binary] = chosen[c];
    const Tensor& tensor = outputs[index];
    if (c) out.push_back(',');
    fmt::format_to(std::back_inserter(out), "{{\"name\":{},\"datatype\":\"{}\",\"shape\":[{}]",
                   JsonQuote(config.outputs[index].name), DataTypeName(tensor.dtype()),
                   fmt::join(tensor.shape(), ","));
    if (binary) {
      fmt::format_to(std::back_inserter(out), ",\"parameters\":{{\"binary_data_size\":{}}}}}",
                     tensor.byte_size());
      binary_bytes += tensor.byte_size();
    } else {
      out += ",\"data\":";
      AppendJsonValues(tensor, out);
      out.push_back('}');
    }
  }
  out += "]}";
  response.json_size = out.size();
  if (binary_bytes > 0) {
    response.has_binary = true;
    out.reserve(out.size() + binary_bytes);
    for (const auto& [index, binary] : chosen) {
      if (!binary) continue;
      const Tensor& tensor = outputs[index];
      out.append(static_cast<const char*>(tensor.data()), tensor.byte_size());
    }
  }
  return response;
}

}  // namespace sluice
