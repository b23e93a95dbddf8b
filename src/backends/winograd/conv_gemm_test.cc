#include "backends/winograd/conv_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace sluice::winograd {
namespace {

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Direct convolution in double, NHWC input/output, OIHW weights.
std::vector<float> Reference(const GemmConvShape& s, const std::vector<float>& in,
                             const std::vector<float>& w, const GemmConvArgs& a) {
  const int64_t oh = s.OutHeight(), ow = s.OutWidth(), k = s.kernel, cin = s.in_channels;
  std::vector<float> out(s.batch * oh * ow * s.out_channels);
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t y = 0; y < oh; ++y) {
      for (int64_t x = 0; x < ow; ++x) {
        for (int64_t o = 0; o < s.out_channels; ++o) {
          double sum = a.bias != nullptr ? a.bias[o] : 0.0;
          for (int64_t ky = 0; ky < k; ++ky) {
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t iy = y * s.stride - s.padding + ky;
              const int64_t ix = x * s.stride - s.padding + kx;
              if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
              const float* pixel = in.data() + ((n * s.height + iy) * s.width + ix) * cin;
              for (int64_t c = 0; c < cin; ++c) {
                sum += static_cast<double>(pixel[c]) * w[((o * cin + c) * k + ky) * k + kx];
              }
            }
          }
          const int64_t at = ((n * oh + y) * ow + x) * s.out_channels + o;
          if (a.residual != nullptr) sum += a.residual[at];
          if (a.relu) sum = std::max(sum, 0.0);
          out[at] = static_cast<float>(sum);
        }
      }
    }
  }
  return out;
}

ParallelFor Threads(int threads) {
  return [threads](int64_t count, const std::function<void(int64_t, int64_t)>& body) {
    std::vector<std::thread> pool;
    const int64_t per = (count + threads - 1) / threads;
    for (int64_t begin = 0; begin < count; begin += per) {
      pool.emplace_back(body, begin, std::min(count, begin + per));
    }
    for (std::thread& t : pool) t.join();
  };
}

struct Fusions {
  bool bias = true;
  bool residual = false;
  bool relu = false;
};

// Largest |got - want| over the largest |want|.
double RunCase(const GemmConvShape& s, Fusions f, int threads, bool portable,
               Blocking blocking = {}) {
  std::mt19937 rng(11);
  const std::vector<float> in = Random(s.batch * s.height * s.width * s.in_channels, rng, 1.0f);
  const std::vector<float> w = Random(s.out_channels * s.PatchSize(), rng, 0.1f);
  const std::vector<float> bias = Random(s.out_channels, rng, 1.0f);
  const int64_t out_size = s.batch * s.OutHeight() * s.OutWidth() * s.out_channels;
  const std::vector<float> residual = Random(out_size, rng, 1.0f);
  std::vector<float> packed(PackedGemmWeightsSize(s));
  PackGemmWeights(w.data(), s, packed.data());
  std::vector<float> out(out_size, std::nanf(""));
  GemmConvArgs a;
  a.input = in.data();
  a.packed = packed.data();
  a.bias = f.bias ? bias.data() : nullptr;
  a.residual = f.residual ? residual.data() : nullptr;
  a.relu = f.relu;
  a.threads = threads;
  a.portable = portable;
  a.blocking = blocking;
  a.output = out.data();
  ConvGemm(s, a, Threads(threads));
  const std::vector<float> want = Reference(s, in, w, a);
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(out[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / scale;
}

std::string Describe(const GemmConvShape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.height) + "x" + std::to_string(s.width) +
         " " + std::to_string(s.in_channels) + "->" + std::to_string(s.out_channels) + " k" +
         std::to_string(s.kernel) + " s" + std::to_string(s.stride) + " p" +
         std::to_string(s.padding);
}

class ConvGemmTest : public ::testing::TestWithParam<bool> {};  // The parameter: portable.

TEST_P(ConvGemmTest, MatchesDirectConvolution) {
  // A 7x7 stem on 3 channels, strided 3x3 and 1x1 convolutions (ResNet's downsampling), a 1x1 and
  // a 5x5 at stride 1, odd sides (the last window cut by the padding), a padded last panel.
  for (const GemmConvShape& s :
       {GemmConvShape{1, 15, 13, 3, 16, 7, 2, 3}, GemmConvShape{2, 9, 8, 16, 24, 3, 2, 1},
        GemmConvShape{1, 9, 9, 24, 40, 1, 2, 0}, GemmConvShape{2, 5, 6, 8, 8, 1, 1, 0},
        GemmConvShape{1, 7, 6, 5, 16, 5, 1, 2}, GemmConvShape{1, 6, 6, 200, 16, 3, 1, 1}}) {
    ASSERT_TRUE(GemmConvSupported(s)) << Describe(s);
    for (int threads : {1, 3}) {
      EXPECT_LT(RunCase(s, {}, threads, GetParam()), 1e-5) << Describe(s) << ", " << threads;
    }
  }
}

TEST_P(ConvGemmTest, FusesBiasResidualAndRelu) {
  const GemmConvShape s{2, 8, 8, 16, 32, 3, 2, 1};
  EXPECT_LT(RunCase(s, {/*bias=*/false}, 2, GetParam()), 1e-5);
  EXPECT_LT(RunCase(s, {true, /*residual=*/true}, 2, GetParam()), 1e-5);
  EXPECT_LT(RunCase(s, {true, true, /*relu=*/true}, 2, GetParam()), 1e-5);
  EXPECT_LT(RunCase(s, {true, false, true}, 1, GetParam()), 1e-5);
}

TEST_P(ConvGemmTest, ManyPixelsAreSplitIntoBlocks) {
  Blocking small;
  small.single_block_floats = 24 * 72;  // 24 pixels of 3x3x8 patches.
  small.block_floats = 12 * 72;
  // Small weights: blocks of 12 pixels, each with all the panels.
  EXPECT_LT(RunCase({1, 10, 10, 8, 24, 3, 1, 1}, {true, true, true}, 3, GetParam(), small), 1e-5);
  // Large weights: blocks of 24 pixels, each split into chunks of panels across the threads.
  small.cached_weight_bytes = 256;
  EXPECT_LT(RunCase({1, 10, 10, 8, 40, 3, 1, 1}, {true, true, true}, 3, GetParam(), small), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ConvGemmTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Portable" : "Fastest"; });

TEST(ConvGemmShapeTest, SupportedShapes) {
  EXPECT_EQ((GemmConvShape{1, 224, 224, 3, 64, 7, 2, 3}.OutHeight()), 112);
  EXPECT_EQ((GemmConvShape{1, 14, 14, 256, 512, 1, 2, 0}.OutWidth()), 7);
  EXPECT_FALSE(GemmConvSupported({1, 8, 8, 8, 12, 3, 1, 1}));  // Outputs not a multiple of 8.
  EXPECT_FALSE(GemmConvSupported({1, 8, 8, 8, 16, 3, 1, 3}));  // Padding as large as the kernel.
  EXPECT_FALSE(GemmConvSupported({1, 2, 2, 8, 16, 5, 1, 1}));  // No output pixel.
  EXPECT_FALSE(GemmConvSupported({1, 8, 8, 8, 16, 3, 0, 1}));  // Stride 0.
}

TEST(ConvGemmShapeTest, PackedWeightsArePaddedToWholePanels) {
  const GemmConvShape s{1, 4, 4, 2, 24, 3, 1, 1};
  EXPECT_EQ(PackedGemmWeightsSize(s), 2 * 18 * 16);
  std::vector<float> w(24 * 2 * 9), packed(PackedGemmWeightsSize(s), 7.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  PackGemmWeights(w.data(), s, packed.data());
  // Output 17 (panel 1, lane 1), input channel 1, kernel row 2, column 0: patch row 13.
  EXPECT_EQ(packed[(1 * 18 + 13) * 16 + 1], w[((17 * 2 + 1) * 3 + 2) * 3 + 0]);
  EXPECT_EQ(packed[(1 * 18 + 13) * 16 + 8], 0.0f);  // Lanes 8..15 of the last panel: padding.
}

}  // namespace
}  // namespace sluice::winograd
