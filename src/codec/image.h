// Image decoding (JPEG through libjpeg-turbo's TurboJPEG 2.1 API, PNG through libspng) and the
// preprocessing a model's config asks for: resize the shorter side, centre-crop, scale to [0, 1],
// normalise per channel, and lay out as CHW floats.
//
// A JPEG is decoded at the smallest of libjpeg-turbo's DCT scales 1/2, 1/4 and 1/8 that keeps the
// shorter side at or above the resize target: a 4032 x 3024 photo for a 256-pixel resize decodes
// at 1/8, 64 times fewer pixels to inverse-transform, colour-convert and resize. The resize is
// PIL's bilinear filter (the one torchvision's Resize runs on PIL images: its support widens with
// the downscale, so nothing aliases), computed only for the pixels the centre crop keeps, with the
// crop, the scaling and the normalisation in the same pass: one pass over the rows the crop needs,
// vertical taps into a row of floats, horizontal taps straight into the output tensor.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "config/model_config.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

struct ImageLimits {
  int64_t max_pixels = 40'000'000;  // Width x height; larger images are refused before decoding.
  int max_side = 16384;             // Either dimension.
};

// Interleaved 8-bit pixels, row-major (HWC).
struct DecodedImage {
  int width = 0;
  int height = 0;
  int channels = 0;  // 1 (grey) or 3 (RGB).
  std::vector<uint8_t> pixels;
  // The image's own size when it was decoded at a reduced DCT scale (the resize target is computed
  // from it, so the geometry does not depend on the scale); 0: width and height.
  int full_width = 0;
  int full_height = 0;
};

// Decodes a PNG or JPEG (detected from its first bytes) into `channels` (1 or 3) channels. The
// header is read first, so a small file declaring a huge image is refused before any pixel
// buffer exists. Errors are kInvalidArgument ("not a PNG or JPEG", "truncated", ...) or
// kPayloadTooLarge (over the limits). `min_side` > 0 lets a JPEG decode at a reduced DCT scale
// whose shorter side is still >= min_side (the file comment); 0 decodes at full size.
Result<DecodedImage> DecodeImage(std::string_view bytes, int channels,
                                 const ImageLimits& limits = {}, int min_side = 0);

// The shorter side a decode for `preprocess` needs: its resize target; 0 (full size) without a
// resize, where the crop is taken from the image's own pixels.
int DecodeMinSide(const ImagePreprocessConfig& preprocess);

// Applies `preprocess` to `image` and returns a [channels, height, width] FP32 tensor.
Result<Tensor> PreprocessImage(const DecodedImage& image, const ImagePreprocessConfig& preprocess);

// Applies `preprocess`'s resize and crop, not its normalisation, and returns the pixels as a
// [height, width, channels] UINT8 tensor: what a model that takes raw images (UINT8 input,
// normalised on the GPU) is given.
Result<Tensor> PreprocessImageUint8(const DecodedImage& image,
                                    const ImagePreprocessConfig& preprocess);

// Raw pixels sent as a tensor: a UINT8 [N, H, W, C] batch (any H and W, C = preprocess.channels)
// for a model whose input is an FP32 image (preprocess.image). Each sample is resized, cropped
// and normalised as a decoded image is; the result is FP32 [N, C, h, w].
Result<Tensor> PreprocessPixels(const Tensor& pixels, const ImagePreprocessConfig& preprocess);

}  // namespace sluice
