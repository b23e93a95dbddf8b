// KServe v2 codec: JSON and binary request forms, every datatype path, and the errors.
#include "codec/v2_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/half.h"

namespace sluice {
namespace {

ModelConfig TwoInputModel() {
  ModelConfig c;
  c.name = "m";
  c.max_batch_size = 8;
  c.inputs = {{"a", DataType::kFp32, {2, 2}}, {"b", DataType::kInt64, {-1}}};
  c.outputs = {{"y", DataType::kFp32, {3}}, {"z", DataType::kInt32, {1}}};
  return c;
}

ModelConfig OneInputModel(DataType dtype, Shape shape) {
  ModelConfig c;
  c.name = "one";
  c.max_batch_size = 8;
  c.inputs = {{"x", dtype, std::move(shape)}};
  c.outputs = {{"y", dtype, {1}}};
  return c;
}

Status ParseError(std::string_view json, const ModelConfig& config, std::string_view binary = {}) {
  auto parsed = ParseV2InferRequest(json, binary, config);
  return parsed.ok() ? Status::Ok() : parsed.status();
}

void ExpectError(std::string_view json, const ModelConfig& config, std::string_view fragment,
                 StatusCode code = StatusCode::kInvalidArgument) {
  Status status = ParseError(json, config);
  EXPECT_EQ(status.code(), code) << json;
  EXPECT_NE(status.message().find(fragment), std::string::npos)
      << "message: " << status.message() << "\nexpected: " << fragment;
}

TEST(V2CodecTest, ParsesNestedAndFlatDataInDeclaredOrder) {
  auto parsed = ParseV2InferRequest(
      R"({"id":"r1","inputs":[
            {"name":"b","shape":[1,3],"datatype":"INT64","data":[7,8,9]},
            {"name":"a","shape":[1,2,2],"datatype":"FP32","data":[[[1,2],[3,4.5]]]}],
          "outputs":[{"name":"z","parameters":{"binary_data":true}}]})",
      "", TwoInputModel());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->id, "r1");
  ASSERT_EQ(parsed->inputs.size(), 2u);
  EXPECT_EQ(parsed->inputs[0].shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(std::vector<float>(parsed->inputs[0].values<float>().begin(),
                               parsed->inputs[0].values<float>().end()),
            (std::vector<float>{1, 2, 3, 4.5}));
  EXPECT_EQ(parsed->inputs[1].values<int64_t>()[2], 9);
  ASSERT_EQ(parsed->outputs.size(), 1u);
  EXPECT_EQ(parsed->outputs[0].name, "z");
  EXPECT_EQ(parsed->outputs[0].binary, std::optional<bool>(true));
}

TEST(V2CodecTest, BinaryDataExtensionTakesBytesInInputOrder) {
  float a[4] = {1, 2, 3, 4};
  int64_t b[2] = {5, 6};
  std::string binary(reinterpret_cast<const char*>(a), sizeof(a));
  binary.append(reinterpret_cast<const char*>(b), sizeof(b));
  auto parsed = ParseV2InferRequest(
      R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","parameters":{"binary_data_size":16}},
                    {"name":"b","shape":[1,2],"datatype":"INT64","parameters":{"binary_data_size":16}}],
          "parameters":{"binary_data_output":true}})",
      binary, TwoInputModel());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->inputs[0].values<float>()[3], 4.0f);
  EXPECT_EQ(parsed->inputs[1].values<int64_t>()[1], 6);
  EXPECT_TRUE(parsed->binary_data_output);

  Status short_body = ParseError(
      R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","parameters":{"binary_data_size":16}},
                    {"name":"b","shape":[1,2],"datatype":"INT64","data":[1,2]}]})",
      TwoInputModel(), std::string_view(binary).substr(0, 10));
  EXPECT_NE(short_body.message().find("10 binary bytes after the JSON header, 16 needed"),
            std::string::npos)
      << short_body.message();
  Status wrong_size = ParseError(
      R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","parameters":{"binary_data_size":12}},
                    {"name":"b","shape":[1,2],"datatype":"INT64","data":[1,2]}]})",
      TwoInputModel(), binary);
  EXPECT_NE(wrong_size.message().find("binary_data_size 12 but shape [1, 2, 2] of FP32 needs 16"),
            std::string::npos);
  Status extra = ParseError(
      R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]},
                    {"name":"b","shape":[1,2],"datatype":"INT64","data":[1,2]}]})",
      TwoInputModel(), "xx");
  EXPECT_NE(extra.message().find("2 binary bytes follow the JSON header but inputs use 0"),
            std::string::npos);
}

TEST(V2CodecTest, RawBodyIsTheOnlyInputsBytes) {
  ModelConfig config = OneInputModel(DataType::kFp32, {4});
  float values[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  auto parsed =
      ParseV2RawInput(std::string_view(reinterpret_cast<const char*>(values), 32), config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->inputs[0].shape(), (Shape{2, 4}));
  EXPECT_TRUE(parsed->binary_data_output);
  EXPECT_EQ(ParseV2RawInput("abc", config).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseV2RawInput("", config).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseV2RawInput(std::string(32, 'x'), TwoInputModel()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(V2CodecTest, EveryNumericDatatypeRoundTripsThroughJson) {
  struct Case {
    DataType dtype;
    const char* data;
    const char* expected;
  };
  const Case cases[] = {
      {DataType::kBool, "[true,false]", "[true,false]"},
      {DataType::kUInt8, "[0,255]", "[0,255]"},
      {DataType::kInt8, "[-128,127]", "[-128,127]"},
      {DataType::kInt16, "[-32768,32767]", "[-32768,32767]"},
      {DataType::kInt32, "[-2147483648,2147483647]", "[-2147483648,2147483647]"},
      {DataType::kInt64, "[-9223372036854775808,9223372036854775807]",
       "[-9223372036854775808,9223372036854775807]"},
      {DataType::kFp16, "[1.5,-2]", "[1.5,-2]"},
      {DataType::kBf16, "[1.5,-2]", "[1.5,-2]"},
      {DataType::kFp32, "[0.1,-2]", "[0.1,-2]"},
      {DataType::kFp64, "[0.1,1e300]", "[0.1,1e+300]"},
  };
  for (const Case& c : cases) {
    ModelConfig config = OneInputModel(c.dtype, {2});
    std::string json = std::string(R"({"inputs":[{"name":"x","shape":[1,2],"datatype":")") +
                       std::string(DataTypeName(c.dtype)) + R"(","data":)" + c.data + "}]}";
    auto parsed = ParseV2InferRequest(json, "", config);
    ASSERT_TRUE(parsed.ok()) << DataTypeName(c.dtype) << ": " << parsed.status().message();
    std::string out;
    AppendJsonValues(parsed->inputs[0], out);
    EXPECT_EQ(out, c.expected) << DataTypeName(c.dtype);
  }
}

// JSON has no NaN or infinity: they go out as null. The extremes keep their shortest form.
TEST(V2CodecTest, NonFiniteValuesAreWrittenAsNullAndExtremesInFull) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor f32 = Tensor::Uninitialized(DataType::kFp32, {5});
  const float f32_values[] = {std::nanf(""), -inf, 3.4028235e38f, 1e-45f, -0.0f};
  std::memcpy(f32.mutable_data(), f32_values, sizeof(f32_values));
  std::string out = "x";
  AppendJsonValues(f32, out);
  EXPECT_EQ(out, "x[null,null,3.4028235e+38,1e-45,-0]");
  Tensor f64 = Tensor::Uninitialized(DataType::kFp64, {2});
  const double f64_values[] = {std::numeric_limits<double>::infinity(), 2.5};
  std::memcpy(f64.mutable_data(), f64_values, sizeof(f64_values));
  out.clear();
  AppendJsonValues(f64, out);
  EXPECT_EQ(out, "[null,2.5]");
  Tensor f16 = Tensor::Uninitialized(DataType::kFp16, {2});
  const uint16_t f16_values[] = {0x7c00, 0x3c00};  // +infinity, 1.
  std::memcpy(f16.mutable_data(), f16_values, sizeof(f16_values));
  out.clear();
  AppendJsonValues(f16, out);
  EXPECT_EQ(out, "[null,1]");
  out.clear();
  AppendJsonValues(Tensor::Uninitialized(DataType::kInt32, {0}), out);
  EXPECT_EQ(out, "[]");
}

TEST(V2CodecTest, ValuesOutOfRangeOrOfTheWrongTypeAreRefused) {
  auto json = [](const char* dtype, const char* data) {
    return std::string(R"({"inputs":[{"name":"x","shape":[1,2],"datatype":")") + dtype +
           R"(","data":)" + data + "}]}";
  };
  ExpectError(json("UINT8", "[0,256]"), OneInputModel(DataType::kUInt8, {2}),
              "data element 1 (256) is out of range for UINT8");
  ExpectError(json("INT8", "[1.5,2]"), OneInputModel(DataType::kInt8, {2}),
              "data element 0 is a number, expected an integer for INT8");
  ExpectError(json("INT64", "[1,18446744073709551615]"), OneInputModel(DataType::kInt64, {2}),
              "out of range for INT64");
  ExpectError(json("FP32", "[1,1e39]"), OneInputModel(DataType::kFp32, {2}),
              "out of range for FP32");
  ExpectError(json("FP32", R"([1,"2"])"), OneInputModel(DataType::kFp32, {2}),
              "data element 1 is a string, expected a number for FP32");
  ExpectError(json("BOOL", "[1,0]"), OneInputModel(DataType::kBool, {2}), "expected true or false");
  ExpectError(json("FP32", "[1,null]"), OneInputModel(DataType::kFp32, {2}), "is null");
  // JSON has no NaN or Infinity tokens: they are malformed JSON.
  ExpectError(json("FP32", "[1,NaN]"), OneInputModel(DataType::kFp32, {2}), "malformed JSON");
}

TEST(V2CodecTest, DataMustMatchTheShapeExactly) {
  ModelConfig config = TwoInputModel();
  auto json = [](const char* a_shape, const char* a_data) {
    return std::string(R"({"inputs":[{"name":"a","shape":)") + a_shape +
           R"(,"datatype":"FP32","data":)" + a_data +
           R"(},{"name":"b","shape":[1,1],"datatype":"INT64","data":[1]}]})";
  };
  ExpectError(json("[1,2,2]", "[[[1,2],[3]]]"), config, "ragged or mis-nested");
  ExpectError(json("[1,2,2]", "[[1,2],[3,4]]"), config, "has 2 entries at depth 0");
  ExpectError(json("[1,2,2]", "[[[[1],2],[3,4]]]"), config, "nested deeper than shape");
  ExpectError(json("[1,2,2]", "[1,2,3]"), config, "data holds 3 elements, shape [1, 2, 2] needs 4");
  ExpectError(json("[1,2,2]", "[1,2,3,4,5]"), config, "more than the 4 elements");
  ExpectError(json("[1,2,3]", "[1,2,3,4,5,6]"), config,
              "shape [1, 2, 3] does not match the model's [-1, 2, 2]");
  ExpectError(json("[1,2]", "[1,2]"), config, "does not match the model's");
  ExpectError(json("[1,-2,2]", "[1]"), config, "non-negative integers");
  ExpectError(json("\"x\"", "[1]"), config, "must be an array of integers");
  ExpectError(json("[1,2,2]", "{}"), config, "\"data\" must be an array");
}

TEST(V2CodecTest, HugeShapeClaimsAreRefusedBeforeAllocating) {
  ModelConfig config = OneInputModel(DataType::kFp32, {-1});
  ExpectError(R"({"inputs":[{"name":"x","shape":[1,1000000000000],"datatype":"FP32","data":[1]}]})",
              config, "limit", StatusCode::kPayloadTooLarge);
  ExpectError(R"({"inputs":[{"name":"x","shape":[1,1000000],"datatype":"FP32","data":[1]}]})",
              config, "claims 1000000 elements, more than the request holds");
  ExpectError(
      R"({"inputs":[{"name":"x","shape":[4294967296,4294967296,4294967296],"datatype":"FP32","data":[1]}]})",
      OneInputModel(DataType::kFp32, {-1, -1}), "overflows");
}

TEST(V2CodecTest, StructuralErrorsNameTheProblem) {
  ModelConfig config = TwoInputModel();
  ExpectError("", config, "malformed JSON");
  ExpectError("{", config, "malformed JSON");
  ExpectError("[]", config, "must be a JSON object");
  ExpectError("{}", config, "no \"inputs\"");
  ExpectError(R"({"inputs":{}})", config, "\"inputs\" must be an array");
  ExpectError(R"({"inputs":[{"name":"nope","shape":[1],"datatype":"FP32","data":[1]}]})", config,
              "model 'm' has no input \"nope\"");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP64","data":[1,2,3,4]}]})",
              config, "datatype \"FP64\" does not match the model's FP32");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
              config, "input 'b' is missing");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"BYTES","data":["x"]}]})",
              config, "datatype \"BYTES\" is a KServe v2 type that libtorch tensors cannot hold");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"UINT32","data":[1]}]})", config,
              "libtorch tensors cannot hold");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP8","data":[1]}]})", config,
              "is not a KServe v2 datatype");
  ExpectError(R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32"}]})", config,
              "neither \"data\" nor parameters.binary_data_size");
  ExpectError(
      R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]},
                    {"name":"a","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
      config, "input 'a' is given twice");
  ExpectError(
      R"({"inputs":[{"name":"a","shape":[2,2,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]},
                    {"name":"b","shape":[1,1],"datatype":"INT64","data":[1]}]})",
      config, "inputs disagree on the batch size");
  ExpectError(R"({"outputs":[{"name":"q"}],"inputs":[]})", config, "has no output \"q\"");
  ExpectError(R"({"id":5,"inputs":[]})", config, "\"id\" must be a string");
  // Names are quoted and escaped in messages, never echoed raw.
  ExpectError(R"({"inputs":[{"name":"<b>\u0001","shape":[1],"datatype":"FP32","data":[1]}]})",
              config, R"("<b>\u0001")");
  // Deep nesting is refused by the parser's depth limit or the shape check, never a crash.
  std::string deep = R"({"inputs":[{"name":"a","shape":[1,2,2],"datatype":"FP32","data":)" +
                     std::string(5000, '[') + std::string(5000, ']') + "}]}";
  EXPECT_EQ(ParseError(deep, config).code(), StatusCode::kInvalidArgument);
}

TEST(V2CodecTest, EncodesJsonAndBinaryOutputs) {
  ModelConfig config = TwoInputModel();
  Tensor y = Tensor::Zeros(DataType::kFp32, {1, 3});
  y.mutable_values<float>()[0] = 0.5f;
  y.mutable_values<float>()[2] = -1.25f;
  Tensor z = Tensor::Zeros(DataType::kInt32, {1, 1});
  z.mutable_values<int32_t>()[0] = 42;

  V2InferRequest request;
  request.id = "q\"1";
  auto json = EncodeV2InferResponse(config, request, {y, z});
  ASSERT_TRUE(json.ok());
  EXPECT_FALSE(json->has_binary);
  EXPECT_EQ(json->body, R"({"model_name":"m","model_version":"1","id":"q\"1","outputs":[)"
                        R"({"name":"y","datatype":"FP32","shape":[1,3],"data":[0.5,0,-1.25]},)"
                        R"({"name":"z","datatype":"INT32","shape":[1,1],"data":[42]}]})");

  request.id.clear();
  request.outputs = {{"y", true}};
  auto binary = EncodeV2InferResponse(config, request, {y, z});
  ASSERT_TRUE(binary.ok());
  EXPECT_TRUE(binary->has_binary);
  std::string_view header(binary->body.data(), binary->json_size);
  EXPECT_EQ(
      header,
      R"({"model_name":"m","model_version":"1","outputs":[)"
      R"({"name":"y","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]})");
  ASSERT_EQ(binary->body.size(), binary->json_size + 12);
  float back[3];
  std::memcpy(back, binary->body.data() + binary->json_size, 12);
  EXPECT_EQ(back[2], -1.25f);

  EXPECT_EQ(EncodeV2InferResponse(config, request, {y}).status().code(), StatusCode::kInternal);
}

// The binary-data extension: an output's own "binary_data" decides its form, either way, over the
// request's "binary_data_output"; an output that says nothing follows the request.
TEST(V2CodecTest, AnOutputsBinaryDataOverridesTheRequestsEitherWay) {
  const ModelConfig config = TwoInputModel();
  auto parsed = ParseV2InferRequest(
      R"({"inputs":[{"name":"b","shape":[1,3],"datatype":"INT64","data":[7,8,9]},
                    {"name":"a","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}],
          "parameters":{"binary_data_output":true},
          "outputs":[{"name":"y","parameters":{"binary_data":false}},{"name":"z"}]})",
      "", config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->binary_data_output);
  EXPECT_EQ(parsed->outputs[0].binary, std::optional<bool>(false));
  EXPECT_EQ(parsed->outputs[1].binary, std::nullopt);

  Tensor y = Tensor::Zeros(DataType::kFp32, {1, 3});
  y.mutable_values<float>()[1] = 2.5f;
  Tensor z = Tensor::Zeros(DataType::kInt32, {1, 1});
  z.mutable_values<int32_t>()[0] = 42;
  auto mixed = EncodeV2InferResponse(config, *parsed, {y, z});
  ASSERT_TRUE(mixed.ok());
  ASSERT_TRUE(mixed->has_binary);
  EXPECT_EQ(
      std::string_view(mixed->body.data(), mixed->json_size),
      R"({"model_name":"m","model_version":"1","outputs":[)"
      R"({"name":"y","datatype":"FP32","shape":[1,3],"data":[0,2.5,0]},)"
      R"({"name":"z","datatype":"INT32","shape":[1,1],"parameters":{"binary_data_size":4}}]})");
  ASSERT_EQ(mixed->body.size(), mixed->json_size + 4);
  int32_t back = 0;
  std::memcpy(&back, mixed->body.data() + mixed->json_size, 4);
  EXPECT_EQ(back, 42);

  // The reverse: JSON for the request, binary for the output that asks.
  V2InferRequest request;
  request.binary_data_output = false;
  request.outputs = {{"y", true}, {"z", std::nullopt}};
  auto reverse = EncodeV2InferResponse(config, request, {y, z});
  ASSERT_TRUE(reverse.ok());
  ASSERT_TRUE(reverse->has_binary);
  EXPECT_EQ(std::string_view(reverse->body.data(), reverse->json_size),
            R"({"model_name":"m","model_version":"1","outputs":[)"
            R"({"name":"y","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}},)"
            R"({"name":"z","datatype":"INT32","shape":[1,1],"data":[42]}]})");
  EXPECT_EQ(reverse->body.size(), reverse->json_size + 12);
}

ModelConfig ImageModel() {
  ModelConfig c = OneInputModel(DataType::kFp32, {3, 2, 2});
  c.preprocess_image = ImagePreprocessConfig{0, 2, 3, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
  return c;
}

TEST(V2CodecTest, RawPixelsForAnImageModelArePreprocessedLikeImages) {
  // Two 4x2 (HxW) RGB images as UINT8 [2, 4, 2, 3], centre-cropped to 2x2 and normalised,
  // (v / 255 - 0.5) / 0.5, into FP32 [2, 3, 2, 2] (PreprocessImage's own tests cover resizing).
  std::string data;
  for (int n = 0; n < 2; ++n) {
    for (int i = 0; i < 4 * 2 * 3; ++i) {
      if (!data.empty()) data += ',';
      data += n ? "255" : "0";
    }
  }
  auto parsed = ParseV2InferRequest(
      R"({"inputs":[{"name":"x","shape":[2,4,2,3],"datatype":"UINT8","data":[)" + data + "]}]}", {},
      ImageModel());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Tensor& x = parsed->inputs[0];
  EXPECT_EQ(x.dtype(), DataType::kFp32);
  EXPECT_EQ(x.shape(), (Shape{2, 3, 2, 2}));
  auto v = x.values<float>();
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(v[i], -1.0f, 1e-6);  // Black.
  for (size_t i = 12; i < 24; ++i) EXPECT_NEAR(v[i], 1.0f, 1e-6);  // White.

  // The binary extension: the same pixels as bytes.
  std::string bytes(4 * 2 * 3, '\0');
  auto binary =
      ParseV2InferRequest(R"({"inputs":[{"name":"x","shape":[1,4,2,3],"datatype":"UINT8",)"
                          R"("parameters":{"binary_data_size":24}}]})",
                          bytes, ImageModel());
  ASSERT_TRUE(binary.ok()) << binary.status().ToString();
  EXPECT_EQ(binary->inputs[0].shape(), (Shape{1, 3, 2, 2}));

  // Pixels with the wrong channel count, too small for the crop, or a model with no image
  // preprocessing: each a clear error.
  ExpectError(R"({"inputs":[{"name":"x","shape":[1,2,2,1],"datatype":"UINT8","data":[1,2,3,4]}]})",
              ImageModel(), "shape [1, 2, 2, 1] does not match the model's [-1, -1, -1, 3]");
  ExpectError(R"({"inputs":[{"name":"x","shape":[1,1,1,3],"datatype":"UINT8","data":[1,2,3]}]})",
              ImageModel(), "input 'x': image of 1x1 is smaller than the 2x2 crop");
  ExpectError(R"({"inputs":[{"name":"x","shape":[1,3,2,2],"datatype":"UINT8","data":[)"
              "1,2,3,4,5,6,7,8,9,10,11,12]}]}",
              OneInputModel(DataType::kFp32, {3, 2, 2}), "does not match the model's FP32");
}

TEST(HalfTest, ConversionsRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.5f)), 1.5f);
  EXPECT_EQ(Bf16ToFloat(0xC000), -2.0f);
}

}  // namespace
}  // namespace sluice
