// The AMX path: tile products for the linear layers (bf16 and int8 weights) and for decode
// attention over a bf16 cache.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#include <cpuid.h>

namespace sluice::llm::kernels::amx {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// The AMX path: the weights are the tiles' A operand (16 output columns x 32 k each) and x the B
// operand, 16 rows of x at a time in the pair-interleaved order TDPBF16PS takes (for each pair of
// columns, the pair of every row); a C tile holds 16 output columns x up to 16 rows of x. Each
// element is one row of x against one weight row, so a row's result does not depend on the rows
// beside it.
//
// int8 weights are not widened: they meet x in AMX's int8 products (TDPBSSD, 64 k a tile). x goes
// in as 15-bit fixed point per row (s = max |x| / 16383, q = round(x / s), at most half of s off;
// finer than the bf16 rounding of the bf16 path for every element within 1/64 of the row's
// largest), split into two signed bytes, q = 128 high + low with low in [0, 127]. Each row of x
// is two rows of B, its high bytes and its low ones, so one product a weight tile serves both
// (and decoding one sequence keeps the same four weight tiles a k step as bf16); the two int32
// sums are combined and scaled in fp32. The weights stay the only 8-bit operand.
constexpr int32_t kFixedMax = 16383;

// Tile registers: C 0-3, A (weights) 4-5, B (x) 6.
SLUICE_AMX void ConfigureTiles(int64_t x_rows) {
  TileConfig config;
  const auto x_bytes = static_cast<uint16_t>(x_rows * 4);
  for (int t = 0; t < 4; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = x_bytes;
  }
  for (int t = 4; t < 6; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  config.rows[6] = 16;
  config.colsb[6] = x_bytes;
  LoadTileConfig(config);
}

// For two blocks of x: C 0-1 against the first block (16 rows), C 2-3 against the second
// (`rows_b` rows); A (weights) 4-5; B (x) 6 for the first block, 7 for the second.
SLUICE_AMX void ConfigurePairTiles(int64_t rows_b) {
  TileConfig config;
  const auto b_bytes = static_cast<uint16_t>(rows_b * 4);
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  config.colsb[2] = config.colsb[3] = config.colsb[7] = b_bytes;
  LoadTileConfig(config);
}

// Asks for one tile's 1 KiB to be brought into L1.
inline void PrefetchTile(const void* tile) {
  const char* bytes = static_cast<const char*>(tile);
  for (int line = 0; line < 16; ++line) _mm_prefetch(bytes + 64 * line, _MM_HINT_T0);
}

SLUICE_AMX void StoreTile(int t, void* out) {
  switch (t) {
    case 0:
      _tile_stored(0, out, 64);
      break;
    case 1:
      _tile_stored(1, out, 64);
      break;
    case 2:
      _tile_stored(2, out, 64);
      break;
    default:
      _tile_stored(3, out, 64);
      break;
  }
}

// GCC's tile loads are asm statements that do not say they read memory: what was just written to
// a buffer a tile load reads must be written before it, not left for later or dropped as unread.
inline void SeenByTileLoads() { asm volatile("" ::: "memory"); }

// The queries of one KV head's group (rounded to bf16) into B tiles 4 .. 3 + d / 32, as pairs of
// dimensions x groups (B tile t, row r, column g: q[g]'s dimensions 32 t + 2 r and 32 t + 2 r + 1),
// with C 0 (16 positions x groups) and A 1-2 (16 positions x 32 dimensions of the cached keys)
// configured beside them. d a multiple of 32, at most 128; at most 16 groups.
SLUICE_AMX void AmxLoadQueries(const float* q, int groups, int64_t d) {
  const int64_t k_tiles = d / 32;
  TileConfig config;
  const auto group_bytes = static_cast<uint16_t>(groups * 4);
  config.rows[0] = 16;
  config.colsb[0] = group_bytes;
  for (int t = 1; t <= 2; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  for (int64_t t = 0; t < k_tiles; ++t) {
    config.rows[4 + t] = 16;
    config.colsb[4 + t] = group_bytes;
  }
  LoadTileConfig(config);
  alignas(64) uint16_t rounded[16 * 128];
  alignas(64) uint32_t pairs[4][16][16];
  avx512::RoundRows(q, groups, d, d, rounded);
  const auto* rounded_pairs = reinterpret_cast<const uint32_t*>(rounded);
  for (int64_t t = 0; t < k_tiles; ++t) {
    for (int r = 0; r < 16; ++r) {
      for (int g = 0; g < groups; ++g) pairs[t][r][g] = rounded_pairs[g * d / 2 + 16 * t + r];
    }
  }
  SeenByTileLoads();
  _tile_loadd(4, pairs[0], 64);
  if (k_tiles > 1) _tile_loadd(5, pairs[1], 64);
  if (k_tiles > 2) _tile_loadd(6, pairs[2], 64);
  if (k_tiles > 3) _tile_loadd(7, pairs[3], 64);
}

// The scores (unscaled) of the queries loaded by AmxLoadQueries against cached positions [j0,
// j0 + 16) of k (fewer at the end of len: zero keys stand in), a row a position: block[j][g].
// The keys two blocks ahead are asked for.
SLUICE_AMX void AmxBlockScores(const uint16_t* k, int64_t j0, int64_t len, int64_t d,
                               float (&block)[16][16]) {
  constexpr int64_t kLine = 32;  // bf16 values a cache line.
  const int64_t k_tiles = d / 32, count = std::min<int64_t>(16, len - j0);
  const int64_t ahead = std::min<int64_t>(len, j0 + 48) * d;
  for (int64_t e = std::min<int64_t>(len, j0 + 32) * d; e < ahead; e += kLine) {
    _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
  }
  const uint16_t* keys = k + j0 * d;
  alignas(64) uint16_t tail[16 * 128];  // The last block's keys, zero past len.
  if (count < 16) {
    std::memcpy(tail, keys, static_cast<size_t>(count * d) * sizeof(uint16_t));
    std::memset(tail + count * d, 0, static_cast<size_t>((16 - count) * d) * sizeof(uint16_t));
    keys = tail;
    SeenByTileLoads();
  }
  const int64_t stride = d * 2;
  _tile_zero(0);
  _tile_loadd(1, keys, stride);
  _tile_dpbf16ps(0, 1, 4);
  if (k_tiles > 1) {
    _tile_loadd(2, keys + 32, stride);
    _tile_dpbf16ps(0, 2, 5);
  }
  if (k_tiles > 2) {
    _tile_loadd(1, keys + 64, stride);
    _tile_dpbf16ps(0, 1, 6);
  }
  if (k_tiles > 3) {
    _tile_loadd(2, keys + 96, stride);
    _tile_dpbf16ps(0, 2, 7);
  }
  _tile_stored(0, block, 64);
}

// The offsets of one column of a 16 x 16 block of floats stored row after row, for a gather.
SLUICE_AVX512 inline __m512i TileColumn() {
  return _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
}

// Attention over a bf16 cache with the scores on AMX: 16 cached positions a block, their keys'
// tiles loaded straight from the cache as A, the queries as B, so a block's 16 x groups scores
// take d / 32 tile products where the vector path widens every key and takes 16 groups x d / 16
// multiply-adds and a transpose. Then the vector path's softmax and p . v.
SLUICE_AMX void DecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v,
                                int64_t len, int64_t d, float scale, float* out, float* scratch) {
  AmxLoadQueries(q, groups, d);
  constexpr int64_t kLine = 32;
  for (int64_t e = 0; e < std::min<int64_t>(len, 32) * d; e += kLine) {  // The first two blocks.
    _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
  }
  alignas(64) float block[16][16];
  const __m512i column = TileColumn();
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, len - j0);
    for (int64_t e = j0 * d; e < (j0 + count) * d; e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(v + e), _MM_HINT_T1);
    }
    AmxBlockScores(k, j0, len, d, block);
    const __mmask16 lanes = FirstLanes(count);
    for (int g = 0; g < groups; ++g) {
      const __m512 scores =
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, column, &block[0][g], 4);
      _mm512_mask_storeu_ps(scratch + g * len + j0, lanes, _mm512_mul_ps(scores, scale_v));
    }
  }
  _tile_release();
  avx512::SoftmaxPv(groups, v, len, d, out, scratch);
}

// As AmxDecodeAttention for G groups and d = 16 V, with the softmax and p . v folded into the
// pass over the cache (an online softmax: a block whose scores raise a group's running maximum
// rescales what that group has summed so far), so one block's exponentials and multiply-adds run
// while the next blocks' keys and values are on their way from memory; every sum stays in a
// register. out[g] is divided by its sum of exponentials at the end.
template <int G, int V>
SLUICE_AMX void AmxFusedAttention(const float* q, const uint16_t* k, const uint16_t* v, int64_t len,
                                  float scale, float* out) {
  constexpr int64_t d = 16 * V, kLine = 32;
  // Rescaling by e^(old maximum - new) when a later block's scores are far larger (the token's
  // own and nearby positions often are) takes what was summed into the denormal range, where
  // every multiply-add took a microcode assist (16 streams ran 60% slower): denormal results
  // and inputs count as zero here, for this function's duration.
  const unsigned saved_csr = _mm_getcsr();
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  _mm_setcsr(saved_csr | kFlushToZero | kDenormalsAreZero);
  AmxLoadQueries(q, G, d);
  for (int64_t e = 0; e < std::min<int64_t>(len, 32) * d; e += kLine) {  // The first two blocks.
    _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(v + e), _MM_HINT_T0);
  }
  alignas(64) float block[16][16];
  alignas(64) float weights[G][16];
  const __m512i column = TileColumn();
  const __m512 scale_v = _mm512_set1_ps(scale);
  __m512 acc[G][V], sums[G], maxes[G];
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < V; ++u) acc[g][u] = _mm512_setzero_ps();
    sums[g] = _mm512_setzero_ps();
    maxes[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, len - j0);
    const int64_t ahead = std::min<int64_t>(len, j0 + 48) * d;
    for (int64_t e = std::min<int64_t>(len, j0 + 32) * d; e < ahead; e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(v + e), _MM_HINT_T0);
    }
    AmxBlockScores(k, j0, len, d, block);
    const __mmask16 lanes = FirstLanes(count);
    for (int g = 0; g < G; ++g) {
      const __m512 scores = _mm512_mul_ps(
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, column, &block[0][g], 4), scale_v);
      const __m512 block_max = _mm512_set1_ps(_mm512_mask_reduce_max_ps(lanes, scores));
      if (_mm512_cmp_ps_mask(block_max, maxes[g], _CMP_GT_OQ) != 0) {
        if (j0 > 0) {  // Before the first block there is nothing to rescale.
          const __m512 factor = Exp16(_mm512_sub_ps(maxes[g], block_max));
          for (int u = 0; u < V; ++u) acc[g][u] = _mm512_mul_ps(acc[g][u], factor);
          sums[g] = _mm512_mul_ps(sums[g], factor);
        }
        maxes[g] = block_max;
      }
      const __m512 e = _mm512_maskz_mov_ps(lanes, Exp16(_mm512_sub_ps(scores, maxes[g])));
      sums[g] = _mm512_add_ps(sums[g], e);
      _mm512_store_ps(weights[g], e);
    }
    for (int64_t jj = 0; jj < count; ++jj) {
      const uint16_t* row = v + (j0 + jj) * d;
      __m512 values[V];
      for (int u = 0; u < V; ++u) values[u] = Load16(row + 16 * u);
      for (int g = 0; g < G; ++g) {
        const __m512 weight = _mm512_set1_ps(weights[g][jj]);
        for (int u = 0; u < V; ++u) acc[g][u] = _mm512_fmadd_ps(weight, values[u], acc[g][u]);
      }
    }
  }
  _tile_release();
  for (int g = 0; g < G; ++g) {
    const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sums[g]));
    for (int u = 0; u < V; ++u)
      _mm512_storeu_ps(out + g * d + 16 * u, _mm512_mul_ps(acc[g][u], inverse));
  }
  _mm_setcsr(saved_csr);
}

using FusedAttentionFn = void (*)(const float*, const uint16_t*, const uint16_t*, int64_t, float,
                                  float*);
// [groups - 1][d / 32 - 1] for d = 32 and 64.
constexpr FusedAttentionFn kFusedAttention[4][2] = {
    {AmxFusedAttention<1, 2>, AmxFusedAttention<1, 4>},
    {AmxFusedAttention<2, 2>, AmxFusedAttention<2, 4>},
    {AmxFusedAttention<3, 2>, AmxFusedAttention<3, 4>},
    {AmxFusedAttention<4, 2>, AmxFusedAttention<4, 4>}};

// The lanes of the 16 columns from j0 that lie in [n_begin, n_end).
inline __mmask16 ColumnLanes(int64_t j0, int64_t n_begin, int64_t n_end) {
  const int64_t lo = std::clamp<int64_t>(n_begin - j0, 0, 16);
  const int64_t hi = std::clamp<int64_t>(n_end - j0, 0, 16);
  const uint32_t upto_hi = (uint32_t{1} << hi) - 1, below_lo = (uint32_t{1} << lo) - 1;
  return static_cast<__mmask16>(upto_hi & ~below_lo);
}

// A C tile stored as out[column][row] written to y[row][column] for the first `rows` rows and the
// columns in `lanes`, times the columns' scales and then the rows' when there are any: the 16 x 16
// block transposed in registers (pairs of rows interleaved, then pairs of pairs, then 128-bit
// lanes exchanged), then one masked store a row.
SLUICE_AVX512 void StoreTransposed(const float (&out)[16][16], int64_t rows, __mmask16 lanes,
                                   const float* scales, float* y, int64_t n,
                                   const float* row_scales = nullptr) {
  if (rows == 1) {  // One row (decoding one sequence): its column of the tile, gathered.
    __m512 v = _mm512_i32gather_ps(TileColumn(), &out[0][0], 4);
    if (scales != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(lanes, scales));
    if (row_scales != nullptr) v = _mm512_mul_ps(v, _mm512_set1_ps(row_scales[0]));
    _mm512_mask_storeu_ps(y, lanes, v);
    return;
  }
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(out[i]);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4 k + c], 128-bit lane L: rows 4 k .. 4 k + 3 of column 4 L + c.
  for (int c = 0; c < 4; ++c) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
    const __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
    t[8 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
  }
  // t[i]: the 16 columns of row i.
  const __m512 scale = scales != nullptr ? _mm512_maskz_loadu_ps(lanes, scales) : __m512{};
  for (int64_t i = 0; i < rows; ++i) {
    __m512 v = scales != nullptr ? _mm512_mul_ps(t[i], scale) : t[i];
    if (row_scales != nullptr) v = _mm512_mul_ps(v, _mm512_set1_ps(row_scales[i]));
    _mm512_mask_storeu_ps(y + i * n, lanes, v);
  }
}

// One dot product of tiles: C += A B, bf16 pairs (TDPBF16PS) or signed bytes (TDPBSSD). The tile
// numbers must be literals (the intrinsics paste them into the instruction).
#define SLUICE_TILE_DOT(INT8, C, A, B) \
  do {                                 \
    if constexpr (INT8) {              \
      _tile_dpbssd(C, A, B);           \
    } else {                           \
      _tile_dpbf16ps(C, A, B);         \
    }                                  \
  } while (0)

// A C tile's sums, stored out of its tile register, and where they go: 16 output columns from j0
// against `b_rows` rows of B, written to y from row `row0` of x.
struct StoredTile {
  alignas(64) float sums[16][16];  // int8: int32 sums, reinterpreted.
  int64_t b_rows = 0, j0 = 0, row0 = 0;
};

// Writes a stored C tile to y, for the columns in [n_begin, n_end). bf16: the sums as they are.
// int8: B's rows are each row of x's high bytes then its low bytes, so a row's result is 128 high
// + low (in fp32), times the columns' and the row's scales.
template <bool kInt8>
SLUICE_AVX512 void FinishTile(StoredTile& c, int64_t n_begin, int64_t n_end, const float* scales,
                              const MatmulInput& x, float* y, int64_t n) {
  const __mmask16 lanes = ColumnLanes(c.j0, n_begin, n_end);
  if constexpr (kInt8) {
    const __m512i high = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i low = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512 shift = _mm512_set1_ps(128.0f);
    for (int i = 0; i < 16; ++i) {
      const __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512(c.sums[i]));
      _mm512_store_ps(c.sums[i], _mm512_fmadd_ps(_mm512_permutexvar_ps(high, v), shift,
                                                 _mm512_permutexvar_ps(low, v)));
    }
    StoreTransposed(c.sums, c.b_rows / 2, lanes, scales + c.j0, y + c.row0 * n + c.j0, n,
                    x.row_scales.data() + c.row0);
  } else {
    StoreTransposed(c.sums, c.b_rows, lanes, nullptr, y + c.row0 * n + c.j0, n);
  }
}

// C tile c, stored and written to y at once (see StoredTile).
template <bool kInt8>
SLUICE_AMX void EmitTile(int c, int64_t b_rows, int64_t j0, int64_t n_begin, int64_t n_end,
                         const float* scales, const MatmulInput& x, int64_t row0, float* y,
                         int64_t n) {
  StoredTile stored;
  StoreTile(c, &stored.sums[0][0]);
  stored.b_rows = b_rows;
  stored.j0 = j0;
  stored.row0 = row0;
  FinishTile<kInt8>(stored, n_begin, n_end, scales, x, y, n);
}

// y[:, n_begin : n_end] for bf16 weights (kInt8 false; x's pairs) or int8 ones (x's quads, two
// rows of B for each row of x). scales: int8's per-column scales.
template <bool kInt8>
SLUICE_AMX void Matmul(const MatmulInput& x, const void* weights, const float* scales, int64_t n,
                       float* y, int64_t n_begin, int64_t n_end) {
  using Weight = std::conditional_t<kInt8, int8_t, uint16_t>;
  constexpr int64_t kTileK = kInt8 ? 64 : 32;
  constexpr int64_t kElements = kInt8 ? kInt8TileElements : kTileElements;
  constexpr int64_t kSplit = kInt8 ? 2 : 1;  // Rows of B a row of x.
  const auto* w = static_cast<const Weight*>(weights);
  const int64_t k_tiles = (x.k + kTileK - 1) / kTileK, b_total = x.m * kSplit;
  const uint32_t* b_data = kInt8 ? x.quads.data() : x.pairs.data();
  const int64_t t_begin = n_begin / 16, t_end = (n_end + 15) / 16;
  auto tile = [&](int64_t t, int64_t u) { return w + TileOffset(t, u, k_tiles, kElements); };
  // With one block of rows of B (decoding), each weight is read from memory once, straight into
  // the product: the tiles are asked for kAhead k steps ahead, so that the reads overlap the
  // work instead of waiting on it. Measured best at 4.
  const bool stream = b_total <= 16;
  constexpr int64_t kAhead = 4;
  // Step u of `count` weight tiles from t.
  auto prefetch = [&](int64_t t, int64_t count, int64_t u) {
    for (int64_t q = 0; q < count; ++q) PrefetchTile(tile(t + q, u));
  };
  // Two blocks of rows of B at a time (prefill): each weight tile, loaded once, meets both blocks
  // and each block's B tile two weight tiles, so four products take four tile loads, not five.
  // The pairs of blocks are the inner loop: a pair of weight columns (two tiles x k, at most
  // 96 KiB here) is read from memory once and stays in L2 while every pair of blocks passes over
  // it, where blocks in the outer loop read all the weights from memory once a pair.
  // The last block may be partial; with an odd number of blocks it goes alone, below.
  const int64_t blocks = (b_total + 15) / 16, paired = blocks / 2 * 2;
  int64_t configured = -1;  // rows_b of the tile configuration loaded.
  // A pair's C tiles are stored out of their registers at once, then written to y (transposed,
  // AVX-512) one a k step during the next pair's products, which run on beside them; the lines of
  // y a pair writes are asked for while its products run. (The store out of the registers still
  // waits for the pair's last products: the tiles are not renamed.)
  StoredTile pending[4];
  int pending_count = 0;
  auto finish = [&](int q) { FinishTile<kInt8>(pending[q], n_begin, n_end, scales, x, y, n); };
  for (int64_t t = t_begin; t < t_end && paired > 0; t += 2) {
    const int64_t count = std::min<int64_t>(2, t_end - t);
    for (int64_t block = 0; block < paired; block += 2) {
      const int64_t rows_b = std::min<int64_t>(16, b_total - (block + 1) * 16);
      const uint32_t* xa = b_data + block * k_tiles * 256;
      const uint32_t* xb = b_data + (block + 1) * k_tiles * 256;
      if (rows_b != configured) {
        ConfigurePairTiles(rows_b);
        configured = rows_b;
      }
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const int64_t first_row = block * 16 / kSplit, lines = (16 + rows_b) / kSplit * count;
      const int64_t per_step = (lines + k_tiles - 1) / k_tiles;
      for (int64_t u = 0; u < k_tiles; ++u) {
        if (u + 2 < k_tiles) {
          PrefetchTile(tile(t, u + 2));
          if (count > 1) PrefetchTile(tile(t + 1, u + 2));
          PrefetchTile(xa + (u + 2) * 16 * 16);
          PrefetchTile(xb + (u + 2) * 16 * rows_b);
        }
        _tile_loadd(6, xa + u * 16 * 16, 64);
        _tile_loadd(7, xb + u * 16 * rows_b, rows_b * 4);
        _tile_loadd(4, tile(t, u), 64);
        SLUICE_TILE_DOT(kInt8, 0, 4, 6);
        SLUICE_TILE_DOT(kInt8, 2, 4, 7);
        if (count > 1) {
          _tile_loadd(5, tile(t + 1, u), 64);
          SLUICE_TILE_DOT(kInt8, 1, 5, 6);
          SLUICE_TILE_DOT(kInt8, 3, 5, 7);
        }
        if (u < pending_count) finish(static_cast<int>(u));
        // This pair's lines of y, asked for (to write) while the products run.
        for (int64_t line = u * per_step; line < std::min(lines, (u + 1) * per_step); ++line) {
          __builtin_prefetch(y + (first_row + line / count) * n + (t + line % count) * 16, 1, 3);
        }
      }
      for (int64_t q = k_tiles; q < pending_count; ++q) finish(static_cast<int>(q));
      pending_count = 2 * static_cast<int>(count);
      for (int q = 0; q < pending_count; ++q) {  // C0, C1: block a; C2, C3: block b.
        const int c = q < count ? q : 2 + (q - static_cast<int>(count));
        StoreTile(c, &pending[q].sums[0][0]);
        pending[q].b_rows = c < 2 ? 16 : rows_b;
        pending[q].j0 = (t + c % 2) * 16;
        pending[q].row0 = (block + c / 2) * 16 / kSplit;
      }
    }
  }
  for (int q = 0; q < pending_count; ++q) finish(q);
  for (int64_t block = paired; block < blocks; ++block) {
    const int64_t rows = std::min<int64_t>(16, b_total - block * 16);
    const uint32_t* xb = b_data + block * k_tiles * 256;
    const int64_t x_stride = rows * 4;
    ConfigureTiles(rows);
    for (int64_t t = t_begin; t < t_end; t += 4) {
      const int64_t count = std::min<int64_t>(4, t_end - t);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      if (stream && t == t_begin) {  // The first steps' tiles, all asked for at once; then
                                     // kAhead ahead, into the next group near the end.
        for (int64_t u = 0; u < std::min(kAhead, k_tiles); ++u) prefetch(t, count, u);
      }
      for (int64_t u = 0; u < k_tiles; ++u) {
        if (stream && u + kAhead < k_tiles) {
          prefetch(t, count, u + kAhead);
        } else if (stream && t + 4 < t_end) {  // The next group's first steps.
          prefetch(t + 4, std::min<int64_t>(4, t_end - t - 4), u + kAhead - k_tiles);
        }
        _tile_loadd(6, xb + u * 16 * rows, x_stride);
        _tile_loadd(4, tile(t, u), 64);
        SLUICE_TILE_DOT(kInt8, 0, 4, 6);
        if (count > 1) {
          _tile_loadd(5, tile(t + 1, u), 64);
          SLUICE_TILE_DOT(kInt8, 1, 5, 6);
        }
        if (count > 2) {
          _tile_loadd(4, tile(t + 2, u), 64);
          SLUICE_TILE_DOT(kInt8, 2, 4, 6);
        }
        if (count > 3) {
          _tile_loadd(5, tile(t + 3, u), 64);
          SLUICE_TILE_DOT(kInt8, 3, 5, 6);
        }
      }
      for (int q = 0; q < count; ++q) {
        EmitTile<kInt8>(q, rows, (t + q) * 16, n_begin, n_end, scales, x, block * 16 / kSplit, y,
                        n);
      }
    }
  }
  _tile_release();
}
#undef SLUICE_TILE_DOT

// x for the AMX path: for each block of 16 rows and each 32 columns, 16 pairs of columns, each
// holding the pair of every row of the block (rounded to bf16): per block and 32 columns, the 16
// rows x 16 pairs (32-bit elements) transposed in registers, one masked store a pair. Units
// [unit_begin, unit_end) of the blocks x k tiles (a block's tiles in order), into `pairs` already
// sized.
SLUICE_AVX512 void PairRows(const float* x, int64_t m, int64_t k, ScratchVector<uint32_t>* pairs,
                            int64_t unit_begin, int64_t unit_end) {
  const int64_t k_tiles = RoundUp32(k) / 32;
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t block = unit / k_tiles, u = unit % k_tiles;
    const int64_t count = std::min<int64_t>(16, m - block * 16);
    const __mmask16 low = FirstLanes(k - u * 32), high = FirstLanes(k - u * 32 - 16);
    alignas(64) float tile[16][16];
    for (int64_t i = 0; i < 16; ++i) {
      __m512 row = _mm512_setzero_ps();
      if (i < count) {
        const float* from = x + (block * 16 + i) * k + u * 32;
        row = reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, from + 16),
                                                           _mm512_maskz_loadu_ps(low, from)));
      }
      _mm512_store_ps(tile[i], row);
    }
    // tile[i][p]: pair p of row i; the transpose gives, for each pair p, every row's.
    float* out = reinterpret_cast<float*>(pairs->data() + block * k_tiles * 256 + u * 16 * count);
    StoreTransposed(tile, 16, FirstLanes(count), nullptr, out, count);
  }
}

// x for the AMX int8 path: each row as 15-bit fixed point (its scale in row_scales), split into
// a high and a low byte, both signed, q = 128 high + low with low in [0, 127]; rows of B are each
// row's high bytes then its low bytes, laid out as B tiles: per block of 16 rows of B and 64
// columns, 16 groups of 4 columns, each holding the 4 bytes of every row of the block.
SLUICE_AVX512 void QuadRows(const float* x, int64_t m, int64_t k, MatmulInput* in) {
  const int64_t kp = RoundUp64(k), k_tiles = kp / 64, b_rows = 2 * m;
  in->row_scales.resize(static_cast<size_t>(m));
  thread_local ScratchVector<uint8_t> bytes;  // [2 m, kp], row after row.
  bytes.resize(static_cast<size_t>(b_rows * kp));
  const __m512i limit = _mm512_set1_epi32(kFixedMax), low_bits = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    __m512 largest_v = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
      largest_v = _mm512_max_ps(largest_v,
                                _mm512_abs_ps(_mm512_maskz_loadu_ps(FirstLanes(k - c), row + c)));
    }
    const float largest = _mm512_reduce_max_ps(largest_v);
    const bool usable = largest > 0 && std::isfinite(largest);
    in->row_scales[static_cast<size_t>(i)] = usable ? largest / kFixedMax : 0.0f;
    const __m512 inverse = _mm512_set1_ps(usable ? kFixedMax / largest : 0.0f);
    uint8_t* high = bytes.data() + 2 * i * kp;
    uint8_t* low = high + kp;
    for (int64_t c = 0; c < kp; c += 16) {
      const __mmask16 lanes = c < k ? FirstLanes(k - c) : 0;
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + c), inverse));
      q = _mm512_max_epi32(_mm512_min_epi32(q, limit),
                           _mm512_sub_epi32(_mm512_setzero_si512(), limit));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(high + c),
                       _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 7)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(low + c),
                       _mm512_cvtepi32_epi8(_mm512_and_si512(q, low_bits)));
    }
  }
  const int64_t blocks = (b_rows + 15) / 16;
  in->quads.resize(static_cast<size_t>(blocks * k_tiles * 256));
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t count = std::min<int64_t>(16, b_rows - block * 16);
    uint32_t* to = in->quads.data() + block * k_tiles * 256;
    for (int64_t u = 0; u < k_tiles; ++u) {
      alignas(64) float tile[16][16];
      for (int64_t i = 0; i < 16; ++i) {
        const __m512 quad_row = i < count ? _mm512_loadu_ps(reinterpret_cast<const float*>(
                                                bytes.data() + (block * 16 + i) * kp + u * 64))
                                          : _mm512_setzero_ps();
        _mm512_store_ps(tile[i], quad_row);
      }
      StoreTransposed(tile, 16, FirstLanes(count), nullptr,
                      reinterpret_cast<float*>(to + u * 16 * count), count);
    }
  }
}

bool Usable() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u, amx_int8 = (edx >> 25) & 1u;
  if (!amx_bf16 || !amx_tile || !amx_int8) return false;
  // Linux hands out the 8 KiB of tile state only to processes that ask (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA).
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

SLUICE_AMX void FusedDecodeAttention(const float* q, int groups, const uint16_t* k,
                                     const uint16_t* v, int64_t len, int64_t d, float scale,
                                     float* out) {
  kFusedAttention[groups - 1][d / 32 - 1](q, k, v, len, scale, out);
}

template SLUICE_AMX void Matmul<false>(const MatmulInput&, const void*, const float*, int64_t,
                                       float*, int64_t, int64_t);
template SLUICE_AMX void Matmul<true>(const MatmulInput&, const void*, const float*, int64_t,
                                      float*, int64_t, int64_t);

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sluice::llm::kernels::amx
#endif  // SLUICE_X86
