// GGUF block products on AMX's int8 tiles (TDPBSSD), for repacked Q8_0 and Q4_0 weights and at
// least 16 rows of x (prompts, many streams): quant_amx.inc, built twice, with AMX's tiles and
// with tiles emulated in C++ (the same operations on arrays, for tests on CPUs without AMX).
#include <algorithm>
#include <cstring>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
namespace sluice::llm::kernels {
namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// quant_amx.inc's tiles: C 0-1 and A 2-3 `rows` rows of 32 bytes (8 int32 sums; one run of x),
// B 4-5 8 rows of 32 bytes (a record's eight steps).
TileConfig QuantTileConfig(int rows) {
  TileConfig config;
  for (int t = 0; t < 6; ++t) {
    config.rows[t] = static_cast<uint8_t>(t < 4 ? rows : 8);
    config.colsb[t] = 32;
  }
  return config;
}

// AMX's own tiles. The tile intrinsics take their register numbers as literals.
struct AmxTiles {
  SLUICE_QUANT_AMX static void Configure(int rows) {
    const TileConfig config = QuantTileConfig(rows);
    LoadTileConfig(config);
  }
  // Pair p (0 or 1): C p = A (2 + p, `rows` rows from `a`, `a_stride` apart) . B (4 + p, 8 rows
  // of 32 bytes from `b`), stored to `c` (rows of 32 bytes).
  SLUICE_QUANT_AMX static void Product(int p, const void* a, int64_t a_stride, const void* b,
                                       void* c) {
    if (p == 0) {
      _tile_loadd(2, a, a_stride);
      _tile_loadd(4, b, 32);
      _tile_zero(0);
      _tile_dpbssd(0, 2, 4);
      _tile_stored(0, c, 32);
    } else {
      _tile_loadd(3, a, a_stride);
      _tile_loadd(5, b, 32);
      _tile_zero(1);
      _tile_dpbssd(1, 3, 5);
      _tile_stored(1, c, 32);
    }
  }
  SLUICE_QUANT_AMX static void Release() { _tile_release(); }
};

// The same on arrays, as the instruction set reference defines the instructions: a tile is up to
// 16 rows of up to 64 bytes; TDPBSSD adds to C[m][n] (int32) the products of A[m][4 k + i] and
// B[k][4 n + i] (signed bytes) over k < B's rows and i < 4.
struct EmulatedTiles {
  struct State {
    TileConfig config;
    alignas(64) uint8_t tiles[8][16][64];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void Configure(int rows) {
    state().config = QuantTileConfig(rows);
    std::memset(state().tiles, 0, sizeof(state().tiles));
  }
  static void Load(int t, const void* from, int64_t stride) {
    State& s = state();
    for (int r = 0; r < s.config.rows[t]; ++r) {
      std::memcpy(s.tiles[t][r], static_cast<const uint8_t*>(from) + r * stride, s.config.colsb[t]);
    }
  }
  static void Zero(int t) { std::memset(state().tiles[t], 0, sizeof(state().tiles[t])); }
  static void DotSigned(int c, int a, int b) {
    State& s = state();
    for (int m = 0; m < s.config.rows[c]; ++m) {
      for (int n = 0; n < s.config.colsb[c] / 4; ++n) {
        int32_t total;
        std::memcpy(&total, s.tiles[c][m] + 4 * n, 4);
        for (int k = 0; k < s.config.rows[b]; ++k) {
          for (int i = 0; i < 4; ++i) {
            total += int32_t{static_cast<int8_t>(s.tiles[a][m][4 * k + i])} *
                     int32_t{static_cast<int8_t>(s.tiles[b][k][4 * n + i])};
          }
        }
        std::memcpy(s.tiles[c][m] + 4 * n, &total, 4);
      }
    }
  }
  static void Store(int t, void* to, int64_t stride) {
    const State& s = state();
    for (int r = 0; r < s.config.rows[t]; ++r) {
      std::memcpy(static_cast<uint8_t*>(to) + r * stride, s.tiles[t][r], s.config.colsb[t]);
    }
  }
  static void Product(int p, const void* a, int64_t a_stride, const void* b, void* c) {
    Load(2 + p, a, a_stride);
    Load(4 + p, b, 32);
    Zero(p);
    DotSigned(p, 2 + p, 4 + p);
    Store(p, c, 32);
  }
  static void Release() {}
};

}  // namespace

namespace quant_amx {
bool Usable() {
  static const bool usable = amx::Usable();
  return usable;
}
#define SLUICE_QAMX_TARGET SLUICE_QUANT_AMX
#define SLUICE_QAMX_TILES AmxTiles
#include "llm/kernels/quant_amx.inc"
#undef SLUICE_QAMX_TARGET
#undef SLUICE_QAMX_TILES
}  // namespace quant_amx

namespace quant_amx_emulated {
#define SLUICE_QAMX_TARGET SLUICE_QUANT_AVX2
#define SLUICE_QAMX_TILES EmulatedTiles
#include "llm/kernels/quant_amx.inc"
#undef SLUICE_QAMX_TARGET
#undef SLUICE_QAMX_TILES
}  // namespace quant_amx_emulated

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sluice::llm::kernels
#endif
