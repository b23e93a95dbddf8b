// The torch operators over the Winograd kernels (winograd_conv.h), for AOTInductor packages
// whose 3x3 stride-1 convolutions the export rewrote (tools/sluice_export.py):
//   sluice::conv3x3(Tensor input, Tensor weight, Tensor bias, Tensor? residual, bool relu)
//       -> Tensor
//       relu?(conv3x3(input) + bias + residual), padding 1, stride 1; output channels-last.
//       `weight` is OIHW 3x3 fp32, transformed and packed on its first call and kept while its
//       storage lives (a package's batch buckets, each with its own copy of the constants, share
//       one packed copy of equal weights). Changing a weight in place (a new tensor version)
//       packs it again. The tile size (4x4 or 2x2 outputs) is chosen per call by the shape
//       (winograd::ChooseTile), and the weights are packed once for each size used.
//   sluice::winograd_pack(Tensor weight) -> Tensor
//       The packed layout of 4x4 tiles itself (for tests).
// The same source is linked into the sluice binary (where a package calls the operators through
// AOTInductor's proxy executor) and built as libsluice_torch_ops.so for the export tools.
#pragma once

namespace sluice {

// Returns true; calling it keeps this file's operator registrations in a binary that links it
// from a static library.
bool TorchOpsRegistered();

}  // namespace sluice
