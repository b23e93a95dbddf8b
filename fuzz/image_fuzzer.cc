// PNG/JPEG decoding and preprocessing (resize, crop, normalise) of arbitrary bytes.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "codec/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the channels and the preprocessing; the rest is the file.
  const uint8_t knobs = data[0];
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  sluice::ImageLimits limits;
  limits.max_pixels = 1 << 20;  // Keeps each run fast; the limit logic is what is exercised.
  limits.max_side = 4096;
  const int channels = knobs & 1 ? 3 : 1;
  auto image = sluice::DecodeImage(bytes, channels, limits);
  if (!image.ok()) return 0;
  if (image->width <= 0 || image->height <= 0 || image->channels != channels ||
      image->pixels.size() != size_t(image->width) * image->height * channels) {
    std::abort();
  }
  sluice::ImagePreprocessConfig pre;
  pre.channels = channels;
  pre.resize = (knobs >> 1) & 7 ? 1 + ((knobs >> 1) & 7) * 4 : 0;  // 0 or 5..29.
  pre.crop = pre.resize > 0 && (knobs & 16) ? pre.resize - (knobs >> 5) % pre.resize : 0;
  pre.mean.assign(channels, 0.5f);
  pre.std.assign(channels, 0.25f);
  auto tensor = sluice::PreprocessImage(*image, pre);
  if (tensor.ok() && tensor->shape().at(0) != channels) std::abort();
  return 0;
}
