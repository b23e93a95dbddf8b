// IEEE half (FP16) and bfloat16 conversions, for payloads and for JSON tensors of those types.
#pragma once

#include <cstdint>

namespace sluice {

// Round to nearest even; overflow becomes infinity, NaN stays NaN.
uint16_t FloatToHalf(float value);
uint16_t FloatToBf16(float value);
// Exact.
float HalfToFloat(uint16_t half);
float Bf16ToFloat(uint16_t bf16);

}  // namespace sluice
