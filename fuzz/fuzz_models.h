// Model configurations the fuzz targets parse against: every datatype the codec accepts, a
// variable dimension, several inputs, and an image model with preprocessing.
#pragma once

#include <string>
#include <utility>

#include "config/model_config.h"

namespace sluice::fuzz {

// What every fuzz model shares: dispatch at once, one thread.
inline ModelConfig BaseConfig(std::string name, int max_batch_size) {
  ModelConfig c;
  c.name = std::move(name);
  c.max_batch_size = max_batch_size;
  c.dynamic_batching.max_queue_delay = Micros(0);
  c.instances.threads = 1;
  return c;
}

// Three inputs (FP32 with a variable dimension, INT64, BOOL) and two outputs.
inline ModelConfig MultiInputConfig() {
  ModelConfig c = BaseConfig("multi", 8);
  c.inputs = {{"x", DataType::kFp32, {-1, 3}},
              {"ids", DataType::kInt64, {2}},
              {"mask", DataType::kBool, {2}}};
  c.outputs = {{"x", DataType::kFp32, {-1, 3}}, {"ids", DataType::kInt64, {2}}};
  return c;
}

// One input of each of the remaining datatypes, so their parsers run too.
inline ModelConfig TypesConfig() {
  ModelConfig c = BaseConfig("types", 4);
  c.inputs = {{"h", DataType::kFp16, {2}},   {"b", DataType::kBf16, {2}},
              {"d", DataType::kFp64, {1}},   {"i8", DataType::kInt8, {2}},
              {"u8", DataType::kUInt8, {2}}, {"i16", DataType::kInt16, {1}},
              {"i32", DataType::kInt32, {1}}};
  c.outputs = c.inputs;
  return c;
}

// A single FP32 input: the form the raw-body (header length 0) extension accepts.
inline ModelConfig EchoConfig() {
  ModelConfig c = BaseConfig("echo", 8);
  c.inputs = {{"x", DataType::kFp32, {4}}};
  c.outputs = {{"y", DataType::kFp32, {4}}};
  return c;
}

// A grey 8x8 image classifier (the echo backend returns the pixels as its "scores").
inline ModelConfig ImageConfig() {
  ModelConfig c = BaseConfig("image", 4);
  c.inputs = {{"image", DataType::kFp32, {1, 8, 8}}};
  c.outputs = {{"scores", DataType::kFp32, {1, 8, 8}}};
  ImagePreprocessConfig pre;
  pre.resize = 8;
  pre.crop = 8;
  pre.channels = 1;
  c.preprocess_image = pre;
  c.postprocess_topk = 3;
  return c;
}

}  // namespace sluice::fuzz
