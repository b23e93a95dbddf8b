// For the backends' tests: the reference input/output pairs tools/export_models.py writes
// (reference<suffix>.yaml indexing raw little-endian tensors in reference<suffix>/), and the
// error measures the tests compare them with.
#pragma once

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sluice/tensor.h"

namespace sluice::testing {

struct Reference {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
};

inline Tensor ReadReferenceTensor(const std::filesystem::path& dir, const YAML::Node& entry) {
  DataType dtype = *ParseDataType(entry["datatype"].as<std::string>());
  Shape shape = entry["shape"].as<std::vector<int64_t>>();
  Tensor t = Tensor::Zeros(dtype, shape);
  std::ifstream in(dir / entry["file"].as<std::string>(), std::ios::binary);
  in.read(static_cast<char*>(t.mutable_data()), static_cast<std::streamsize>(t.byte_size()));
  EXPECT_EQ(static_cast<size_t>(in.gcount()), t.byte_size()) << entry["file"].as<std::string>();
  return t;
}

// reference.yaml (suffix "") or reference_<precision>.yaml (suffix "_<precision>") in `dir`.
inline Reference ReadReference(const std::filesystem::path& dir, const std::string& suffix = "") {
  YAML::Node index = YAML::LoadFile((dir / ("reference" + suffix + ".yaml")).string());
  const std::filesystem::path files = dir / ("reference" + suffix);
  Reference ref;
  for (const auto& e : index["inputs"]) ref.inputs.push_back(ReadReferenceTensor(files, e));
  for (const auto& e : index["outputs"]) ref.outputs.push_back(ReadReferenceTensor(files, e));
  return ref;
}

// The largest magnitude of an FP32 tensor.
inline double MaxAbs(const Tensor& t) {
  double m = 0;
  for (float v : t.values<float>()) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

// The largest element-wise difference of two FP32 tensors of the same shape.
inline double MaxAbsError(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double worst = 0;
  auto x = a.values<float>();
  auto y = b.values<float>();
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(x[i] - y[i])));
  }
  return worst;
}

}  // namespace sluice::testing
