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

// The smallest of the DCT scales 1/2, 1/4 and 1/8 whose shorter side stays >= min_side; {1, 1}
// when none does. libjpeg-turbo has SIMD inverse DCTs for these; its other scales (3/4, 5/8, ...)
// run a scalar one that costs more than decoding at full size (a 500 x 375 photo: 0.99 ms at
// 3/4 against 0.60 ms whole, benchmarks/image_stages_benchmark.cc).
tjscalingfactor JpegScale(int width, int height, int min_side) {
  tjscalingfactor best{1, 1};
  if (min_side <= 0) return best;
  for (int denom : {2, 4, 8}) {
    const tjscalingfactor f{1, denom};
    if (std::min(TJSCALED(width, f), TJSCALED(height, f)) < min_side) break;
    best = f;
  }
  return best;
}

Result<DecodedImage> DecodeJpeg(std::string_view bytes, int channels, const ImageLimits& limits,
                                int min_side) {
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
  const tjscalingfactor scale = JpegScale(width, height, min_side);
  DecodedImage image;
  image.width = TJSCALED(width, scale);
  image.height = TJSCALED(height, scale);
  image.full_width = width;
  image.full_height = height;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(image.width) * static_cast<size_t>(image.height) *
                      static_cast<size_t>(channels));
  if (tjDecompress2(handle.h, data, size, image.pixels.data(), image.width, 0, image.height,
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

}  // namespace

Result<DecodedImage> DecodeImage(std::string_view bytes, int channels, const ImageLimits& limits,
                                 int min_side) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(
        fmt::format("images decode to 1 or 3 channels, not {}", channels));
  }
  if (bytes.empty()) return Status::InvalidArgument("empty image");
  if (IsPng(bytes)) return DecodePng(bytes, channels, limits);
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, channels, limits, min_side);
  return Status::InvalidArgument("not a PNG or JPEG image");
}

int DecodeMinSide(const ImagePreprocessConfig& preprocess) {
  return std::max(preprocess.resize, 0);
}

namespace {

// The source pixels each output pixel of a resize along one axis reads, and their weights: PIL's
// bilinear (triangle) filter, whose support widens by the downscale factor so that every source
// pixel counts (torchvision's Resize on PIL images). Kept for outputs [first, first + count) only.
struct Taps {
  std::vector<int> start;      // First source index of each output.
  std::vector<int> size;       // Taps of each output.
  std::vector<float> weights;  // `stride` per output, normalised to sum 1.
  int stride = 0;
};

Taps ComputeTaps(int in_size, int out_size, int first, int count) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // The triangle's support is 1, stretched.
  Taps t;
  t.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(static_cast<size_t>(count));
  t.size.resize(static_cast<size_t>(count));
  t.weights.assign(static_cast<size_t>(count) * static_cast<size_t>(t.stride), 0.0f);
  for (int i = 0; i < count; ++i) {
    const double center = (first + i + 0.5) * scale;
    int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    hi = std::min(hi, lo + t.stride);
    double total = 0;
    float* w = &t.weights[static_cast<size_t>(i) * static_cast<size_t>(t.stride)];
    for (int j = lo; j < hi; ++j) {
      const double x = std::abs((j - center + 0.5) / filter_scale);
      const double v = x < 1.0 ? 1.0 - x : 0.0;
      w[j - lo] = static_cast<float>(v);
      total += v;
    }
    if (total > 0) {
      for (int j = 0; j < hi - lo; ++j) w[j] = static_cast<float>(w[j] / total);
    }
    t.start[static_cast<size_t>(i)] = lo;
    t.size[static_cast<size_t>(i)] = hi - lo;
  }
  return t;
}

// Where the kept pixels come from: the resized size (computed from the image's own size, whatever
// scale it was decoded at) and the crop window in it.
struct Geometry {
  int resized_width = 0, resized_height = 0;
  int left = 0, top = 0, width = 0, height = 0;
};

Result<Geometry> GeometryOf(const DecodedImage& image, const ImagePreprocessConfig& p) {
  const int full_w = image.full_width > 0 ? image.full_width : image.width;
  const int full_h = image.full_height > 0 ? image.full_height : image.height;
  Geometry g{full_w, full_h};
  if (p.resize > 0) {
    // The shorter side becomes `resize`, keeping the aspect ratio; the longer one is truncated,
    // as torchvision's Resize computes it.
    if (full_w <= full_h) {
      g.resized_width = p.resize;
      g.resized_height = static_cast<int>(static_cast<int64_t>(p.resize) * full_h / full_w);
    } else {
      g.resized_height = p.resize;
      g.resized_width = static_cast<int>(static_cast<int64_t>(p.resize) * full_w / full_h);
    }
    g.resized_width = std::max(g.resized_width, 1);
    g.resized_height = std::max(g.resized_height, 1);
  } else if (image.width != full_w || image.height != full_h) {
    return Status::Internal("an image decoded at a reduced scale needs a resize");
  }
  g.width = g.resized_width;
  g.height = g.resized_height;
  if (p.crop > 0) {
    if (p.crop > g.resized_width || p.crop > g.resized_height) {
      return Status::InvalidArgument(fmt::format("image of {}x{} is smaller than the {}x{} crop",
                                                 g.resized_width, g.resized_height, p.crop,
                                                 p.crop));
    }
    g.width = g.height = p.crop;
    // torchvision's CenterCrop: round((size - crop) / 2), halves to even (Python's round).
    auto offset = [&](int size) {
      return static_cast<int>(std::nearbyint(static_cast<double>(size - p.crop) / 2.0));
    };
    g.left = offset(g.resized_width);
    g.top = offset(g.resized_height);
  }
  return g;
}

// Resamples `image` to the crop window of `g` and hands each output pixel's channel values (as
// floats on the 0..255 scale) to `store(x, y, channel, value)`. One pass: per output row, the
// vertical taps are summed into a row of floats over the source columns the crop reads (a loop
// the compiler vectorises), then the horizontal taps read that row.
template <typename Store>
void Resample(const DecodedImage& image, const Geometry& g, Store&& store) {
  const int c = image.channels;
  const bool same = image.width == g.resized_width && image.height == g.resized_height;
  if (same) {  // No resize: the crop's pixels as they are.
    for (int y = 0; y < g.height; ++y) {
      const uint8_t* row =
          image.pixels.data() + (static_cast<size_t>(y + g.top) * static_cast<size_t>(image.width) +
                                 static_cast<size_t>(g.left)) *
                                    static_cast<size_t>(c);
      for (int x = 0; x < g.width; ++x) {
        for (int k = 0; k < c; ++k) store(x, y, k, static_cast<float>(row[x * c + k]));
      }
    }
    return;
  }
  const Taps tx = ComputeTaps(image.width, g.resized_width, g.left, g.width);
  const Taps ty = ComputeTaps(image.height, g.resized_height, g.top, g.height);
  const int x_lo = tx.start.front();
  const int x_hi = tx.start.back() + tx.size.back();
  const size_t span = static_cast<size_t>(x_hi - x_lo) * static_cast<size_t>(c);
  thread_local std::vector<float> row;
  row.resize(span);
  for (int y = 0; y < g.height; ++y) {
    std::fill(row.begin(), row.end(), 0.0f);
    const float* wy = &ty.weights[static_cast<size_t>(y) * static_cast<size_t>(ty.stride)];
    for (int t = 0; t < ty.size[static_cast<size_t>(y)]; ++t) {
      const uint8_t* src =
          image.pixels.data() + (static_cast<size_t>(ty.start[static_cast<size_t>(y)] + t) *
                                     static_cast<size_t>(image.width) +
                                 static_cast<size_t>(x_lo)) *
                                    static_cast<size_t>(c);
      const float w = wy[t];
      float* dst = row.data();
      for (size_t i = 0; i < span; ++i) dst[i] += w * static_cast<float>(src[i]);
    }
    for (int x = 0; x < g.width; ++x) {
      const float* wx = &tx.weights[static_cast<size_t>(x) * static_cast<size_t>(tx.stride)];
      const float* src = row.data() + static_cast<size_t>(tx.start[static_cast<size_t>(x)] - x_lo) *
                                          static_cast<size_t>(c);
      const int taps = tx.size[static_cast<size_t>(x)];
      for (int k = 0; k < c; ++k) {
        float v = 0;
        for (int t = 0; t < taps; ++t) v += wx[t] * src[t * c + k];
        store(x, y, k, v);
      }
    }
  }
}

}  // namespace

Result<Tensor> PreprocessImageUint8(const DecodedImage& image, const ImagePreprocessConfig& p) {
  auto g = GeometryOf(image, p);
  if (!g.ok()) return g.status();
  const int c = image.channels;
  Tensor tensor = Tensor::Uninitialized(DataType::kUInt8, {g->height, g->width, c});
  auto* out = static_cast<uint8_t*>(tensor.mutable_data());
  const size_t w = static_cast<size_t>(g->width);
  Resample(image, *g, [&](int x, int y, int k, float v) {
    out[(static_cast<size_t>(y) * w + static_cast<size_t>(x)) * static_cast<size_t>(c) +
        static_cast<size_t>(k)] = static_cast<uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
  });
  return tensor;
}

Result<Tensor> PreprocessImage(const DecodedImage& image, const ImagePreprocessConfig& p) {
  auto g = GeometryOf(image, p);
  if (!g.ok()) return g.status();
  const int c = image.channels;
  Tensor tensor = Tensor::Uninitialized(DataType::kFp32, {c, g->height, g->width});
  float* out = tensor.mutable_values<float>().data();
  // (v / 255 - mean) / std as one multiply-add per value.
  float scale[3], bias[3];
  for (int k = 0; k < c; ++k) {
    const float mean = k < static_cast<int>(p.mean.size()) ? p.mean[static_cast<size_t>(k)] : 0.0f;
    const float std = k < static_cast<int>(p.std.size()) ? p.std[static_cast<size_t>(k)] : 1.0f;
    scale[k] = 1.0f / (255.0f * std);
    bias[k] = -mean / std;
  }
  const size_t plane = static_cast<size_t>(g->width) * static_cast<size_t>(g->height);
  const size_t w = static_cast<size_t>(g->width);
  Resample(image, *g, [&](int x, int y, int k, float v) {
    out[static_cast<size_t>(k) * plane + static_cast<size_t>(y) * w + static_cast<size_t>(x)] =
        v * scale[k] + bias[k];
  });
  return tensor;
}

Result<Tensor> PreprocessPixels(const Tensor& pixels, const ImagePreprocessConfig& p) {
  const Shape& shape = pixels.shape();
  if (pixels.dtype() != DataType::kUInt8 || shape.size() != 4 || shape[3] != p.channels) {
    return Status::InvalidArgument(
        fmt::format("raw pixels are UINT8 [batch, height, width, {}], not {} {}", p.channels,
                    DataTypeName(pixels.dtype()), ShapeToString(shape)));
  }
  if (shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
    return Status::InvalidArgument(
        fmt::format("raw pixels of shape {} hold no image", ShapeToString(shape)));
  }
  DecodedImage image;
  image.width = static_cast<int>(shape[2]);
  image.height = static_cast<int>(shape[1]);
  image.channels = p.channels;
  const size_t sample_bytes =
      static_cast<size_t>(shape[1]) * static_cast<size_t>(shape[2]) * static_cast<size_t>(shape[3]);
  const auto* bytes = static_cast<const uint8_t*>(pixels.data());
  Tensor out;
  size_t out_sample = 0;
  for (int64_t n = 0; n < shape[0]; ++n) {
    const uint8_t* sample = bytes + static_cast<size_t>(n) * sample_bytes;
    image.pixels.assign(sample, sample + sample_bytes);
    auto one = PreprocessImage(image, p);
    if (!one.ok()) return one.status();
    if (n == 0) {
      Shape batch = one->shape();
      batch.insert(batch.begin(), shape[0]);
      out = Tensor::Uninitialized(DataType::kFp32, batch);
      out_sample = one->byte_size();
    }
    std::memcpy(static_cast<uint8_t*>(out.mutable_data()) + static_cast<size_t>(n) * out_sample,
                one->data(), out_sample);
  }
  return out;
}

}  // namespace sluice
