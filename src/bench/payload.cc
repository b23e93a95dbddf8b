// Random benchmark inputs.
#include "bench/payload.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <random>

namespace sluice {

Result<std::vector<Tensor>> MakeRandomInputs(const ModelConfig& config, int batch_size,
                                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 9);
  std::vector<Tensor> inputs;
  for (const TensorSpec& spec : config.inputs) {
    Shape shape{batch_size};
    for (int64_t d : spec.shape) {
      if (d < 0) {
        return Status::InvalidArgument(
            fmt::format("input '{}' has a variable dimension {}; random payloads need fixed shapes",
                        spec.name, ShapeToString(spec.shape)));
      }
      shape.push_back(d);
    }
    Tensor t = Tensor::Zeros(spec.datatype, std::move(shape));
    auto fill = [&](auto span, auto make) {
      for (auto& v : span) v = make();
    };
    switch (spec.datatype) {
      case DataType::kFp32:
        fill(t.mutable_values<float>(), [&] { return normal(rng); });
        break;
      case DataType::kFp64:
        fill(t.mutable_values<double>(), [&] { return double{normal(rng)}; });
        break;
      case DataType::kFp16:
        fill(t.mutable_values<uint16_t>(), [&] { return FloatToHalf(normal(rng)); });
        break;
      case DataType::kBf16:
        fill(t.mutable_values<uint16_t>(), [&] { return FloatToBf16(normal(rng)); });
        break;
      case DataType::kBool:
        fill(t.mutable_values<uint8_t>(), [&] { return uint8_t(small(rng) & 1); });
        break;
      case DataType::kUInt8:
        fill(t.mutable_values<uint8_t>(), [&] { return uint8_t(small(rng)); });
        break;
      case DataType::kInt8:
        fill(t.mutable_values<int8_t>(), [&] { return int8_t(small(rng)); });
        break;
      case DataType::kInt16:
        fill(t.mutable_values<int16_t>(), [&] { return int16_t(small(rng)); });
        break;
      case DataType::kInt32:
        fill(t.mutable_values<int32_t>(), [&] { return int32_t(small(rng)); });
        break;
      case DataType::kInt64:
        fill(t.mutable_values<int64_t>(), [&] { return int64_t(small(rng)); });
        break;
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

}  // namespace sluice
