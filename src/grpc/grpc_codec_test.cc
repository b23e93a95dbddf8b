// The gRPC infer codec: raw and typed contents in, both forms out, and every refusal.
#include "grpc/grpc_codec.h"

#include <gtest/gtest.h>

#include <cstring>

namespace sluice {
namespace {

ModelConfig TwoInputModel() {
  ModelConfig config;
  config.name = "m";
  config.inputs = {{"x", DataType::kFp32, {3}}, {"ids", DataType::kInt64, {-1}}};
  config.outputs = {{"y", DataType::kFp32, {3}}, {"h", DataType::kFp16, {2}}};
  return config;
}

inference::ModelInferRequest TypedRequest() {
  inference::ModelInferRequest m;
  m.set_model_name("m");
  m.set_id("req-7");
  auto* x = m.add_inputs();
  x->set_name("x");
  x->set_datatype("FP32");
  x->add_shape(2);
  x->add_shape(3);
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, -6.5f}) x->mutable_contents()->add_fp32_contents(v);
  auto* ids = m.add_inputs();
  ids->set_name("ids");
  ids->set_datatype("INT64");
  ids->add_shape(2);
  ids->add_shape(1);
  ids->mutable_contents()->add_int64_contents(-9);
  ids->mutable_contents()->add_int64_contents(int64_t{1} << 40);
  return m;
}

// The same request with raw_input_contents, in the order the inputs are listed.
inference::ModelInferRequest RawRequest() {
  inference::ModelInferRequest m = TypedRequest();
  const float x[] = {1.f, 2.f, 3.f, 4.f, 5.f, -6.5f};
  const int64_t ids[] = {-9, int64_t{1} << 40};
  for (auto& input : *m.mutable_inputs()) input.clear_contents();
  m.add_raw_input_contents()->assign(reinterpret_cast<const char*>(x), sizeof(x));
  m.add_raw_input_contents()->assign(reinterpret_cast<const char*>(ids), sizeof(ids));
  return m;
}

TEST(GrpcCodecTest, TypedAndRawContentsGiveTheSameTensors) {
  const ModelConfig config = TwoInputModel();
  auto typed = ParseGrpcInferRequest(TypedRequest(), config);
  auto raw = ParseGrpcInferRequest(RawRequest(), config);
  ASSERT_TRUE(typed.ok()) << typed.status().ToString();
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(typed->id, "req-7");
  EXPECT_FALSE(typed->binary_data_output);
  EXPECT_TRUE(raw->binary_data_output);
  for (const auto* r : {&*typed, &*raw}) {
    ASSERT_EQ(r->inputs.size(), 2u);
    EXPECT_EQ(r->inputs[0].shape(), (Shape{2, 3}));
    EXPECT_EQ(r->inputs[0].values<float>()[5], -6.5f);
    EXPECT_EQ(r->inputs[1].shape(), (Shape{2, 1}));
    EXPECT_EQ(r->inputs[1].values<int64_t>()[0], -9);
    EXPECT_EQ(r->inputs[1].values<int64_t>()[1], int64_t{1} << 40);
  }
}

TEST(GrpcCodecTest, InputsAreTakenInTheModelsOrderWhateverTheRequestsOrder) {
  inference::ModelInferRequest m = RawRequest();
  m.mutable_inputs()->SwapElements(0, 1);
  m.mutable_raw_input_contents()->SwapElements(0, 1);
  auto parsed = ParseGrpcInferRequest(m, TwoInputModel());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->inputs[0].dtype(), DataType::kFp32);
  EXPECT_EQ(parsed->inputs[1].values<int64_t>()[0], -9);
}

TEST(GrpcCodecTest, SmallIntegerTypesAreRangeChecked) {
  ModelConfig config;
  config.name = "q";
  config.inputs = {{"b", DataType::kUInt8, {2}}};
  config.outputs = {{"o", DataType::kUInt8, {2}}};
  inference::ModelInferRequest m;
  auto* b = m.add_inputs();
  b->set_name("b");
  b->set_datatype("UINT8");
  b->add_shape(1);
  b->add_shape(2);
  b->mutable_contents()->add_uint_contents(255);
  b->mutable_contents()->add_uint_contents(7);
  auto ok = ParseGrpcInferRequest(m, config);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->inputs[0].values<uint8_t>()[0], 255);
  b->mutable_contents()->set_uint_contents(1, 256);
  auto bad = ParseGrpcInferRequest(m, config);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "input 'b': value 256 at 1 is out of range for UINT8");
}

TEST(GrpcCodecTest, EveryMalformedRequestIsRefusedNamingTheProblem) {
  const ModelConfig config = TwoInputModel();
  struct Case {
    std::function<void(inference::ModelInferRequest&)> mutate;
    StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& m) { m.clear_inputs(); }, StatusCode::kInvalidArgument,
       "the request has no inputs"},
      {[](auto& m) { m.mutable_inputs(0)->set_name("z"); }, StatusCode::kInvalidArgument,
       "model 'm' has no input \"z\""},
      {[](auto& m) { m.mutable_inputs(1)->set_name("x"); }, StatusCode::kInvalidArgument,
       "input 'x' is given twice"},
      {[](auto& m) { m.mutable_inputs(0)->set_datatype("FP64"); }, StatusCode::kInvalidArgument,
       "input 'x': datatype \"FP64\" does not match the model's FP32"},
      {[](auto& m) { m.mutable_inputs(0)->set_datatype("BYTES"); }, StatusCode::kInvalidArgument,
       "input 'x': datatype \"BYTES\" is a KServe v2 type that libtorch tensors cannot hold, so "
       "Sluice does not accept it"},
      {[](auto& m) { m.mutable_inputs(0)->set_shape(1, 4); }, StatusCode::kInvalidArgument,
       "input 'x': shape [2, 4] does not match the model's [-1, 3]"},
      {[](auto& m) { m.mutable_inputs(0)->set_shape(0, -2); }, StatusCode::kInvalidArgument,
       "input 'x': shape must hold non-negative integers"},
      {[](auto& m) {
         m.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
       },
       StatusCode::kInvalidArgument,
       "input 'x': contents.fp32_contents holds 5 values, shape [2, 3] needs 6"},
      {[](auto& m) {
         m.mutable_inputs(1)->mutable_contents()->clear_int64_contents();
         m.mutable_inputs(1)->mutable_contents()->add_int_contents(1);
         m.mutable_inputs(1)->mutable_contents()->add_int_contents(2);
       },
       StatusCode::kInvalidArgument,
       "input 'ids': contents.int64_contents holds 0 values, shape [2, 1] needs 2"},
      {[](auto& m) { m.mutable_inputs()->RemoveLast(); }, StatusCode::kInvalidArgument,
       "input 'ids' is missing"},
      {[](auto& m) { m.add_outputs()->set_name("nope"); }, StatusCode::kInvalidArgument,
       "model 'm' has no output \"nope\""},
      {[](auto& m) { m.mutable_inputs(1)->set_shape(1, int64_t{1} << 40); },
       StatusCode::kPayloadTooLarge,
       "input 'ids': shape [2, 1099511627776] has 2199023255552 elements, limit 268435456"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest m = TypedRequest();
    c.mutate(m);
    auto parsed = ParseGrpcInferRequest(m, config);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), c.code) << c.message;
    EXPECT_EQ(parsed.status().message(), c.message);
  }
  const std::vector<Case> raw_cases = {
      {[](auto& m) { m.mutable_raw_input_contents()->RemoveLast(); }, StatusCode::kInvalidArgument,
       "raw_input_contents holds 1 entries for 2 inputs"},
      {[](auto& m) { m.mutable_raw_input_contents(1)->pop_back(); }, StatusCode::kInvalidArgument,
       "input 'ids': raw_input_contents holds 15 bytes, shape [2, 1] of INT64 needs 16"},
      {[](auto& m) { m.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1); },
       StatusCode::kInvalidArgument,
       "input 'x': has typed contents, but the request uses raw_input_contents; use one form for "
       "every input"},
  };
  for (const Case& c : raw_cases) {
    inference::ModelInferRequest m = RawRequest();
    c.mutate(m);
    auto parsed = ParseGrpcInferRequest(m, config);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), c.code) << c.message;
    EXPECT_EQ(parsed.status().message(), c.message);
  }
}

TEST(GrpcCodecTest, RawPixelsForAnImageModelArePreprocessedLikeImages) {
  ModelConfig config;
  config.name = "img";
  config.inputs = {{"x", DataType::kFp32, {3, 2, 2}}};
  config.outputs = {{"y", DataType::kFp32, {1}}};
  config.preprocess_image = ImagePreprocessConfig{0, 2, 3, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
  inference::ModelInferRequest m;
  m.set_model_name("img");
  auto* x = m.add_inputs();
  x->set_name("x");
  x->set_datatype("UINT8");
  for (int64_t d : {1, 4, 2, 3}) x->add_shape(d);
  m.add_raw_input_contents()->assign(4 * 2 * 3, static_cast<char>(255));
  auto parsed = ParseGrpcInferRequest(m, config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->inputs[0].dtype(), DataType::kFp32);
  EXPECT_EQ(parsed->inputs[0].shape(), (Shape{1, 3, 2, 2}));
  for (float v : parsed->inputs[0].values<float>()) EXPECT_NEAR(v, 1.0f, 1e-6);
  config.preprocess_image.reset();  // No image preprocessing: UINT8 is the wrong datatype.
  EXPECT_NE(ParseGrpcInferRequest(m, config).status().message().find("does not match"),
            std::string::npos);
}

TEST(GrpcCodecTest, Fp16HasNoTypedFieldAndMustTravelRaw) {
  ModelConfig config;
  config.name = "h";
  config.inputs = {{"x", DataType::kFp16, {2}}};
  config.outputs = {{"y", DataType::kFp16, {2}}};
  inference::ModelInferRequest m;
  auto* x = m.add_inputs();
  x->set_name("x");
  x->set_datatype("FP16");
  x->add_shape(1);
  x->add_shape(2);
  auto typed = ParseGrpcInferRequest(m, config);
  ASSERT_FALSE(typed.ok());
  EXPECT_EQ(typed.status().message(),
            "input 'x': FP16 has no typed contents field; send its bytes in raw_input_contents");
  m.add_raw_input_contents()->assign(4, '\x01');
  EXPECT_TRUE(ParseGrpcInferRequest(m, config).ok());
}

TEST(GrpcCodecTest, OutputsComeBackInTheFormTheInputsCameIn) {
  const ModelConfig config = TwoInputModel();
  Tensor y = Tensor::Zeros(DataType::kFp32, {1, 3});
  y.mutable_values<float>()[2] = 2.5f;
  Tensor h = Tensor::Zeros(DataType::kFp16, {1, 2});
  const std::vector<Tensor> outputs = {y, h};

  // Typed request for y only: typed fp32 contents.
  V2InferRequest typed;
  typed.id = "abc";
  typed.outputs.push_back({"y", std::nullopt});
  inference::ModelInferResponse a;
  ASSERT_TRUE(EncodeGrpcInferResponse(config, typed, outputs, &a).ok());
  EXPECT_EQ(a.model_name(), "m");
  EXPECT_EQ(a.model_version(), "1");
  EXPECT_EQ(a.id(), "abc");
  ASSERT_EQ(a.outputs_size(), 1);
  EXPECT_EQ(a.outputs(0).name(), "y");
  EXPECT_EQ(a.outputs(0).datatype(), "FP32");
  EXPECT_EQ(a.outputs(0).shape_size(), 2);
  ASSERT_EQ(a.outputs(0).contents().fp32_contents_size(), 3);
  EXPECT_EQ(a.outputs(0).contents().fp32_contents(2), 2.5f);
  EXPECT_EQ(a.raw_output_contents_size(), 0);

  // Every output, one of them FP16: all raw, in order.
  V2InferRequest all;
  inference::ModelInferResponse b;
  ASSERT_TRUE(EncodeGrpcInferResponse(config, all, outputs, &b).ok());
  ASSERT_EQ(b.outputs_size(), 2);
  ASSERT_EQ(b.raw_output_contents_size(), 2);
  EXPECT_FALSE(b.outputs(0).has_contents());
  float back[3];
  ASSERT_EQ(b.raw_output_contents(0).size(), sizeof(back));
  std::memcpy(back, b.raw_output_contents(0).data(), sizeof(back));
  EXPECT_EQ(back[2], 2.5f);
  EXPECT_EQ(b.raw_output_contents(1).size(), 4u);
}

}  // namespace
}  // namespace sluice
