// Image decode + preprocess and base64, on images encoded here with libspng and TurboJPEG,
// including hostile ones (decompression bombs, truncation).
#include "codec/image.h"

#include <gtest/gtest.h>
#include <spng.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "codec/base64.h"
#include "codec/image_testing.h"

namespace sluice {
namespace {

using test_images::EncodeJpeg;
using test_images::EncodePng;

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
  // (v / 255 - mean) / std, computed as one multiply-add: equal to a few float roundings.
  EXPECT_NEAR(v[0], (0.0f - 0.2f) / 0.5f, 1e-6);
  EXPECT_NEAR(v[1], (0.2f - 0.2f) / 0.5f, 1e-6);
  EXPECT_NEAR(v[3], (1.0f - 0.2f) / 0.5f, 1e-6);
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

TEST(ImageTest, JpegDecodesAtTheSmallestDctScaleKeepingTheResizeTarget) {
  const std::string jpeg = EncodeJpeg(Gradient(640, 480, 3), 640, 480);
  auto full = DecodeImage(jpeg, 3);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->width, 640);
  EXPECT_EQ(full->height, 480);
  // 200: 1/2 gives 320x240 (1/4 would give 160x120, under 200).
  auto scaled = DecodeImage(jpeg, 3, {}, 200);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->width, 320);
  EXPECT_EQ(scaled->height, 240);
  EXPECT_EQ(scaled->full_width, 640);
  EXPECT_EQ(scaled->full_height, 480);
  EXPECT_EQ(scaled->pixels.size(), size_t{320 * 240 * 3});
  // 256: 1/2 would give 240 rows; the other scales (5/8: 300 rows) have no fast inverse DCT, so
  // the whole image is decoded.
  auto whole = DecodeImage(jpeg, 3, {}, 256);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->width, 640);
  auto eighth = DecodeImage(jpeg, 3, {}, 40);  // The smallest scale there is.
  ASSERT_TRUE(eighth.ok());
  EXPECT_EQ(eighth->width, 80);
  EXPECT_EQ(eighth->height, 60);
  auto larger = DecodeImage(jpeg, 3, {}, 600);  // Larger than the image: never upscaled.
  ASSERT_TRUE(larger.ok());
  EXPECT_EQ(larger->width, 640);
  // PNGs have no DCT: always full size.
  auto png =
      DecodeImage(EncodePng(Gradient(64, 48, 3), 64, 48, SPNG_COLOR_TYPE_TRUECOLOR), 3, {}, 8);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png->width, 64);
}

TEST(PreprocessTest, AScaledDecodeKeepsTheFullSizeGeometry) {
  // A smooth image, resized to 64 and cropped to 48 from the full decode and from the 1/4
  // decode: the resize target comes from the image's own size, so the same pixels are kept.
  std::vector<uint8_t> rgb(512 * 384 * 3);
  for (int y = 0; y < 384; ++y) {
    for (int x = 0; x < 512; ++x) {
      for (int c = 0; c < 3; ++c) {
        rgb[static_cast<size_t>((y * 512 + x) * 3 + c)] =
            static_cast<uint8_t>(128 + 100 * std::sin(x / 40.0 + c) * std::cos(y / 50.0));
      }
    }
  }
  const std::string jpeg = EncodeJpeg(rgb, 512, 384);
  ImagePreprocessConfig p{64, 48, 3, {}, {}};
  auto full = DecodeImage(jpeg, 3);
  auto scaled = DecodeImage(jpeg, 3, {}, DecodeMinSide(p));
  ASSERT_TRUE(full.ok() && scaled.ok());
  EXPECT_LT(scaled->width, 512);
  auto a = PreprocessImage(*full, p);
  auto b = PreprocessImage(*scaled, p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->shape(), (Shape{3, 48, 48}));
  EXPECT_EQ(b->shape(), a->shape());
  auto av = a->values<float>();
  auto bv = b->values<float>();
  double worst = 0;
  for (size_t i = 0; i < av.size(); ++i) worst = std::max(worst, std::abs(double{av[i] - bv[i]}));
  EXPECT_LT(worst * 255, 4.0);  // Within a few 8-bit steps: the same place, filtered alike.
}

TEST(PreprocessTest, DownscalingAveragesEverySourcePixel) {
  // One-pixel black and white columns, downscaled 4x: a filter that skips source pixels (plain
  // bilinear samples two of every four) gives solid black or white; PIL's widened filter, grey.
  DecodedImage stripes{64, 16, 1, std::vector<uint8_t>(64 * 16)};
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 64; x += 2) stripes.pixels[static_cast<size_t>(y * 64 + x)] = 255;
  }
  auto t = PreprocessImage(stripes, ImagePreprocessConfig{4, 0, 1, {}, {}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (Shape{1, 4, 16}));
  for (float v : t->values<float>()) EXPECT_NEAR(v, 0.5f, 0.05f);
  auto u8 = PreprocessImageUint8(stripes, ImagePreprocessConfig{4, 0, 1, {}, {}});
  ASSERT_TRUE(u8.ok());
  for (uint8_t v : u8->values<uint8_t>()) EXPECT_NEAR(v, 128, 13);
}

TEST(PreprocessTest, GeometryFollowsTorchvision) {
  // Resize truncates the longer side (torchvision: int(256 * 500 / 375) = 341, not 341.33
  // rounded) and CenterCrop rounds its offset half to even.
  DecodedImage image{110, 150, 1, std::vector<uint8_t>(110 * 150, 7)};
  auto t = PreprocessImageUint8(image, ImagePreprocessConfig{40, 0, 1, {}, {}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (Shape{54, 40, 1}));  // 40 * 150 / 110 = 54.5.
  DecodedImage wide{53, 32, 1, std::vector<uint8_t>(53 * 32)};
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 53; ++x)
      wide.pixels[static_cast<size_t>(y * 53 + x)] = static_cast<uint8_t>(x);
  }
  auto crop = PreprocessImageUint8(wide, ImagePreprocessConfig{0, 32, 1, {}, {}});
  ASSERT_TRUE(crop.ok());
  EXPECT_EQ(crop->values<uint8_t>()[0], 10);  // round(21 / 2) = round(10.5) = 10.
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
