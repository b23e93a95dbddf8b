// 3x3 stride-1 convolutions by Winograd's minimal filtering F(4x4, 3x3) or F(2x2, 3x3) on NHWC
// fp32 data.
//
// F(4x4, 3x3) computes each 4x4 block of outputs from a 6x6 block of input with 36
// multiplications per input/output channel pair instead of 144 (4x fewer multiply-adds, a little
// less where the output's side is not a multiple of 4), but its transformed weights are 4x the
// plain ones. F(2x2, 3x3) computes 2x2 blocks from 4x4 inputs with 16 multiplications instead of
// 36 (2.25x fewer) and weights 16/9 the plain ones: where a convolution has few output pixels and
// many channels (the last layers of a network at batch 1) reading the weights costs more than
// the products, and the smaller tile is faster (ChooseTile).
//
// The weights are transformed once per tile size (PackWinogradWeights); each call transforms a
// block of input tiles, multiplies them by the transformed weights with a register-blocked kernel,
// and transforms the products back, adding the bias, an optional residual and an optional ReLU,
// while the block is still in cache.
//
// Torch-free: the caller supplies the threads (ParallelFor). Thread-safe: concurrent calls share
// nothing but their read-only arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace sluice::winograd {

// Runs body(begin, end) over disjoint ranges covering [0, count), possibly in parallel, and
// returns when all have returned.
using ParallelFor =
    std::function<void(int64_t count, const std::function<void(int64_t, int64_t)>& body)>;

// The side of the output tiles: F(4x4, 3x3) or F(2x2, 3x3).
enum class Tile { k4x4 = 4, k2x2 = 2 };

// Transform points of a tile size: 36 for 4x4 outputs (6x6 inputs), 16 for 2x2 (4x4).
int Points(Tile tile);

// Floats in the packed weights of a convolution with `in_channels` inputs and `out_channels`
// outputs (out_channels rounded up to a multiple of 16).
int64_t PackedWeightsSize(int64_t in_channels, int64_t out_channels, Tile tile);

// Transforms OIHW 3x3 weights `w` (out_channels x in_channels x 3 x 3) into `packed`
// (PackedWeightsSize floats): for each transform point and each panel of 16 output channels,
// in_channels rows of 16 values.
void PackWinogradWeights(const float* w, int64_t out_channels, int64_t in_channels, Tile tile,
                         float* packed);

struct ConvShape {
  int64_t batch = 0;         // Images; >= 1.
  int64_t height = 0;        // Input and output rows (padding 1, stride 1); >= 1.
  int64_t width = 0;         // Input and output columns; >= 1.
  int64_t in_channels = 0;   // A multiple of 8 (the kernels' vector width), >= 8.
  int64_t out_channels = 0;  // A multiple of 8, >= 8.
};

// How Conv3x3 divides the work (the defaults suit 2020s x86 caches; tests set small ones).
struct Blocking {
  // A whole batch's transformed input below this many floats (6 MiB) is one block, the threads
  // splitting the output channels.
  int64_t single_block_floats = 1536 * 1024;
  // Above it: with packed weights up to this size (bytes), which stay cached between blocks,
  // blocks of block_floats (256 KiB, in L2 with their products), each with all the outputs;
  // with larger weights, blocks of single_block_floats, so that the weights are read fewer times.
  int64_t cached_weight_bytes = 4 << 20;
  int64_t block_floats = 64 * 1024;
  // ChooseTile's price of reading one transform point's weights from memory, in tile-points of
  // products (the products of one tile at one point take in_channels x out_channels
  // multiply-adds; reading the point's weights, in_channels x out_channels floats): about the
  // ratio of the cores' fp32 multiply-add rate to the rate they stream floats from memory (on
  // two Zen 3 cores, 93 G multiply-adds/s against 4-5 G floats/s, 18-21 GB/s; 24 favours the
  // smaller weights a little, as measured per layer in docs/performance-log.md).
  int64_t weight_point_cost = 24;
};

// The tile size with the lower estimated cost for this shape: tiles x points of products plus
// points x weight_point_cost of weight reads; 4x4 on a tie.
Tile ChooseTile(const ConvShape& shape, const Blocking& blocking);

struct ConvArgs {
  const float* input = nullptr;  // NHWC, batch x height x width x in_channels.
  Tile tile = Tile::k4x4;
  const float* packed = nullptr;    // PackWinogradWeights' output for `tile`.
  const float* bias = nullptr;      // out_channels values, or null for none.
  const float* residual = nullptr;  // NHWC like the output, added before the ReLU; or null.
  bool relu = false;                // max(0, .) applied last.
  int threads = 1;                  // Work items to aim for (the caller's thread count); >= 1.
  bool portable = false;            // The portable kernels even where AVX2 and FMA exist (tests).
  Blocking blocking;
  float* output = nullptr;  // NHWC, batch x height x width x out_channels.
};

// The convolution (padding 1, stride 1). Uses AVX2 and FMA when the CPU has them, otherwise a
// portable path with the same arithmetic.
void Conv3x3(const ConvShape& shape, const ConvArgs& args, const ParallelFor& parallel_for);

// Whether Conv3x3 runs its AVX2/FMA kernels on this CPU.
bool HasFastPath();

}  // namespace sluice::winograd
