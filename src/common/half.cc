// FP16 and bfloat16 conversions.
#include "common/half.h"

#include <bit>
#include <cmath>

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

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1F;
  const uint32_t mantissa = half & 0x3FF;
  if (exponent == 0) {  // Zero or subnormal: mantissa x 2^-24.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

float Bf16ToFloat(uint16_t bf16) { return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16); }

}  // namespace sluice
