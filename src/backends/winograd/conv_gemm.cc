#include "backends/winograd/conv_gemm.h"

#include <algorithm>
#include <vector>

#include "backends/winograd/winograd_kernels.h"

namespace sluice::winograd {
namespace {

int64_t Panels(int64_t out_channels) { return (out_channels + kPanel - 1) / kPanel; }

// Scratch kept per thread between calls, so a call does not fault in fresh pages.
float* Scratch(int which, int64_t floats) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < floats) b.resize(floats);
  return b.data();
}

}  // namespace

int64_t PackedGemmWeightsSize(const GemmConvShape& shape) {
  return Panels(shape.out_channels) * shape.PatchSize() * kPanel;
}

void PackGemmWeights(const float* w, const GemmConvShape& s, float* packed) {
  const int64_t k = s.kernel, cin = s.in_channels, patch = s.PatchSize();
  std::fill(packed, packed + PackedGemmWeightsSize(s), 0.0f);
  for (int64_t o = 0; o < s.out_channels; ++o) {
    float* panel = packed + o / kPanel * patch * kPanel + o % kPanel;
    for (int64_t c = 0; c < cin; ++c) {
      for (int64_t ky = 0; ky < k; ++ky) {
        for (int64_t kx = 0; kx < k; ++kx) {
          panel[((ky * k + kx) * cin + c) * kPanel] = w[((o * cin + c) * k + ky) * k + kx];
        }
      }
    }
  }
}

bool GemmConvSupported(const GemmConvShape& s) {
  return s.batch >= 1 && s.height >= 1 && s.width >= 1 && s.in_channels >= 1 &&
         s.out_channels >= 8 && s.out_channels % 8 == 0 && s.kernel >= 1 && s.stride >= 1 &&
         s.padding >= 0 && s.padding < s.kernel && s.OutHeight() >= 1 && s.OutWidth() >= 1;
}

void ConvGemm(const GemmConvShape& shape, const GemmConvArgs& args,
              const ParallelFor& parallel_for) {
  const int64_t pixels = shape.batch * shape.OutHeight() * shape.OutWidth();
  const int64_t patch = shape.PatchSize();
  const int64_t panels = Panels(shape.out_channels);
  const Blocking& b = args.blocking;
  // As Conv3x3 blocks its tiles: few pixels make one block, the threads splitting the output
  // panels; more make blocks each with all the panels (weights that stay cached) or large
  // blocks split by panels (weights read from memory once per block).
  int64_t block_pixels = pixels, chunks = std::min<int64_t>(std::max(1, args.threads), panels);
  if (pixels * patch > b.single_block_floats) {
    if (PackedGemmWeightsSize(shape) * 4 > b.cached_weight_bytes) {
      block_pixels = std::max<int64_t>(6, b.single_block_floats / patch / 6 * 6);
    } else {
      block_pixels = std::max<int64_t>(6, b.block_floats / patch / 6 * 6);
      chunks = 1;
    }
  }
  const int64_t blocks = (pixels + block_pixels - 1) / block_pixels;
  const int64_t panels_per_chunk = (panels + chunks - 1) / chunks;
  void (*run_block)(const GemmBlockJob&) =
      HasFastPath() && !args.portable ? avx2::RunGemmBlock : generic::RunGemmBlock;
  parallel_for(blocks * chunks, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      GemmBlockJob job;
      job.shape = &shape;
      job.args = &args;
      job.pixel_begin = item / chunks * block_pixels;
      job.pixel_count = std::min(block_pixels, pixels - job.pixel_begin);
      job.panel_begin = item % chunks * panels_per_chunk;
      job.panel_end = std::min(panels, job.panel_begin + panels_per_chunk);
      if (job.panel_begin >= job.panel_end) continue;
      job.patches = Scratch(0, job.pixel_count * patch);
      job.m = Scratch(1, job.pixel_count * job.MStride());
      run_block(job);
    }
  });
}

}  // namespace sluice::winograd
