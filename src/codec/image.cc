// Image decoding and preprocessing.
#include "codec/image.h"

#include <fmt/format.h>
#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace sluice {
namespace {

bool IsPng(std::string_view b) { return b.size() >= 8 && b.substr(0, 8) == "\x89PNG\r\n\x1a\n"; }
bool IsJpeg(std::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF &&
         static_cast<uint8_t>(b[1]) == 0xD8 && static_cast<uint8_t>(b[2]) == 0xFF;
}

Status CheckSize(int64_t width, int64_t height, const ImageLimits& limits) {
  if (width <= 0 || height <= 0) return Status::InvalidArgument("image has no pixels");
  if (width > limits.max_side || height > limits.max_side || width * height > limits.max_pixels) {
    return Status::PayloadTooLarge(
        fmt::format("image of {}x{} pixels exceeds the limit ({} pixels, {} per side)", width,
                    height, limits.max_pixels, limits.max_side));
  }
  return Status::Ok();
}

Result<DecodedImage> DecodeJpeg(std::string_view bytes, int channels, const ImageLimits& limits) {
  // One decompressor per thread, reused: creating one costs more than decoding a small image.
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h) tjDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) return Status::Internal("cannot create a JPEG decompressor");
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle.h, data, size, &width, &height, &subsampling, &colorspace) != 0) {
    return Status::InvalidArgument(fmt::format("undecodable JPEG: {}", tjGetErrorStr2(handle.h)));
  }
  SLUICE_RETURN_IF_ERROR(CheckSize(width, height, limits));
  DecodedImage image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(width) * static_cast<size_t>(height) *
                      static_cast<size_t>(channels));
  if (tjDecompress2(handle.h, data, size, image.pixels.data(), width, 0, height,
                    channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
    return Status::InvalidArgument(fmt::format("undecodable JPEG: {}", tjGetErrorStr2(handle.h)));
  }
  return image;
}

Result<DecodedImage> DecodePng(std::string_view bytes, int channels, const ImageLimits& limits) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(0), spng_ctx_free);
  if (!ctx) return Status::Internal("cannot create a PNG decoder");
  auto fail = [](std::string_view what, int err) {
    return Status::InvalidArgument(
        fmt::format("undecodable PNG ({}): {}", what, spng_strerror(err)));
  };
  int err = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  if (err) return fail("buffer", err);
  // Bounds for the decoder itself, besides the check below: no chunk may claim more memory
  // than the file could hold.
  spng_set_image_limits(ctx.get(), static_cast<uint32_t>(limits.max_side),
                        static_cast<uint32_t>(limits.max_side));
  spng_set_chunk_limits(ctx.get(), bytes.size() + 1024, bytes.size() + 1024);
  spng_ihdr ihdr{};
  if ((err = spng_get_ihdr(ctx.get(), &ihdr))) {
    if (err == SPNG_EWIDTH || err == SPNG_EHEIGHT || err == SPNG_EUSER_WIDTH ||
        err == SPNG_EUSER_HEIGHT) {
      return Status::PayloadTooLarge(
          fmt::format("PNG dimensions exceed the limit of {} per side", limits.max_side));
    }
    return fail("header", err);
  }
  SLUICE_RETURN_IF_ERROR(CheckSize(ihdr.width, ihdr.height, limits));
  // Grey 8-bit sources decode straight to grey; everything else through RGB.
  const bool grey_source = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth == 8;
  const int format = channels == 1 && grey_source ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
  size_t size = 0;
  if ((err = spng_decoded_image_size(ctx.get(), format, &size))) return fail("size", err);
  std::vector<uint8_t> decoded(size);
  if ((err = spng_decode_image(ctx.get(), decoded.data(), size, format, SPNG_DECODE_TRNS))) {
    return fail("data", err);
  }
  DecodedImage image;
  image.width = static_cast<int>(ihdr.width);
  image.height = static_cast<int>(ihdr.height);
  image.channels = channels;
  if (format == SPNG_FMT_G8 || channels == 3) {
    image.pixels = std::move(decoded);
  } else {
    // RGB to grey with ITU-R 601 luma in 16-bit fixed point, as PIL's "L" conversion does.
    const size_t n = static_cast<size_t>(image.width) * static_cast<size_t>(image.height);
    image.pixels.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t r = decoded[3 * i], g = decoded[3 * i + 1], b = decoded[3 * i + 2];
      image.pixels[i] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
    }
  }
  return image;
}

// Bilinear resize with pixel centres at +0.5 (align_corners = false), per channel.
DecodedImage Resize(const DecodedImage& in, int width, int height) {
  DecodedImage out;
  out.width = width;
  out.height = height;
  out.channels = in.channels;
  out.pixels.resize(static_cast<size_t>(width) * static_cast<size_t>(height) *
                    static_cast<size_t>(in.channels));
  const float sx = static_cast<float>(in.width) / static_cast<float>(width);
  const float sy = static_cast<float>(in.height) / static_cast<float>(height);
  const int c = in.channels;
  for (int y = 0; y < height; ++y) {
    float fy = std::max(0.0f, (static_cast<float>(y) + 0.5f) * sy - 0.5f);
    int y0 = std::min(static_cast<int>(fy), in.height - 1);
    int y1 = std::min(y0 + 1, in.height - 1);
    float wy = fy - static_cast<float>(y0);
    for (int x = 0; x < width; ++x) {
      float fx = std::max(0.0f, (static_cast<float>(x) + 0.5f) * sx - 0.5f);
      int x0 = std::min(static_cast<int>(fx), in.width - 1);
      int x1 = std::min(x0 + 1, in.width - 1);
      float wx = fx - static_cast<float>(x0);
      for (int k = 0; k < c; ++k) {
        auto at = [&](int yy, int xx) {
          return static_cast<float>(
              in.pixels[(static_cast<size_t>(yy) * static_cast<size_t>(in.width) +
                         static_cast<size_t>(xx)) *
                            static_cast<size_t>(c) +
                        static_cast<size_t>(k)]);
        };
        float top = at(y0, x0) * (1 - wx) + at(y0, x1) * wx;
        float bottom = at(y1, x0) * (1 - wx) + at(y1, x1) * wx;
        float v = top * (1 - wy) + bottom * wy;
        out.pixels[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) *
                       static_cast<size_t>(c) +
                   static_cast<size_t>(k)] =
            static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
  return out;
}

}  // namespace

Result<DecodedImage> DecodeImage(std::string_view bytes, int channels, const ImageLimits& limits) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(
        fmt::format("images decode to 1 or 3 channels, not {}", channels));
  }
  if (bytes.empty()) return Status::InvalidArgument("empty image");
  if (IsPng(bytes)) return DecodePng(bytes, channels, limits);
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, channels, limits);
  return Status::InvalidArgument("not a PNG or JPEG image");
}

namespace {

// The region of an image (resized when `preprocess` says so) that preprocessing keeps.
struct CropView {
  DecodedImage resized;  // Holds the pixels when the image was resized.
  bool was_resized = false;
  int left = 0, top = 0, width = 0, height = 0;
  const DecodedImage& source(const DecodedImage& original) const {
    return was_resized ? resized : original;
  }
};

Result<CropView> ResizeAndCrop(const DecodedImage& image, const ImagePreprocessConfig& p) {
  CropView view;
  if (p.resize > 0) {
    // The shorter side becomes `resize`, keeping the aspect ratio.
    int width, height;
    if (image.width <= image.height) {
      width = p.resize;
      height =
          static_cast<int>(std::lround(static_cast<double>(image.height) * p.resize / image.width));
    } else {
      height = p.resize;
      width =
          static_cast<int>(std::lround(static_cast<double>(image.width) * p.resize / image.height));
    }
    if (width != image.width || height != image.height) {
      view.resized = Resize(image, std::max(width, 1), std::max(height, 1));
      view.was_resized = true;
    }
  }
  const DecodedImage& current = view.source(image);
  view.width = current.width;
  view.height = current.height;
  if (p.crop > 0) {
    if (p.crop > current.width || p.crop > current.height) {
      return Status::InvalidArgument(fmt::format("image of {}x{} is smaller than the {}x{} crop",
                                                 current.width, current.height, p.crop, p.crop));
    }
    view.width = view.height = p.crop;
    view.left = (current.width - p.crop) / 2;
    view.top = (current.height - p.crop) / 2;
  }
  return view;
}

}  // namespace

Result<Tensor> PreprocessImageUint8(const DecodedImage& image, const ImagePreprocessConfig& p) {
  auto view = ResizeAndCrop(image, p);
  if (!view.ok()) return view.status();
  const DecodedImage& current = view->source(image);
  const size_t c = static_cast<size_t>(current.channels);
  const size_t row_bytes = static_cast<size_t>(view->width) * c;
  Tensor tensor =
      Tensor::Uninitialized(DataType::kUInt8, {view->height, view->width, current.channels});
  auto* out = static_cast<uint8_t*>(tensor.mutable_data());
  for (int y = 0; y < view->height; ++y) {
    const uint8_t* row = current.pixels.data() +
                         (static_cast<size_t>(y + view->top) * static_cast<size_t>(current.width) +
                          static_cast<size_t>(view->left)) *
                             c;
    std::memcpy(out + static_cast<size_t>(y) * row_bytes, row, row_bytes);
  }
  return tensor;
}

Result<Tensor> PreprocessImage(const DecodedImage& image, const ImagePreprocessConfig& p) {
  auto view = ResizeAndCrop(image, p);
  if (!view.ok()) return view.status();
  const DecodedImage* current = &view->source(image);
  const int out_w = view->width, out_h = view->height, left = view->left, top = view->top;
  const int c = current->channels;
  Tensor tensor = Tensor::Uninitialized(DataType::kFp32, {c, out_h, out_w});
  float* out = tensor.mutable_values<float>().data();
  for (int k = 0; k < c; ++k) {
    const float mean = k < static_cast<int>(p.mean.size()) ? p.mean[static_cast<size_t>(k)] : 0.0f;
    const float inv_std =
        1.0f / (k < static_cast<int>(p.std.size()) ? p.std[static_cast<size_t>(k)] : 1.0f);
    for (int y = 0; y < out_h; ++y) {
      const uint8_t* row = current->pixels.data() +
                           (static_cast<size_t>(y + top) * static_cast<size_t>(current->width) +
                            static_cast<size_t>(left)) *
                               static_cast<size_t>(c);
      float* dst =
          out + (static_cast<size_t>(k) * static_cast<size_t>(out_h) + static_cast<size_t>(y)) *
                    static_cast<size_t>(out_w);
      for (int x = 0; x < out_w; ++x) {
        dst[x] =
            (static_cast<float>(row[static_cast<size_t>(x * c + k)]) / 255.0f - mean) * inv_std;
      }
    }
  }
  return tensor;
}

}  // namespace sluice
