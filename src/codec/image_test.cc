// Image decode + preprocess and base64, on images encoded here with libspng and TurboJPEG,
// including hostile ones (decompression bombs, truncation).
#include "codec/image.h"

#include <gtest/gtest.h>
#include <spng.h>
#include <turbojpeg.h>

#include <cstdlib>
#include <cstring>

#include "codec/base64.h"

namespace sluice {
namespace {

std::string EncodePng(const std::vector<uint8_t>& pixels, uint32_t width, uint32_t height,
                      uint8_t color_type) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = width;
  ihdr.height = height;
  ihdr.bit_depth = 8;
  ihdr.color_type = color_type;
  spng_set_ihdr(ctx, &ihdr);
  EXPECT_EQ(
      spng_encode_image(ctx, pixels.data(), pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
  size_t size = 0;
  int err = 0;
  void* buffer = spng_get_png_buffer(ctx, &size, &err);
  std::string png(static_cast<const char*>(buffer), size);
  std::free(buffer);
  spng_ctx_free(ctx);
  return png;
}

std::string EncodeJpeg(const std::vector<uint8_t>& rgb, int width, int height) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(
      tjCompress2(handle, rgb.data(), width, 0, height, TJPF_RGB, &out, &size, TJSAMP_444, 100, 0),
      0);
  std::string jpeg(reinterpret_cast<const char*>(out), size);
  tjFree(out);
  tjDestroy(handle);
  return jpeg;
}

uint32_t Crc32(std::string_view data) {
  uint32_t crc = 0xFFFFFFFF;
  for (char ch : data) {
    crc ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320 & (0 - (crc & 1)));
  }
  return ~crc;
}

void PutBigEndian(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + static_cast<size_t>(i)] = static_cast<char>(v >> (24 - 8 * i));
}

std::vector<uint8_t> Gradient(int width, int height, int channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 7) % 256);
  return pixels;
}

TEST(ImageTest, GreyPngDecodesExactly) {
  std::vector<uint8_t> pixels = Gradient(28, 28, 1);
  auto image = DecodeImage(EncodePng(pixels, 28, 28, SPNG_COLOR_TYPE_GRAYSCALE), 1);
  ASSERT_TRUE(image.ok()) << image.status().message();
  EXPECT_EQ(image->width, 28);
  EXPECT_EQ(image->height, 28);
  EXPECT_EQ(image->pixels, pixels);
  // The same grey image asked for as RGB: each value three times.
  auto rgb = DecodeImage(EncodePng(pixels, 28, 28, SPNG_COLOR_TYPE_GRAYSCALE), 3);
  ASSERT_TRUE(rgb.ok());
  EXPECT_EQ(rgb->pixels[3 * 5 + 2], pixels[5]);
}

TEST(ImageTest, RgbPngToGreyUsesTheLumaWeights) {
  std::vector<uint8_t> pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 10, 10};
  auto image = DecodeImage(EncodePng(pixels, 4, 1, SPNG_COLOR_TYPE_TRUECOLOR), 1);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image->pixels, (std::vector<uint8_t>{76, 150, 29, 10}));
}

TEST(ImageTest, JpegDecodesCloseToTheOriginal) {
  std::vector<uint8_t> pixels(16 * 8 * 3, 200);
  auto image = DecodeImage(EncodeJpeg(pixels, 16, 8), 3);
  ASSERT_TRUE(image.ok()) << image.status().message();
  EXPECT_EQ(image->width, 16);
  EXPECT_EQ(image->height, 8);
  for (uint8_t p : image->pixels) EXPECT_NEAR(p, 200, 2);
  auto grey = DecodeImage(EncodeJpeg(pixels, 16, 8), 1);
  ASSERT_TRUE(grey.ok());
  EXPECT_EQ(grey->pixels.size(), 16u * 8u);
}

TEST(ImageTest, DecompressionBombsAreRefusedFromTheHeader) {
  // A valid 8x8 PNG whose IHDR is rewritten to claim 30000x30000 (CRC fixed up).
  std::string png = EncodePng(Gradient(8, 8, 1), 8, 8, SPNG_COLOR_TYPE_GRAYSCALE);
  PutBigEndian(png, 16, 30000);
  PutBigEndian(png, 20, 30000);
  PutBigEndian(png, 29, Crc32(std::string_view(png).substr(12, 17)));
  auto big_png = DecodeImage(png, 1);
  EXPECT_EQ(big_png.status().code(), StatusCode::kPayloadTooLarge) << big_png.status().message();

  // A JPEG whose SOF0 frame header claims 30000x30000.
  std::string jpeg = EncodeJpeg(std::vector<uint8_t>(8 * 8 * 3, 50), 8, 8);
  size_t sof = jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  jpeg[sof + 5] = static_cast<char>(30000 >> 8);
  jpeg[sof + 6] = static_cast<char>(30000 & 0xFF);
  jpeg[sof + 7] = static_cast<char>(30000 >> 8);
  jpeg[sof + 8] = static_cast<char>(30000 & 0xFF);
  auto big_jpeg = DecodeImage(jpeg, 3);
  EXPECT_EQ(big_jpeg.status().code(), StatusCode::kPayloadTooLarge) << big_jpeg.status().message();

  ImageLimits small;
  small.max_pixels = 63;
  EXPECT_EQ(DecodeImage(EncodePng(Gradient(8, 8, 1), 8, 8, SPNG_COLOR_TYPE_GRAYSCALE), 1, small)
                .status()
                .code(),
            StatusCode::kPayloadTooLarge);
}

TEST(ImageTest, TruncatedAndForeignBytesAreClearErrors) {
  std::string png = EncodePng(Gradient(32, 32, 3), 32, 32, SPNG_COLOR_TYPE_TRUECOLOR);
  auto truncated_png = DecodeImage(png.substr(0, png.size() / 2), 3);
  EXPECT_EQ(truncated_png.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(truncated_png.status().message().find("undecodable PNG"), std::string::npos);
  std::string jpeg = EncodeJpeg(Gradient(32, 32, 3), 32, 32);
  auto truncated_jpeg = DecodeImage(jpeg.substr(0, jpeg.size() / 2), 3);
  EXPECT_EQ(truncated_jpeg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeImage("GIF89a....", 3).status().message(), "not a PNG or JPEG image");
  EXPECT_EQ(DecodeImage("", 3).status().message(), "empty image");
  EXPECT_EQ(DecodeImage(png, 2).status().code(), StatusCode::kInvalidArgument);
}

TEST(PreprocessTest, NormalisesToChwWithoutResizingWhenTheSizeFits) {
  DecodedImage image{2, 2, 1, {0, 51, 102, 255}};
  ImagePreprocessConfig p;
  p.resize = 2;
  p.crop = 2;
  p.channels = 1;
  p.mean = {0.2f};
  p.std = {0.5f};
  auto tensor = PreprocessImage(image, p);
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->shape(), (Shape{1, 2, 2}));
  auto v = tensor->values<float>();
  EXPECT_FLOAT_EQ(v[0], (0.0f - 0.2f) / 0.5f);
  EXPECT_FLOAT_EQ(v[1], (0.2f - 0.2f) / 0.5f);
  EXPECT_FLOAT_EQ(v[3], (1.0f - 0.2f) / 0.5f);
}

TEST(PreprocessTest, ResizesTheShorterSideThenCropsTheCentre) {
  DecodedImage image;
  image.width = 8;
  image.height = 4;
  image.channels = 3;
  image.pixels.resize(8 * 4 * 3);
  for (int x = 0; x < 8; ++x) {
    for (int y = 0; y < 4; ++y) {
      for (int c = 0; c < 3; ++c)
        image.pixels[static_cast<size_t>((y * 8 + x) * 3 + c)] =
            static_cast<uint8_t>(c == 0 ? 255 : 0);
    }
  }
  ImagePreprocessConfig p;
  p.resize = 2;  // 8x4 -> 4x2.
  p.crop = 2;
  auto tensor = PreprocessImage(image, p);
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->shape(), (Shape{3, 2, 2}));
  auto v = tensor->values<float>();
  EXPECT_FLOAT_EQ(v[0], 1.0f);  // Red plane.
  EXPECT_FLOAT_EQ(v[4], 0.0f);  // Green plane.
  p.crop = 3;
  EXPECT_EQ(PreprocessImage(image, p).status().code(), StatusCode::kInvalidArgument);
}

TEST(PreprocessTest, Uint8KeepsThePixelsOfTheResizedCentreCropAsHwc) {
  DecodedImage image;
  image.width = 6;
  image.height = 4;
  image.channels = 3;
  image.pixels.resize(6 * 4 * 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 5);
  ImagePreprocessConfig p;
  p.crop = 2;  // No resize: the centre 2x2 of 6x4 starts at (2, 1).
  p.mean = {0.5f};
  p.std = {0.25f};  // Not applied: raw pixels.
  auto tensor = PreprocessImageUint8(image, p);
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->dtype(), DataType::kUInt8);
  EXPECT_EQ(tensor->shape(), (Shape{2, 2, 3}));
  auto v = tensor->values<uint8_t>();
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 2; ++x) {
      for (int c = 0; c < 3; ++c) {
        size_t src = static_cast<size_t>(((y + 1) * 6 + (x + 2)) * 3 + c);
        EXPECT_EQ(v[static_cast<size_t>((y * 2 + x) * 3 + c)], image.pixels[src]);
      }
    }
  }
  // The same geometry as the FP32 path: resize then crop, and too large a crop refused.
  p.resize = 2;  // 6x4 -> 3x2.
  auto small = PreprocessImageUint8(image, p);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->shape(), (Shape{2, 2, 3}));
  auto f = PreprocessImage(image, ImagePreprocessConfig{2, 2, 3, {}, {}});
  ASSERT_TRUE(f.ok());
  auto fv = f->values<float>();
  auto sv = small->values<uint8_t>();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(fv[i] * 255.0f, static_cast<float>(sv[i * 3]), 0.5f);  // Red plane vs HWC red.
  }
  p.crop = 3;
  EXPECT_EQ(PreprocessImageUint8(image, p).status().code(), StatusCode::kInvalidArgument);
}

TEST(Base64Test, RoundTripsAndRejectsBadInput) {
  const std::vector<std::string> samples = {
      "", "f", "fo", "foo", "foob", "fooba", "foobar", std::string("\0\xff\x10", 3)};
  for (const std::string& s : samples) {
    auto decoded = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, s);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(*Base64Decode("Zm8"), "fo");  // Padding optional.
  EXPECT_EQ(*Base64Decode("data:image/png;base64,Zm9v"), "foo");
  EXPECT_NE(Base64Decode("Zm9v!A==").status().message().find("bad character at offset 4"),
            std::string::npos);
  EXPECT_EQ(Base64Decode("Zm9vY").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Base64Decode("Zm=9v").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
