#include "backends/winograd/winograd_conv.h"

#include <algorithm>
#include <vector>

#include "backends/winograd/winograd_kernels.h"

namespace sluice::winograd {
namespace {

// G of F(4x4, 3x3) and of F(2x2, 3x3): U = G g G^T.
constexpr double kG4[6][3] = {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}};
constexpr double kG2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

int Side(Tile tile) { return static_cast<int>(tile); }
int Alpha(Tile tile) { return Side(tile) + 2; }  // Input tile side.

int64_t TileCount(const ConvShape& s, Tile tile) {
  const int64_t m = Side(tile);
  return s.batch * ((s.height + m - 1) / m) * ((s.width + m - 1) / m);
}

int64_t Panels(int64_t out_channels) { return (out_channels + kPanel - 1) / kPanel; }

bool CpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// Scratch kept per thread between calls, so a call does not fault in fresh pages.
std::vector<float>& Scratch(int which, int64_t floats) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < floats) b.resize(floats);
  return b;
}

}  // namespace

int Points(Tile tile) { return Alpha(tile) * Alpha(tile); }

int64_t PackedWeightsSize(int64_t in_channels, int64_t out_channels, Tile tile) {
  return Points(tile) * Panels(out_channels) * in_channels * kPanel;
}

void PackWinogradWeights(const float* w, int64_t out_channels, int64_t in_channels, Tile tile,
                         float* packed) {
  const int64_t panels = Panels(out_channels);
  const int alpha = Alpha(tile);
  const double(*gm)[3] = tile == Tile::k4x4 ? kG4 : kG2;
  std::fill(packed, packed + PackedWeightsSize(in_channels, out_channels, tile), 0.0f);
  for (int64_t o = 0; o < out_channels; ++o) {
    for (int64_t c = 0; c < in_channels; ++c) {
      const float* g = w + (o * in_channels + c) * 9;
      double gg[6][3];  // G g (alpha rows)
      for (int r = 0; r < alpha; ++r) {
        for (int j = 0; j < 3; ++j) {
          gg[r][j] = gm[r][0] * g[j] + gm[r][1] * g[3 + j] + gm[r][2] * g[6 + j];
        }
      }
      for (int r = 0; r < alpha; ++r) {
        for (int s = 0; s < alpha; ++s) {
          const double u = gg[r][0] * gm[s][0] + gg[r][1] * gm[s][1] + gg[r][2] * gm[s][2];
          const int64_t xi = r * alpha + s;
          packed[((xi * panels + o / kPanel) * in_channels + c) * kPanel + o % kPanel] =
              static_cast<float>(u);
        }
      }
    }
  }
}

bool HasFastPath() {
  static const bool fast = CpuHasAvx2Fma();
  return fast;
}

Tile ChooseTile(const ConvShape& shape, const Blocking& blocking) {
  const auto cost = [&](Tile tile) {
    return (TileCount(shape, tile) + blocking.weight_point_cost) * Points(tile);
  };
  return cost(Tile::k2x2) < cost(Tile::k4x4) ? Tile::k2x2 : Tile::k4x4;
}

void Conv3x3(const ConvShape& shape, const ConvArgs& args, const ParallelFor& parallel_for) {
  const int points = Points(args.tile);
  const int64_t tiles = TileCount(shape, args.tile);
  const int64_t panels = Panels(shape.out_channels);
  const int threads = std::max(1, args.threads);
  const Blocking& b = args.blocking;
  const int64_t tile_floats = points * shape.in_channels;  // Transformed input of one tile.
  const int64_t weight_bytes =
      PackedWeightsSize(shape.in_channels, shape.out_channels, args.tile) * 4;
  // Few tiles: one block of them all, the threads splitting the output panels (so the weights
  // are read once).
  int64_t block_tiles = tiles, chunks = std::min<int64_t>(threads, panels);
  if (tiles * tile_floats > b.single_block_floats) {
    if (weight_bytes > b.cached_weight_bytes) {
      // Weights too large to stay cached: large blocks, each reading them once in all.
      block_tiles = std::max<int64_t>(6, b.single_block_floats / tile_floats / 6 * 6);
    } else {
      // Blocks of tiles that stay in a core's L2 cache, each with all the output panels.
      block_tiles = std::max<int64_t>(6, b.block_floats / tile_floats / 6 * 6);
      chunks = 1;
    }
  }
  const int64_t blocks = (tiles + block_tiles - 1) / block_tiles;
  const int64_t panels_per_chunk = (panels + chunks - 1) / chunks;
  void (*run_block)(const BlockJob&) =
      HasFastPath() && !args.portable ? avx2::RunBlock : generic::RunBlock;
  parallel_for(blocks * chunks, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      BlockJob job;
      job.shape = &shape;
      job.args = &args;
      job.tile_begin = item / chunks * block_tiles;
      job.tile_count = std::min(block_tiles, tiles - job.tile_begin);
      job.panel_begin = item % chunks * panels_per_chunk;
      job.panel_end = std::min(panels, job.panel_begin + panels_per_chunk);
      if (job.panel_begin >= job.panel_end) continue;
      job.v = Scratch(0, points * job.VPointStride()).data();
      job.m = Scratch(1, points * job.MPointStride()).data();
      run_block(job);
    }
  });
}

}  // namespace sluice::winograd
