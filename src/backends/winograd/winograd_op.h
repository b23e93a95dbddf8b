// The torch operators over the Winograd kernels (winograd_conv.h), for AOTInductor packages
// whose 3x3 stride-1 convolutions the export rewrote (tools/sluice_export.py):
//   sluice::winograd_pack(Tensor weight) -> Tensor
//       OIHW 3x3 fp32 weights to the kernels' transformed, packed layout (done once, at export).
//   sluice::conv3x3(Tensor input, Tensor packed, Tensor bias, Tensor? residual, bool relu)
//       -> Tensor
//       relu?(conv3x3(input) + bias + residual), padding 1, stride 1; output channels-last.
// The same source is linked into the sluice binary (where a package calls the operators through
// AOTInductor's proxy executor) and built as libsluice_torch_ops.so for the export tools.
#pragma once

namespace sluice {

// Returns true; calling it keeps this file's operator registrations in a binary that links it
// from a static library.
bool TorchOpsRegistered();

}  // namespace sluice
