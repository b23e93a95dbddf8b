// Image decoding (JPEG through libjpeg-turbo's TurboJPEG 2.1 API, PNG through libspng) and the
// preprocessing a model's config asks for: resize the shorter side, centre-crop, scale to [0, 1],
// normalise per channel, and lay out as CHW floats.
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
};

// Decodes a PNG or JPEG (detected from its first bytes) into `channels` (1 or 3) channels. The
// header is read first, so a small file declaring a huge image is refused before any pixel
// buffer exists. Errors are kInvalidArgument ("not a PNG or JPEG", "truncated", ...) or
// kPayloadTooLarge (over the limits).
Result<DecodedImage> DecodeImage(std::string_view bytes, int channels,
                                 const ImageLimits& limits = {});

// Applies `preprocess` to `image` and returns a [channels, height, width] FP32 tensor.
Result<Tensor> PreprocessImage(const DecodedImage& image, const ImagePreprocessConfig& preprocess);

// Applies `preprocess`'s resize and crop, not its normalisation, and returns the pixels as a
// [height, width, channels] UINT8 tensor: what a model that takes raw images (UINT8 input,
// normalised on the GPU) is given.
Result<Tensor> PreprocessImageUint8(const DecodedImage& image,
                                    const ImagePreprocessConfig& preprocess);

}  // namespace sluice
