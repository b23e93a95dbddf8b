// Encoders for tests and benchmarks: images made in memory with libspng and TurboJPEG, which the
// decoders under test then read back. Header-only; the including target links SPNG and
// TURBOJPEG.
#pragma once

#include <spng.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace sluice::test_images {

// A PNG of `width` x `height` 8-bit pixels of `color_type` (SPNG_COLOR_TYPE_GRAYSCALE or
// SPNG_COLOR_TYPE_TRUECOLOR), interleaved rows.
inline std::string EncodePng(const std::vector<uint8_t>& pixels, uint32_t width, uint32_t height,
                             uint8_t color_type = SPNG_COLOR_TYPE_TRUECOLOR) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = width;
  ihdr.height = height;
  ihdr.bit_depth = 8;
  ihdr.color_type = color_type;
  spng_set_ihdr(ctx, &ihdr);
  spng_encode_image(ctx, pixels.data(), pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  size_t size = 0;
  int err = 0;
  void* buffer = spng_get_png_buffer(ctx, &size, &err);
  std::string png(static_cast<const char*>(buffer), buffer ? size : 0);
  std::free(buffer);
  spng_ctx_free(ctx);
  return png;
}

// A JPEG of `width` x `height` RGB pixels; `subsampling` a TJSAMP_ value.
inline std::string EncodeJpeg(const std::vector<uint8_t>& rgb, int width, int height,
                              int quality = 100, int subsampling = TJSAMP_444) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  tjCompress2(handle, rgb.data(), width, 0, height, TJPF_RGB, &out, &size, subsampling, quality, 0);
  std::string jpeg(reinterpret_cast<const char*>(out), out ? size : 0);
  tjFree(out);
  tjDestroy(handle);
  return jpeg;
}

}  // namespace sluice::test_images
