#include "llm/kernels/ggml_blocks.h"

#include <fmt/format.h>

#include <iterator>

namespace sluice::llm {

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kQ2_K:
      return "Q2_K";
    case GgmlType::kQ3_K:
      return "Q3_K";
    case GgmlType::kIQ4_NL:
      return "IQ4_NL";
    case GgmlType::kIQ4_XS:
      return "IQ4_XS";
    case GgmlType::kIQ3_S:
      return "IQ3_S";
    case GgmlType::kIQ2_XS:
      return "IQ2_XS";
    case GgmlType::kMXFP4:
      return "MXFP4";
  }
  // The others, by the names llama.cpp gives them, so an error says which one a file holds.
  static const char* const kOthers[] = {nullptr,   nullptr, nullptr,  nullptr, "Q4_2",    "Q4_3",
                                        "Q5_0",    "Q5_1",  nullptr,  "Q8_1",  "Q2_K",    "Q3_K",
                                        nullptr,   nullptr, nullptr,  "Q8_K",  "IQ2_XXS", "IQ2_XS",
                                        "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",   "IQ4_XS",
                                        "I8",      "I16",   "I32",    "I64",   "F64",     "IQ1_M"};
  if (type < std::size(kOthers) && kOthers[type] != nullptr) return kOthers[type];
  return fmt::format("type {}", type);
}

bool GgmlBlockLayout(uint32_t type, int64_t* elements, int64_t* bytes) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      *elements = 1, *bytes = 4;
      return true;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      *elements = 1, *bytes = 2;
      return true;
    case GgmlType::kQ4_0:
      *elements = 32, *bytes = 18;
      return true;
    case GgmlType::kQ4_1:
      *elements = 32, *bytes = 20;
      return true;
    case GgmlType::kQ5_0:
      *elements = 32, *bytes = 22;
      return true;
    case GgmlType::kQ5_1:
      *elements = 32, *bytes = 24;
      return true;
    case GgmlType::kQ8_0:
      *elements = 32, *bytes = 34;
      return true;
    case GgmlType::kQ4_K:
      *elements = 256, *bytes = 144;
      return true;
    case GgmlType::kQ5_K:
      *elements = 256, *bytes = 176;
      return true;
    case GgmlType::kQ6_K:
      *elements = 256, *bytes = 210;
      return true;
    case GgmlType::kQ2_K:  // 16 scale/min nibbles, 64 bytes of 2-bit values, d, dmin.
      *elements = 256, *bytes = 84;
      return true;
    case GgmlType::kQ3_K:  // 32 bytes of high bits, 64 of low 2 bits, 12 of 6-bit scales, d.
      *elements = 256, *bytes = 110;
      return true;
    case GgmlType::kMXFP4:  // An 8-bit power-of-two scale, 16 bytes of 4-bit FP4 (E2M1) codes.
      *elements = 32, *bytes = 17;
      return true;
    case GgmlType::kIQ4_NL:  // d, 16 bytes of 4-bit indices into a non-linear table.
      *elements = 32, *bytes = 18;
      return true;
    case GgmlType::kIQ3_S:  // d, 64 bytes of grid indices' low bits, 8 of their ninth, 32 of
                            // signs, 4 of 4-bit run scales.
      *elements = 256, *bytes = 110;
      return true;
    case GgmlType::kIQ2_XS:  // d, 32 16-bit words (a 9-bit grid index, 7 sign bits), 8 bytes of
                             // 4-bit half-run scales.
      *elements = 256, *bytes = 74;
      return true;
    case GgmlType::kIQ4_XS:  // d, 8 6-bit sub-block scales (2 + 4 bytes), 128 bytes of indices.
      *elements = 256, *bytes = 136;
      return true;
  }
  return false;
}

void Mxfp4FromOcpBlocks(const uint8_t* codes, const uint8_t* scales, int64_t count, uint8_t* out) {
  for (int64_t b = 0; b < count; ++b, codes += 16, out += 17) {
    const auto code = [&](int i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xF; };
    out[0] = scales[b];
    for (int i = 0; i < 16; ++i) out[1 + i] = static_cast<uint8_t>(code(i) | code(i + 16) << 4);
  }
}

}  // namespace sluice::llm
