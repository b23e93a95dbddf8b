// ggml's tensor types (the numbering of llama.cpp's files) and their blocks' sizes: what the block
// products (kernels.h) read, whatever the file that holds the blocks. No torch, no file format.
#pragma once

#include <cstdint>
#include <string>

namespace sluice::llm {

// ggml's tensor types that Sluice reads (numbering as in the format).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ2_XS = 17,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ4_XS = 23,
  kBF16 = 30,
  kMXFP4 = 39,
};

// "Q4_K", "F16", ...; for a number outside the list, "type <n>".
std::string GgmlTypeName(uint32_t type);
// Whether repacked weights of this type take the int8 tiles of many-row products (kernels.h's
// Int8TilesInUse): Q3_K, Q4_K, Q5_K, Q6_K.
constexpr bool TakesInt8Tiles(uint32_t ggml_type) {
  const auto type = static_cast<GgmlType>(ggml_type);
  return type == GgmlType::kQ3_K || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ||
         type == GgmlType::kQ6_K;
}
// Elements a block and bytes a block of a type Sluice reads; false for any other type.
bool GgmlBlockLayout(uint32_t type, int64_t* elements, int64_t* bytes);

// `count` blocks of 32 MXFP4 values as OCP MX checkpoints in safetensors hold them (the released
// gpt-oss's `*_blocks` and `*_scales`: `codes` 16 bytes a block, value 2 i in byte i's low nibble
// and 2 i + 1 in its high one; `scales` an E8M0 byte a block) into ggml's MXFP4 blocks at `out`
// (17 bytes a block: the scale, then value i in byte i's low nibble and i + 16 in its high one).
// The same values: bytes moved, nothing rounded.
void Mxfp4FromOcpBlocks(const uint8_t* codes, const uint8_t* scales, int64_t count, uint8_t* out);

}  // namespace sluice::llm
