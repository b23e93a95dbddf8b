// The per-block kernels of Conv3x3 (winograd_conv.h), compiled twice: with AVX2 and FMA
// (winograd_avx2.cc) and for any x86-64 or other CPU (winograd_generic.cc), from the same source
// (winograd_kernels.inc). Internal to winograd_conv.cc.
#pragma once

#include <cstdint>

#include "backends/winograd/winograd_conv.h"

namespace sluice::winograd {

inline constexpr int64_t kPanel = 16;  // Output channels per packed weight panel.

// One unit of work: tiles [tile_begin, tile_begin + tile_count) of the whole batch (numbered
// image by image, row by row, args->tile outputs a side each) and output panels
// [panel_begin, panel_end).
struct BlockJob {
  const ConvShape* shape = nullptr;
  const ConvArgs* args = nullptr;
  int64_t tile_begin = 0;
  int64_t tile_count = 0;
  int64_t panel_begin = 0;
  int64_t panel_end = 0;
  float* v = nullptr;  // Scratch: Points(args->tile) * VPointStride() floats.
  float* m = nullptr;  // Scratch: Points(args->tile) * MPointStride() floats.

  // Floats from one transform point's rows to the next's in v and m. One cache line more than
  // the rows need: the points' rows are read and written together, and at a stride of a
  // multiple of 4 KiB they would all fall in the same few sets of the L1 cache.
  int64_t VPointStride() const { return tile_count * shape->in_channels + 16; }
  int64_t MStride() const { return kPanel * (panel_end - panel_begin); }
  int64_t MPointStride() const { return tile_count * MStride() + 16; }
};

namespace avx2 {
void RunBlock(const BlockJob& job);
}
namespace generic {
void RunBlock(const BlockJob& job);
}

}  // namespace sluice::winograd
