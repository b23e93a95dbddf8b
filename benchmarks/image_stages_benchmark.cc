// An image request's stages before the model, per image, for ResNet-18's preprocessing (shorter
// side resized to 256, centre crop 224, ImageNet normalisation, CHW floats):
//   BM_Decode/W/H/S:     DecodeImage of a W x H JPEG (quality 90, 4:2:0, what cameras and
//                        browsers write); S = 1 lets it decode at a reduced DCT scale (what the
//                        server does), S = 0 decodes every pixel.
//   BM_Preprocess/W/H/S: PreprocessImage of that decode (resize + crop + normalise).
//   BM_Png/W/H:          DecodeImage + PreprocessImage of a W x H PNG (no DCT to scale).
//   BM_IntoBatch/N:      what laying N preprocessed images out as one batch costs (the engine's
//                        one copy of each request's rows into a new batch buffer), per batch.
// The pictures are synthetic photographs: smooth shading, a texture and hard-edged shapes, so the
// entropy decoder does a photograph's work.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "codec/image.h"
#include "codec/image_testing.h"
#include "sluice/tensor.h"

namespace sluice {
namespace {

std::vector<uint8_t> Photo(int width, int height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double u = static_cast<double>(x) / width, v = static_cast<double>(y) / height;
      const bool disc = (u - 0.6) * (u - 0.6) + (v - 0.4) * (v - 0.4) < 0.04;
      const bool box = u > 0.1 && u < 0.35 && v > 0.55 && v < 0.9;
      for (int c = 0; c < 3; ++c) {
        double value = 90 + 60 * u + 40 * v * c + 12 * std::sin(x * 0.37 + c) * std::cos(y * 0.29);
        if (disc) value = 200 - 30 * c + 8 * std::sin(x * 0.9);
        if (box) value = 40 + 50 * c;
        value += static_cast<double>((x * 7919 + y * 104729 + c * 31) % 17) - 8;  // Grain.
        rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3 +
            static_cast<size_t>(c)] = static_cast<uint8_t>(std::clamp(value, 0.0, 255.0));
      }
    }
  }
  return rgb;
}

const std::string& Jpeg(int width, int height) {
  static std::map<std::pair<int, int>, std::string> cache;
  auto& jpeg = cache[{width, height}];
  if (jpeg.empty())
    jpeg = test_images::EncodeJpeg(Photo(width, height), width, height, 90, TJSAMP_420);
  return jpeg;
}

std::string Png(int width, int height) {
  return test_images::EncodePng(Photo(width, height), static_cast<uint32_t>(width),
                                static_cast<uint32_t>(height));
}

ImagePreprocessConfig ResNet() {
  return {256, 224, 3, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
}

void BM_Decode(benchmark::State& state) {
  const std::string& jpeg =
      Jpeg(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  const int min_side = state.range(2) ? DecodeMinSide(ResNet()) : 0;
  for (auto _ : state) {
    auto image = DecodeImage(jpeg, 3, {}, min_side);
    if (!image.ok()) state.SkipWithError(image.status().message().c_str());
    benchmark::DoNotOptimize(image);
  }
}

void BM_Preprocess(benchmark::State& state) {
  const std::string& jpeg =
      Jpeg(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  auto image = DecodeImage(jpeg, 3, {}, state.range(2) ? DecodeMinSide(ResNet()) : 0);
  if (!image.ok()) return state.SkipWithError(image.status().message().c_str());
  for (auto _ : state) {
    auto tensor = PreprocessImage(*image, ResNet());
    if (!tensor.ok()) state.SkipWithError(tensor.status().message().c_str());
    benchmark::DoNotOptimize(tensor);
  }
}

void BM_Png(benchmark::State& state) {
  const std::string png = Png(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto _ : state) {
    auto image = DecodeImage(png, 3);
    if (!image.ok()) return state.SkipWithError(image.status().message().c_str());
    auto tensor = PreprocessImage(*image, ResNet());
    benchmark::DoNotOptimize(tensor);
  }
}

void BM_IntoBatch(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<Tensor> images;
  for (int64_t i = 0; i < n; ++i) {
    images.push_back(Tensor::Zeros(DataType::kFp32, {1, 3, 224, 224}));
  }
  for (auto _ : state) {
    Tensor batch = Tensor::Uninitialized(DataType::kFp32, {n, 3, 224, 224});
    char* out = static_cast<char*>(batch.mutable_data());
    for (const Tensor& image : images) {
      std::memcpy(out, image.data(), image.byte_size());
      out += image.byte_size();
    }
    benchmark::DoNotOptimize(batch.mutable_data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (auto [w, h] : {std::pair{500, 375}, std::pair{1920, 1080}, std::pair{4032, 3024}}) {
    for (int scaled : {0, 1}) b->Args({w, h, scaled});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Decode)->Apply(Sizes);
BENCHMARK(BM_Preprocess)->Apply(Sizes);
BENCHMARK(BM_Png)->Args({500, 375})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_IntoBatch)->Arg(8)->Arg(32)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
