// The low-bit GGUF block types (Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ2_XS, MXFP4) to fp32, from the
// block layouts ggml defines for them, written apart from the products' unpacking (quant.cc's
// UnpackChunk and the vector paths' Unpack), so that the tests check those against this.
#include <cmath>
#include <cstring>

#include "llm/kernels/ggml_grids.h"
#include "llm/kernels/internal.h"

namespace sluice::llm {
namespace {

float Half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return Fp16ToFp32(bits);
}

// IQ4's 16 levels: a non-linear grid, denser near zero.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// Q2_K: 256 values in 16 groups of 16, each with a 4-bit scale and a 4-bit min (times the
// block's d and dmin); the 2-bit values of each 128 are four planes of 32 bytes' bit pairs.
void Q2K(const uint8_t* block, float* y) {
  const uint8_t* scales = block;
  const uint8_t* q = block + 16;
  const float d = Half(block + 80), dmin = Half(block + 82);
  int group = 0;
  for (int half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part, ++group) {
        const float scale = d * static_cast<float>(scales[group] & 0xF);
        const float min = dmin * static_cast<float>(scales[group] >> 4);
        for (int l = 0; l < 16; ++l) {
          *y++ = scale * static_cast<float>((q[16 * part + l] >> shift) & 3) - min;
        }
      }
    }
  }
}

// Q3_K: 256 values in 16 groups of 16 with signed 6-bit scales (low 4 bits in the first 8 bytes'
// nibbles, high 2 bits in the last 4 bytes' bit pairs), minus 32; each value's low 2 bits as in
// Q2_K and its third bit in hmask (a clear bit subtracts 4).
void Q3K(const uint8_t* block, float* y) {
  const uint8_t* hmask = block;
  const uint8_t* q = block + 32;
  const uint8_t* packed = block + 96;
  const float d = Half(block + 108);
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int group = 0;
  uint8_t bit = 1;
  for (int half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, bit = static_cast<uint8_t>(bit << 1)) {
      for (int part = 0; part < 2; ++part, ++group) {
        const float scale = d * static_cast<float>(scales[group]);
        for (int l = 0; l < 16; ++l) {
          const int low = (q[16 * part + l] >> shift) & 3;
          const int value = low - ((hmask[16 * part + l] & bit) ? 0 : 4);
          *y++ = scale * static_cast<float>(value);
        }
      }
    }
  }
}

// IQ4_NL: 32 values, d times the level each nibble indexes (low nibbles first, then high).
void Iq4Nl(const uint8_t* block, float* y) {
  const float d = Half(block);
  const uint8_t* q = block + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4Levels[q[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4Levels[q[j] >> 4]);
  }
}

// IQ4_XS: 256 values in 8 groups of 32 as IQ4_NL's, each group's 6-bit scale (minus 32) from a
// nibble of scales_l and a bit pair of scales_h.
void Iq4Xs(const uint8_t* block, float* y) {
  const float d = Half(block);
  uint16_t scales_h;
  std::memcpy(&scales_h, block + 2, 2);
  const uint8_t* scales_l = block + 4;
  const uint8_t* q = block + 8;
  for (int group = 0; group < 8; ++group, q += 16, y += 32) {
    const int scale = (((scales_l[group / 2] >> (4 * (group % 2))) & 0xF) |
                       (((scales_h >> (2 * group)) & 3) << 4)) -
                      32;
    const float dl = d * static_cast<float>(scale);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4Levels[q[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4Levels[q[j] >> 4]);
    }
  }
}

// IQ3_S: 256 values in 8 groups of 32, each pair of groups' 4-bit scales in one byte (low nibble
// first), d (1 + 2 scale); a group's eight grid indices (a byte of qs and a bit of its qh byte
// each) name four magnitudes each, the sign bits of the group's four bytes negate them.
void Iq3S(const uint8_t* block, float* y) {
  const float d = Half(block);
  const uint8_t *qs = block + 2, *qh = block + 66, *signs = block + 74, *scales = block + 106;
  for (int group = 0; group < 8; ++group, y += 32) {
    const float dl =
        d * static_cast<float>(1 + 2 * ((scales[group / 2] >> (4 * (group % 2))) & 0xF));
    for (int index = 0; index < 8; ++index) {
      const int i = qs[8 * group + index] | (((qh[group] >> index) & 1) << 8);
      const uint32_t magnitudes = kernels::quant::kIq3sGrid[i];
      for (int j = 0; j < 4; ++j) {
        const int weight = 4 * index + j;
        const bool negative = (signs[4 * group + weight / 8] >> (weight % 8)) & 1;
        const auto magnitude = static_cast<float>((magnitudes >> (8 * j)) & 0xFF);
        y[weight] = dl * magnitude * (negative ? -1.0f : 1.0f);
      }
    }
  }
}

// IQ2_XS: 256 values in 32 groups of 8, each a 16-bit word: a 9-bit index into the grid of eight
// magnitudes, and 7 sign bits whose eighth (for the group's last value) makes an even count of
// them; 16 scales of 4 bits (two groups of 8 each, low nibble first), d (0.5 + scale) / 4.
void Iq2Xs(const uint8_t* block, float* y) {
  const float d = Half(block);
  const uint8_t *qs = block + 2, *scales = block + 66;
  for (int group = 0; group < 32; ++group, y += 8) {
    const int word = qs[2 * group] | (qs[2 * group + 1] << 8);
    const float dl =
        d * (0.5f + static_cast<float>((scales[group / 4] >> (4 * ((group / 2) % 2))) & 0xF)) *
        0.25f;
    int signs = word >> 9, parity = 0;
    for (int bit = 0; bit < 7; ++bit) parity ^= (signs >> bit) & 1;
    signs |= parity << 7;
    const uint64_t magnitudes = kernels::quant::kIq2xsGrid[word & 511];
    for (int j = 0; j < 8; ++j) {
      const auto magnitude = static_cast<float>((magnitudes >> (8 * j)) & 0xFF);
      y[j] = dl * magnitude * ((signs >> j) & 1 ? -1.0f : 1.0f);
    }
  }
}

// MXFP4: 32 values, each a 4-bit E2M1 code (sign, 2 exponent bits, a mantissa bit: 0, 0.5, 1,
// 1.5, 2, 3, 4, 6), times the block's power of two 2^(e - 127) (E8M0); low nibbles first.
void Mxfp4(const uint8_t* block, float* y) {
  const float scale = std::ldexp(1.0f, block[0] - 127);
  for (int j = 0; j < 32; ++j) {
    const int code = j < 16 ? block[1 + j] & 0xF : block[1 + j - 16] >> 4;
    const int exponent = (code >> 1) & 3, mantissa = code & 1;
    const float magnitude =
        exponent == 0 ? 0.5f * static_cast<float>(mantissa)
                      : std::ldexp(1.0f + 0.5f * static_cast<float>(mantissa), exponent - 1);
    y[j] = scale * (code & 8 ? -magnitude : magnitude);
  }
}

}  // namespace

bool IsLowBitType(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ2_XS:
    case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

void DequantizeLowBitRow(uint32_t ggml_type, const uint8_t* row, int64_t k, float* out) {
  int64_t elements = 0, bytes = 0;
  GgmlBlockLayout(ggml_type, &elements, &bytes);
  for (int64_t b = 0; b < k / elements; ++b) {
    const uint8_t* block = row + b * bytes;
    float* y = out + b * elements;
    switch (static_cast<GgmlType>(ggml_type)) {
      case GgmlType::kQ2_K:
        Q2K(block, y);
        break;
      case GgmlType::kQ3_K:
        Q3K(block, y);
        break;
      case GgmlType::kIQ4_NL:
        Iq4Nl(block, y);
        break;
      case GgmlType::kIQ4_XS:
        Iq4Xs(block, y);
        break;
      case GgmlType::kIQ3_S:
        Iq3S(block, y);
        break;
      case GgmlType::kIQ2_XS:
        Iq2Xs(block, y);
        break;
      case GgmlType::kMXFP4:
        Mxfp4(block, y);
        break;
      default:
        std::fill(y, y + elements, 0.0f);
    }
  }
}

}  // namespace sluice::llm
