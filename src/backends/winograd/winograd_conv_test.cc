#include "backends/winograd/winograd_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace sluice::winograd {
namespace {

struct Case {
  ConvShape shape;
  bool bias = true;
  bool residual = false;
  bool relu = false;
};

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Direct convolution (padding 1, stride 1) in double, NHWC input/output, OIHW weights.
std::vector<float> Reference(const ConvShape& s, const std::vector<float>& in,
                             const std::vector<float>& w, const ConvArgs& a) {
  std::vector<float> out(s.batch * s.height * s.width * s.out_channels);
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t y = 0; y < s.height; ++y) {
      for (int64_t x = 0; x < s.width; ++x) {
        for (int64_t o = 0; o < s.out_channels; ++o) {
          double sum = a.bias != nullptr ? a.bias[o] : 0.0;
          for (int64_t ky = 0; ky < 3; ++ky) {
            for (int64_t kx = 0; kx < 3; ++kx) {
              const int64_t iy = y + ky - 1, ix = x + kx - 1;
              if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
              const float* pixel = in.data() + ((n * s.height + iy) * s.width + ix) * s.in_channels;
              for (int64_t c = 0; c < s.in_channels; ++c) {
                sum +=
                    static_cast<double>(pixel[c]) * w[((o * s.in_channels + c) * 3 + ky) * 3 + kx];
              }
            }
          }
          const int64_t at = ((n * s.height + y) * s.width + x) * s.out_channels + o;
          if (a.residual != nullptr) sum += a.residual[at];
          if (a.relu) sum = std::max(sum, 0.0);
          out[at] = static_cast<float>(sum);
        }
      }
    }
  }
  return out;
}

// Splits [0, count) over `threads` std::threads.
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

// Largest |got - want| over the largest |want|.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / scale;
}

double RunCase(const Case& c, int threads, bool portable, Tile tile, Blocking blocking = {}) {
  const ConvShape& s = c.shape;
  std::mt19937 rng(7);
  const std::vector<float> in = Random(s.batch * s.height * s.width * s.in_channels, rng, 1.0f);
  const std::vector<float> w = Random(s.out_channels * s.in_channels * 9, rng, 0.1f);
  const std::vector<float> bias = Random(s.out_channels, rng, 1.0f);
  const std::vector<float> residual =
      Random(s.batch * s.height * s.width * s.out_channels, rng, 1.0f);
  std::vector<float> packed(PackedWeightsSize(s.in_channels, s.out_channels, tile));
  PackWinogradWeights(w.data(), s.out_channels, s.in_channels, tile, packed.data());
  std::vector<float> out(residual.size(), std::nanf(""));
  ConvArgs a;
  a.input = in.data();
  a.tile = tile;
  a.packed = packed.data();
  a.bias = c.bias ? bias.data() : nullptr;
  a.residual = c.residual ? residual.data() : nullptr;
  a.relu = c.relu;
  a.output = out.data();
  a.threads = threads;
  a.portable = portable;
  a.blocking = blocking;
  Conv3x3(s, a, Threads(threads));
  return RelativeError(out, Reference(s, in, w, a));
}

// The parameters: the portable kernels (or the fastest the CPU has), and the tile size.
class Conv3x3Test : public ::testing::TestWithParam<std::tuple<bool, Tile>> {
 protected:
  double Run(const Case& c, int threads, Blocking blocking = {}) {
    return RunCase(c, threads, std::get<0>(GetParam()), std::get<1>(GetParam()), blocking);
  }
};

TEST_P(Conv3x3Test, MatchesDirectConvolutionOnWholeAndPartialTiles) {
  // 8x8: whole tiles; 5x7 and 9x6: the last row and column of tiles cut short (of 4x4 tiles;
  // of 2x2 tiles where a side is odd).
  for (const ConvShape& s :
       {ConvShape{1, 8, 8, 8, 16}, ConvShape{2, 5, 7, 16, 8}, ConvShape{1, 9, 6, 24, 40}}) {
    for (int threads : {1, 3}) {
      EXPECT_LT(Run({s}, threads), 1e-5)
          << s.batch << "x" << s.height << "x" << s.width << " " << s.in_channels << "->"
          << s.out_channels << ", " << threads << " threads";
    }
  }
}

TEST_P(Conv3x3Test, FusesBiasResidualAndRelu) {
  const ConvShape s{2, 6, 6, 16, 32};
  EXPECT_LT(Run({s, /*bias=*/false}, 2), 1e-5);
  EXPECT_LT(Run({s, true, /*residual=*/true}, 2), 1e-5);
  EXPECT_LT(Run({s, true, true, /*relu=*/true}, 2), 1e-5);
  EXPECT_LT(Run({s, true, false, true}, 1), 1e-5);
}

TEST_P(Conv3x3Test, ManyTilesAreSplitIntoCacheSizedBlocks) {
  // Over 1.5M floats of transformed input: the path that processes blocks of tiles.
  EXPECT_LT(Run({ConvShape{1, 128, 128, 48, 16}, true, true, true}, 2), 1e-5);
}

TEST_P(Conv3x3Test, LargeWeightsAreSplitIntoLargeBlocksAndOutputChunks) {
  // Blocking scaled down: 2 blocks of 36 tiles of 4x4 (or 5 blocks of 36 tiles of 2x2, the last
  // one short), each split into 3 chunks of output channels (40 channels: 3 panels, the last one
  // padded).
  Blocking small;
  small.single_block_floats = 36 * 24 * Points(std::get<1>(GetParam()));
  small.cached_weight_bytes = 1024;
  EXPECT_LT(Run({ConvShape{2, 20, 20, 24, 40}, true, true, true}, 3, small), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Conv3x3Test,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Tile::k4x4, Tile::k2x2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Portable" : "Fastest") +
                                  (std::get<1>(info.param) == Tile::k4x4 ? "4x4" : "2x2");
                         });

TEST(PackWinogradWeightsTest, OutputChannelsArePaddedToWholePanels) {
  EXPECT_EQ(PackedWeightsSize(8, 16, Tile::k4x4), 36 * 8 * 16);
  EXPECT_EQ(PackedWeightsSize(8, 24, Tile::k4x4), 36 * 2 * 8 * 16);
  EXPECT_EQ(PackedWeightsSize(8, 24, Tile::k2x2), 16 * 2 * 8 * 16);
  for (Tile tile : {Tile::k4x4, Tile::k2x2}) {
    std::vector<float> w(24 * 8 * 9, 1.0f), packed(PackedWeightsSize(8, 24, tile), 7.0f);
    PackWinogradWeights(w.data(), 24, 8, tile, packed.data());
    // The last point (infinity, infinity) is g[2][2] itself; lanes 8..15 of the second panel
    // are padding.
    const int64_t xi = Points(tile) - 1, panels = 2;
    EXPECT_FLOAT_EQ(packed[((xi * panels + 1) * 8 + 0) * 16 + 7], 1.0f);
    EXPECT_FLOAT_EQ(packed[((xi * panels + 1) * 8 + 0) * 16 + 8], 0.0f);
  }
}

TEST(ChooseTileTest, SmallTilesWhereReadingTheWeightsCostsMoreThanTheProducts) {
  const Blocking defaults;
  // ResNet-18 at batch 1: 7x7 (4 tiles of 4x4) and 14x14 outputs take 2x2 tiles; 28x28 and
  // 56x56, where the products dominate, 4x4.
  EXPECT_EQ(ChooseTile({1, 7, 7, 512, 512}, defaults), Tile::k2x2);
  EXPECT_EQ(ChooseTile({1, 14, 14, 256, 256}, defaults), Tile::k2x2);
  EXPECT_EQ(ChooseTile({1, 28, 28, 128, 128}, defaults), Tile::k4x4);
  EXPECT_EQ(ChooseTile({1, 56, 56, 64, 64}, defaults), Tile::k4x4);
  // A batch of 8 7x7 images has enough tiles for 4x4 to win again.
  EXPECT_EQ(ChooseTile({8, 7, 7, 512, 512}, defaults), Tile::k4x4);
  // Free weight reads: always the fewer multiply-adds.
  Blocking cached = defaults;
  cached.weight_point_cost = 0;
  EXPECT_EQ(ChooseTile({1, 7, 7, 512, 512}, cached), Tile::k4x4);
}

}  // namespace
}  // namespace sluice::winograd
