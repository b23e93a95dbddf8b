#include "backends/winograd/winograd_conv.h"

#include <algorithm>
#include <vector>

#include "backends/winograd/winograd_kernels.h"

namespace sluice::winograd {
namespace {

// G of F(4x4, 3x3): U = G g G^T.
constexpr double kG[6][3] = {{1.0 / 4, 0, 0},
                             {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                             {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6},
                             {1.0 / 24, -1.0 / 12, 1.0 / 6},
                             {0, 0, 1}};

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

int64_t PackedWeightsSize(int64_t in_channels, int64_t out_channels) {
  return kPoints * Panels(out_channels) * in_channels * kPanel;
}

void PackWinogradWeights(const float* w, int64_t out_channels, int64_t in_channels, float* packed) {
  const int64_t panels = Panels(out_channels);
  std::fill(packed, packed + PackedWeightsSize(in_channels, out_channels), 0.0f);
  for (int64_t o = 0; o < out_channels; ++o) {
    for (int64_t c = 0; c < in_channels; ++c) {
      const float* g = w + (o * in_channels + c) * 9;
      double gg[6][3];  // G g
      for (int r = 0; r < 6; ++r) {
        for (int j = 0; j < 3; ++j) {
          gg[r][j] = kG[r][0] * g[j] + kG[r][1] * g[3 + j] + kG[r][2] * g[6 + j];
        }
      }
      for (int r = 0; r < 6; ++r) {
        for (int s = 0; s < 6; ++s) {
          const double u = gg[r][0] * kG[s][0] + gg[r][1] * kG[s][1] + gg[r][2] * kG[s][2];
          const int64_t xi = r * 6 + s;
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

void Conv3x3(const ConvShape& shape, const ConvArgs& args, const ParallelFor& parallel_for) {
  const int64_t tiles = shape.batch * ((shape.height + 3) / 4) * ((shape.width + 3) / 4);
  const int64_t panels = Panels(shape.out_channels);
  const int threads = std::max(1, args.threads);
  const Blocking& b = args.blocking;
  const int64_t tile_floats = kPoints * shape.in_channels;  // Transformed input of one tile.
  const int64_t weight_bytes = PackedWeightsSize(shape.in_channels, shape.out_channels) * 4;
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
      job.v = Scratch(0, kPoints * job.VPointStride()).data();
      job.m = Scratch(1, kPoints * job.MPointStride()).data();
      run_block(job);
    }
  });
}

}  // namespace sluice::winograd
