// Random benchmark inputs.
#include "bench/payload.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <random>

namespace sluice {

uint16_t FloatToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return 0x7FC0;
  bits += 0x7FFF + ((bits >> 16) & 1);  // Round to nearest even.
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t FloatToHalf(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7E00;
  float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7C00;  // Overflows to infinity.
  if (magnitude < 6.103515625e-05f) {               // Subnormal: multiples of 2^-24.
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t exponent = ((bits >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = bits & 0x7FFFFF;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // Carries into the exponent.
  return sign | static_cast<uint16_t>(half);
}

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
