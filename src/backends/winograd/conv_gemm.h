// Convolutions of any square kernel, stride and padding (one group, no dilation) on NHWC fp32
// data, as the product of the input's patches and the weights: for a block of output pixels at a
// time, the patches are copied into rows (im2col) and multiplied by the weights packed in panels
// of 16 output channels, with the register-blocked kernel of Conv3x3 (winograd_conv.h); the bias,
// an optional residual and an optional ReLU are applied as the block is written.
//
// For the layers Winograd does not cover (strided and 1x1 convolutions, a network's 7x7 stem):
// at small batches reading a layer's weights dominates, and this path reads them once per call
// while its next slice is prefetched.
//
// Torch-free, thread-safe like Conv3x3.
#pragma once

#include <cstdint>

#include "backends/winograd/winograd_conv.h"

namespace sluice::winograd {

struct GemmConvShape {
  int64_t batch = 0;         // Images; >= 1.
  int64_t height = 0;        // Input rows; >= 1.
  int64_t width = 0;         // Input columns; >= 1.
  int64_t in_channels = 0;   // >= 1.
  int64_t out_channels = 0;  // A multiple of 8 (the kernels' vector width), >= 8.
  int64_t kernel = 1;        // The kernel's side; >= 1.
  int64_t stride = 1;        // >= 1.
  int64_t padding = 0;       // Zeros on each side; >= 0, < kernel.

  int64_t OutHeight() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t OutWidth() const { return (width + 2 * padding - kernel) / stride + 1; }
  // Rows of the product: kernel x kernel x in_channels (one patch).
  int64_t PatchSize() const { return kernel * kernel * in_channels; }
};

// Floats in the packed weights (out_channels rounded up to a multiple of 16).
int64_t PackedGemmWeightsSize(const GemmConvShape& shape);

// Packs OIHW weights `w` (out_channels x in_channels x kernel x kernel) into `packed`
// (PackedGemmWeightsSize floats): per panel of 16 output channels, PatchSize() rows of 16 values,
// the rows in the patch's order (kernel row, kernel column, input channel).
void PackGemmWeights(const float* w, const GemmConvShape& shape, float* packed);

struct GemmConvArgs {
  const float* input = nullptr;     // NHWC, batch x height x width x in_channels.
  const float* packed = nullptr;    // PackGemmWeights' output.
  const float* bias = nullptr;      // out_channels values, or null for none.
  const float* residual = nullptr;  // NHWC like the output, added before the ReLU; or null.
  bool relu = false;                // max(0, .) applied last.
  int threads = 1;                  // Work items to aim for (the caller's thread count); >= 1.
  bool portable = false;            // The portable kernels even where AVX2 and FMA exist (tests).
  Blocking blocking;                // As for Conv3x3, a patch row standing for a tile.
  float* output = nullptr;          // NHWC, batch x OutHeight() x OutWidth() x out_channels.
};

// Whether ConvGemm takes the shape: the sizes above, and an output of at least one pixel.
bool GemmConvSupported(const GemmConvShape& shape);

// The convolution. Uses AVX2 and FMA when the CPU has them (HasFastPath()).
void ConvGemm(const GemmConvShape& shape, const GemmConvArgs& args,
              const ParallelFor& parallel_for);

}  // namespace sluice::winograd
