// The AVX-512 BF16 path: x is rounded to bf16 once per call (round to nearest even; the padding
// columns are zeros) and VDPBF16PS multiplies pairs of bf16 and adds both products to an fp32
// lane, 32 multiply-adds per instruction, twice the AVX2 path's per instruction and on vectors
// twice as wide. int8 weights become bf16 exactly (every int8 has at most 8 significant bits).
//
// The packed layout serves as it is: a run of eight columns of a group of eight weight rows is 64
// values, two 512-bit vectors of four rows each, a row's eight columns in one 128-bit lane as four
// pairs. The eight bf16 of x for the same columns, broadcast to all four 128-bit lanes, meet each
// row's pairs. Lane p of a row's 128-bit lane sums the pairs p, p + 4, p + 8, ... of its columns;
// the four lanes are added (p0 + p2) + (p1 + p3) for every block shape.
//
// Also here: decode attention, RMSNorm, SwiGLU and argmax on 16 lanes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
namespace sluice::llm::kernels::avx512 {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

SLUICE_AVX512 inline void Load64(const uint16_t* w, __m512bh* lo, __m512bh* hi) {
  *lo = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w));
  *hi = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 32));
}
SLUICE_AVX512 inline void Load64(const int8_t* w, __m512bh* lo, __m512bh* hi) {
  __m512 f[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    f[q] = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * q))));
  }
  // cvtne2ps puts its second operand in the lower half.
  *lo = _mm512_cvtne2ps_pbh(f[1], f[0]);
  *hi = _mm512_cvtne2ps_pbh(f[3], f[2]);
}

// Rows [i0, i0 + MB) of xb (bf16, row stride kp) against the NG groups of eight weight rows that
// start at row j0, whose packed weights start at wr; columns of y at or past j_end are not written.
template <int MB, int NG, class T>
SLUICE_AVX512 void Block512(const uint16_t* xb, int64_t kp, const T* wr, const float* scales,
                            int64_t n, float* y, int64_t i0, int64_t j0, int64_t j_end) {
  __m512 acc[MB][NG][2];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) acc[i][g][0] = acc[i][g][1] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < kp; c += 8) {
    __m512bh xv[MB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      xv[i] = reinterpret_cast<__m512bh>(_mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + (i0 + i) * kp + c))));
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) {
      __m512bh lo, hi;
      Load64(wr + g * 8 * kp + c * 8, &lo, &hi);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        acc[i][g][0] = _mm512_dpbf16_ps(acc[i][g][0], xv[i], lo);
        acc[i][g][1] = _mm512_dpbf16_ps(acc[i][g][1], xv[i], hi);
      }
    }
  }
  // Element 0 of each 128-bit lane of each accumulator, rows 0-3 then 4-7 of the group.
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int g = 0; g < NG; ++g) {
    const int64_t j = j0 + g * 8;
    if (j >= j_end) break;
    const __mmask8 mask = static_cast<__mmask8>(j_end - j >= 8 ? 0xff : (1u << (j_end - j)) - 1);
    for (int i = 0; i < MB; ++i) {
      __m512 sums[2];
      for (int h = 0; h < 2; ++h) {
        const __m512 a = acc[i][g][h];
        // (p0 + p2, p1 + p3, ...), then (p0 + p2) + (p1 + p3) in every position.
        const __m512 pairs = _mm512_add_ps(a, _mm512_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
        sums[h] = _mm512_add_ps(pairs, _mm512_shuffle_ps(pairs, pairs, _MM_SHUFFLE(2, 3, 0, 1)));
      }
      __m256 row = _mm512_castps512_ps256(_mm512_permutex2var_ps(sums[0], firsts, sums[1]));
      if (scales != nullptr) row = _mm256_mul_ps(row, _mm256_maskz_loadu_ps(mask, scales + j));
      _mm256_mask_storeu_ps(y + (i0 + i) * n + j, mask, row);
    }
  }
}

// Every row against the groups of columns [c0, c1), whose packed weights start at wc.
template <int MB, int NG, class T>
SLUICE_AVX512 void ChunkRows512(const uint16_t* xb, int64_t m, int64_t kp, const T* wc,
                                const float* scales, int64_t n, float* y, int64_t c0, int64_t c1) {
  const int64_t whole = c0 + (c1 - c0) / (8 * NG) * (8 * NG);
  auto weights = [&](int64_t j) { return wc + (j - c0) * kp; };  // Group (j / 8)'s weights.
  int64_t i = 0;
  for (; i + MB <= m; i += MB) {
    for (int64_t j = c0; j < whole; j += 8 * NG) {
      Block512<MB, NG, T>(xb, kp, weights(j), scales, n, y, i, j, c1);
    }
    for (int64_t j = whole; j < c1; j += 8) {
      Block512<MB, 1, T>(xb, kp, weights(j), scales, n, y, i, j, c1);
    }
  }
  if constexpr (MB > 1) {
    for (; i < m; ++i) {
      for (int64_t j = c0; j < c1; j += 8) {
        Block512<1, 1, T>(xb, kp, weights(j), scales, n, y, i, j, c1);
      }
    }
  }
}

// Groups of eight columns from j_begin (a multiple of 8) on, until j_end, for every row. int8
// weights are widened to bf16 as they are read when one block of rows passes over them; when
// several do, each chunk is widened once into a buffer (in L2) that they all read. Both give the
// same bf16 values.
template <int MB, int NG, class T>
SLUICE_AVX512 void Columns512(const uint16_t* xb, int64_t m, int64_t kp, const T* w,
                              const float* scales, int64_t n, float* y, int64_t j_begin,
                              int64_t j_end) {
  const int64_t group_bytes = 8 * kp * static_cast<int64_t>(sizeof(T));
  const int64_t chunk = std::max<int64_t>(NG, (64 << 10) / group_bytes / NG * NG) * 8;
  for (int64_t c0 = j_begin; c0 < j_end; c0 += chunk) {
    const int64_t c1 = std::min(j_end, c0 + chunk);
    if constexpr (std::is_same_v<T, int8_t>) {
      if (m > MB) {
        thread_local std::vector<uint16_t> widened;
        const int64_t count = RoundUp8(c1 - c0) * kp;
        widened.resize(static_cast<size_t>(count));
        const int8_t* from = w + PackedOffset(c0, 0, kp);
        for (int64_t e = 0; e < count; e += 64) {
          __m512bh lo, hi;
          Load64(from + e, &lo, &hi);
          _mm512_storeu_si512(widened.data() + e, reinterpret_cast<__m512i>(lo));
          _mm512_storeu_si512(widened.data() + e + 32, reinterpret_cast<__m512i>(hi));
        }
        ChunkRows512<MB, NG, uint16_t>(xb, m, kp, widened.data(), scales, n, y, c0, c1);
        continue;
      }
    }
    ChunkRows512<MB, NG, T>(xb, m, kp, w + PackedOffset(c0, 0, kp), scales, n, y, c0, c1);
  }
}

template <class T>
SLUICE_AVX512 void Matmul(const MatmulInput& x, const T* w, const float* scales, int64_t n,
                          float* y, int64_t n_begin, int64_t n_end) {
  const int64_t m = x.m, kp = RoundUp8(x.k);
  const uint16_t* rows = x.rows.data();
  if (m == 1) {
    Columns512<1, 4, T>(rows, m, kp, w, scales, n, y, n_begin, n_end);
  } else if (m < 4) {
    Columns512<2, 2, T>(rows, m, kp, w, scales, n, y, n_begin, n_end);
  } else {
    Columns512<4, 2, T>(rows, m, kp, w, scales, n, y, n_begin, n_end);
  }
}

// x rounded to bf16, rows of `stride` values (zeros past k).
SLUICE_AVX512 void RoundRows(const float* x, int64_t m, int64_t k, int64_t stride, uint16_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    uint16_t* to = out + i * stride;
    for (int64_t c = 0; c < stride; c += 16) {
      const __mmask16 in = FirstLanes(k - c);
      const __mmask16 width = FirstLanes(stride - c);
      const __m256bh bits = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(in, row + c));
      _mm256_mask_storeu_epi16(to + c, width, reinterpret_cast<__m256i>(bits));
    }
  }
}

SLUICE_AVX512 int64_t ArgMax(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    best = _mm512_mask_max_ps(best, FirstLanes(n - i), best,
                              _mm512_maskz_loadu_ps(FirstLanes(n - i), x + i));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 hit =
        _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(FirstLanes(n - i), x + i), top, _CMP_EQ_OQ) &
        FirstLanes(n - i);
    if (hit != 0) return i + __builtin_ctz(hit);
  }
  return 0;
}

// As RmsNorm, 16 columns at a time, the squares summed in four vectors of lanes.
SLUICE_AVX512 void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight,
                           float eps, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * width;
    __m512 sums[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                      _mm512_setzero_ps()};
    for (int64_t c = 0; c < width; c += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(FirstLanes(width - c), row + c);
      sums[(c / 16) % 4] = _mm512_fmadd_ps(v, v, sums[(c / 16) % 4]);
    }
    const float squares = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(sums[0], sums[1]), _mm512_add_ps(sums[2], sums[3])));
    const __m512 inverse =
        _mm512_set1_ps(1.0f / std::sqrt(squares / static_cast<float>(width) + eps));
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 lanes = FirstLanes(width - c);
      const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + c), inverse);
      _mm512_mask_storeu_ps(out + t * width + c, lanes,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, weight + c), scaled));
    }
  }
}

// As SwiGlu, 16 columns at a time: silu(g) = g / (1 + e^-g), computed as g / (1 + e) when g >= 0
// and g e / (1 + e) when g < 0, with e = e^-|g| (so the exponential never overflows).
SLUICE_AVX512 void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t t = 0; t < rows; ++t) {
    const float* gate = gate_up + t * 2 * inter;
    const float* up = gate + inter;
    for (int64_t c = 0; c < inter; c += 16) {
      const __mmask16 lanes = FirstLanes(inter - c);
      const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + c);
      const __m512 e =  // e^-|g|
          Exp16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), sign_bit)));
      const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 numerator = _mm512_mask_mul_ps(g, negative, g, e);
      const __m512 silu = _mm512_div_ps(numerator, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(out + t * inter + c, lanes,
                            _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(lanes, up + c)));
    }
  }
}

// out[g, 0 : 16 V] = sum_j p[g, j] v[j, 0 : 16 V] for G groups, with every sum in a register
// (G and V fixed at compile time: with run-time bounds the compiler kept the sums in memory).
// v: [len, d] from the first column wanted; p: G rows of len, p_stride apart; out: G rows of d.

// A q8_0 cache (T int8_t): v_scales[(element offset from column 0) / 32] scales each 32 values,
// v being column c0's.
template <class T, int G, int V>
SLUICE_AVX512_BASE void AccumulatePv(const T* v, int64_t d, int64_t len, const float* p,
                                     int64_t p_stride, float* out, const float* v_scales,
                                     int64_t c0) {
  __m512 acc[G][V];
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < V; ++u) acc[g][u] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < len; ++j) {
    const T* vj = v + j * d;
    __m512 rows[V];
    for (int u = 0; u < V; ++u) {
      rows[u] = Load16(vj + 16 * u);
      if constexpr (std::is_same_v<T, int8_t>) {
        rows[u] = _mm512_mul_ps(rows[u], _mm512_set1_ps(v_scales[(j * d + c0 + 16 * u) / 32]));
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 weight = _mm512_set1_ps(p[g * p_stride + j]);
      for (int u = 0; u < V; ++u) acc[g][u] = _mm512_fmadd_ps(weight, rows[u], acc[g][u]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < V; ++u) _mm512_storeu_ps(out + g * d + 16 * u, acc[g][u]);
  }
}

template <class T>
using AccumulatePvFn = void (*)(const T*, int64_t, int64_t, const float*, int64_t, float*,
                                const float*, int64_t);
// [groups - 1][vectors - 1].
template <class T>
constexpr AccumulatePvFn<T> kAccumulatePv[4][4] = {
    {AccumulatePv<T, 1, 1>, AccumulatePv<T, 1, 2>, AccumulatePv<T, 1, 3>, AccumulatePv<T, 1, 4>},
    {AccumulatePv<T, 2, 1>, AccumulatePv<T, 2, 2>, AccumulatePv<T, 2, 3>, AccumulatePv<T, 2, 4>},
    {AccumulatePv<T, 3, 1>, AccumulatePv<T, 3, 2>, AccumulatePv<T, 3, 3>, AccumulatePv<T, 3, 4>},
    {AccumulatePv<T, 4, 1>, AccumulatePv<T, 4, 2>, AccumulatePv<T, 4, 3>, AccumulatePv<T, 4, 4>}};

// out[g] = sum_j p[g, j] v[j] for `groups` rows of p (p_stride apart) over `len` positions: 64
// columns (four vectors) of up to four groups per pass over v.
template <class T>
SLUICE_AVX512_BASE void PvSums(int groups, const T* v, int64_t len, int64_t d, const float* p,
                               int64_t p_stride, float* out, const float* v_scales) {
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int vectors = static_cast<int>(std::min<int64_t>(4, (d - c0) / 16));
    for (int g0 = 0; g0 < groups; g0 += 4) {
      const int gs = std::min(4, groups - g0);
      kAccumulatePv<T>[gs - 1][vectors - 1](v + c0, d, len, p + g0 * p_stride, p_stride,
                                            out + g0 * d + c0, v_scales, c0);
    }
  }
}

// The largest of row[0 .. count) (as std::max_element's: max is exact in any order), 16 at a
// time; -inf where count is 0.
SLUICE_AVX512_BASE inline float RowMax(const float* row, int64_t count) {
  __m512 largest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < count; j += 16) {
    largest = _mm512_mask_max_ps(largest, FirstLanes(count - j), largest,
                                 _mm512_maskz_loadu_ps(FirstLanes(count - j), row + j));
  }
  return _mm512_reduce_max_ps(largest);
}

// row[j] = exp(row[j] - max) for j < count, in place; returns their sum (16 lanes, then reduced).
SLUICE_AVX512_BASE inline float ExpLessMax(float* row, int64_t count, float max) {
  const __m512 max_v = _mm512_set1_ps(max);
  __m512 total_v = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 lanes = FirstLanes(count - j);
    const __m512 e = _mm512_maskz_mov_ps(
        lanes, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + j), max_v)));
    _mm512_mask_storeu_ps(row + j, lanes, e);
    total_v = _mm512_add_ps(total_v, e);
  }
  return _mm512_reduce_add_ps(total_v);
}

// The scores of positions [j_begin, j_end) for `rows` consecutive tokens of one sequence (row r
// attends the first first_len + r positions, and gets none past them), 16 lanes of d at a time
// (d a multiple of 16, at most 256): 16 cached positions at a time, their keys read (and widened
// from bf16 or int8) once for every row's and group's query. Row r's group g's score of position
// j goes to *where(r, g, j), scaled. A score's arithmetic does not depend on the rows beside it.
// The values of each block are asked for too (into L2), for the p.V sums that follow.
template <class T, class Where>
SLUICE_AVX512_BASE void Scores(const float* q, int64_t q_stride, int rows, int groups, const T* k,
                               const T* v, int64_t j_begin, int64_t j_end, int64_t first_len,
                               int64_t d, float scale, const float* k_scales, Where where) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  alignas(64) float widened[16 * 256];
  // The cache rows of one (sequence, KV head) are short streams, a few KB each, that the hardware
  // prefetcher barely ramps up on: the keys two blocks ahead are asked for, and this block's
  // values.
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t e = j_begin * d; e < std::min<int64_t>(j_end, j_begin + 32) * d; e += kLine) {
    _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);  // The first two blocks.
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, j_end - j0);
    const int64_t ahead = std::min<int64_t>(j_end, j0 + 48) * d;
    for (int64_t e = std::min<int64_t>(j_end, j0 + 32) * d; e < ahead; e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
    }
    for (int64_t e = j0 * d; e < (j0 + count) * d; e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(v + e), _MM_HINT_T1);
    }
    // The block's keys as fp32 rows; a last block of fewer than 16 is padded with zeros, so that
    // all 16 positions' sums below read memory of this call (the padding's sums go unstored).
    const float* keys;
    if constexpr (std::is_same_v<T, float>) {
      keys = k + j0 * d;
      if (count < 16) {
        std::copy(keys, keys + count * d, widened);
        keys = widened;
      }
    } else if constexpr (std::is_same_v<T, int8_t>) {
      for (int64_t e = 0; e < count * d; e += 16) {
        const __m512 key_scale = _mm512_set1_ps(k_scales[(j0 * d + e) / 32]);
        _mm512_store_ps(widened + e, _mm512_mul_ps(Load16(k + j0 * d + e), key_scale));
      }
      keys = widened;
    } else {
      for (int64_t e = 0; e < count * d; e += 16) {
        _mm512_store_ps(widened + e, Load16(k + j0 * d + e));
      }
      keys = widened;
    }
    if (count < 16) std::fill(widened + count * d, widened + 16 * d, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const int64_t row_count = std::min<int64_t>(count, first_len + r - j0);
      if (row_count <= 0) continue;
      for (int g = 0; g < groups; ++g) {
        const float* qg = q + r * q_stride + g * d;
        // Position jj's sum runs over d in order, 16 lanes at a time (q . k[jj] in lanes); the
        // 16 positions' sums are independent, so they go side by side, each vector of q loaded
        // once for all 16.
        __m512 dots[16];
        const __m512 q0 = _mm512_loadu_ps(qg);
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; ++jj)
          dots[jj] = _mm512_mul_ps(q0, _mm512_loadu_ps(keys + jj * d));
        for (int64_t c = 16; c < d; c += 16) {
          const __m512 qc = _mm512_loadu_ps(qg + c);
#pragma GCC unroll 16
          for (int jj = 0; jj < 16; ++jj) {
            dots[jj] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(keys + jj * d + c), dots[jj]);
          }
        }
        _mm512_mask_storeu_ps(where(r, g, j0), FirstLanes(row_count),
                              _mm512_mul_ps(ReduceLanes16(dots, AddLanes{}), scale_v));
      }
    }
  }
}

// Attention past kTiledFrom positions, a tile of kTile positions at a time (tiles start at
// multiples of kTile), with the softmax carried across tiles (as flash attention's): the scores
// of a tile for every row stay in L2 (16 rows x 4 groups x 2,048 x 4 bytes: 512 KB), where a
// whole row of a long context's scores (16 x 4 x 32,768 x 4: 8 MB) would go through memory four
// times (its maximum, exponentials, normalisation, the p.V sums). Each row and group keeps its
// running maximum m and sum l; a tile with maximum m' rescales both by exp(m - m'), its
// exponentials exp(s - m') add to l and their p.V sums (AccumulatePv, into `tile`) to the
// rescaled sums, and the result is the sums / l. Every row's arithmetic is its own, and tiles
// begin at the same positions whatever the rows, so a row still has the bits it has alone.
constexpr int64_t kTile = 2048, kTiledFrom = 4 * kTile;

template <class T>
SLUICE_AVX512_BASE void TiledAttentionRows(const float* q, int64_t q_stride, int rows, int groups,
                                           const T* k, const T* v, int64_t first_len, int64_t d,
                                           float scale, float* out, int64_t out_stride,
                                           float* scratch, const float* k_scales,
                                           const float* v_scales, const float* sinks) {
  // scratch: the tile's scores ([rows][groups][kTile]), then the sums ([rows][groups][d]), the
  // tile's p.V sums ([groups][d]), the maxima and the totals ([rows][groups] each), a row's
  // rescaling factors ([groups]): the callers' rows x groups x len floats hold them, len being
  // past 4 x kTile and d at most 256.
  const int64_t pairs = int64_t{rows} * groups;
  float* sums = scratch + pairs * kTile;
  float* tile = sums + pairs * d;
  float* maxima = tile + int64_t{groups} * d;
  float* totals = maxima + pairs;
  float* rescales = totals + pairs;
  std::fill(sums, sums + pairs * d, 0.0f);
  std::fill(maxima, maxima + pairs, -std::numeric_limits<float>::infinity());
  std::fill(totals, totals + pairs, 0.0f);
  if (sinks != nullptr) {  // Each row starts with its sink's term: e^(sink - sink), no value.
    for (int64_t pair = 0; pair < pairs; ++pair) {
      maxima[pair] = sinks[pair % groups];
      totals[pair] = 1.0f;
    }
  }
  const int64_t len = first_len + rows - 1;
  for (int64_t t0 = 0; t0 < len; t0 += kTile) {
    const int64_t t1 = std::min(len, t0 + kTile);
    Scores(q, q_stride, rows, groups, k, v, t0, t1, first_len, d, scale, k_scales,
           [&](int r, int g, int64_t j) {
             return scratch + (int64_t{r} * groups + g) * kTile + (j - t0);
           });
    for (int r = 0; r < rows; ++r) {
      const int64_t count = std::min(t1, first_len + r) - t0;
      if (count <= 0) continue;  // The row ends before this tile.
      for (int g = 0; g < groups; ++g) {
        const int64_t pair = int64_t{r} * groups + g;
        float* row = scratch + pair * kTile;
        const float before = maxima[pair];
        const float now = std::max(before, RowMax(row, count));
        const float total = ExpLessMax(row, count, now);
        const float rescale = std::exp(before - now);  // 0 at the first tile (before is -inf).
        maxima[pair] = now;
        totals[pair] = totals[pair] * rescale + total;
        rescales[g] = rescale;
      }
      PvSums(groups, v + t0 * d, count, d, scratch + int64_t{r} * groups * kTile, kTile, tile,
             v_scales == nullptr ? nullptr : v_scales + t0 * d / 32);
      for (int g = 0; g < groups; ++g) {
        float* sum = sums + (int64_t{r} * groups + g) * d;
        const __m512 rescale = _mm512_set1_ps(rescales[g]);
        for (int64_t c = 0; c < d; c += 16) {
          _mm512_storeu_ps(sum + c, _mm512_fmadd_ps(_mm512_loadu_ps(sum + c), rescale,
                                                    _mm512_loadu_ps(tile + g * d + c)));
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int g = 0; g < groups; ++g) {
      const int64_t pair = int64_t{r} * groups + g;
      const __m512 inverse = _mm512_set1_ps(1.0f / totals[pair]);
      for (int64_t c = 0; c < d; c += 16) {
        _mm512_storeu_ps(out + r * out_stride + g * d + c,
                         _mm512_mul_ps(_mm512_loadu_ps(sums + pair * d + c), inverse));
      }
    }
  }
}

// As PortableDecodeAttention, 16 lanes of d at a time (d a multiple of 16, at most 256), for
// `rows` consecutive tokens of one sequence (row r over the first len - rows + 1 + r positions):
// Scores, then each row's softmax and p.V sums (SoftmaxPv: the exponentials are vectors; each
// value row is read once for a row's groups); past kTiledFrom positions, a tile at a time
// (TiledAttentionRows). A row's arithmetic does not depend on the rows beside it, so each row
// has the bits it has alone (rows = 1: DecodeAttention).
template <class T>
SLUICE_AVX512_BASE void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups,
                                            const T* k, const T* v, int64_t len, int64_t d,
                                            float scale, float* out, int64_t out_stride,
                                            float* scratch, const float* k_scales,
                                            const float* v_scales, const float* sinks) {
  const int64_t first_len = len - (rows - 1);  // Row r attends first_len + r positions.
  if (first_len > kTiledFrom) {
    return TiledAttentionRows(q, q_stride, rows, groups, k, v, first_len, d, scale, out, out_stride,
                              scratch, k_scales, v_scales, sinks);
  }
  if (len > kTiledFrom) {  // The rows on either side of the bound, each alone.
    for (int r = 0; r < rows; ++r) {
      DecodeAttentionRows(q + r * q_stride, 0, 1, groups, k, v, first_len + r, d, scale,
                          out + r * out_stride, 0, scratch, k_scales, v_scales, sinks);
    }
    return;
  }
  Scores(q, q_stride, rows, groups, k, v, 0, len, first_len, d, scale, k_scales,
         [&](int r, int g, int64_t j) {
           return scratch + int64_t{r} * groups * len + g * (first_len + r) + j;
         });
  for (int r = 0; r < rows; ++r) {
    SoftmaxPv(groups, v, first_len + r, d, out + r * out_stride, scratch + r * groups * len,
              v_scales, sinks);
  }
}

template <class T>
SLUICE_AVX512_BASE void DecodeAttention(const float* q, int groups, const T* k, const T* v,
                                        int64_t len, int64_t d, float scale, float* out,
                                        float* scratch, const float* sinks) {
  DecodeAttentionRows(q, 0, 1, groups, k, v, len, d, scale, out, 0, scratch, nullptr, nullptr,
                      sinks);
}

// The rest of an attention once its scores are in scratch (`groups` rows of len): each row's
// softmax, then out[g] = sum_j p[g, j] v[j], 64 columns (four vectors) of up to four groups per
// pass over v.
template <class T>
SLUICE_AVX512_BASE void SoftmaxPv(int groups, const T* v, int64_t len, int64_t d, float* out,
                                  float* scratch, const float* v_scales, const float* sinks) {
  for (int g = 0; g < groups; ++g) {
    float* row = scratch + g * len;
    float max = RowMax(row, len), sink = 0;
    if (sinks != nullptr) {
      max = std::max(max, sinks[g]);
      sink = std::exp(sinks[g] - max);
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / (ExpLessMax(row, len, max) + sink));
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 lanes = FirstLanes(len - j);
      _mm512_mask_storeu_ps(row + j, lanes,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + j), inverse));
    }
  }
  PvSums(groups, v, len, d, scratch, len, out, v_scales);
}

template SLUICE_AVX512 void Matmul(const MatmulInput&, const uint16_t*, const float*, int64_t,
                                   float*, int64_t, int64_t);
template SLUICE_AVX512 void Matmul(const MatmulInput&, const int8_t*, const float*, int64_t, float*,
                                   int64_t, int64_t);
template SLUICE_AVX512_BASE void DecodeAttention(const float*, int, const float*, const float*,
                                                 int64_t, int64_t, float, float*, float*,
                                                 const float*);
template SLUICE_AVX512_BASE void DecodeAttention(const float*, int, const uint16_t*,
                                                 const uint16_t*, int64_t, int64_t, float, float*,
                                                 float*, const float*);
template SLUICE_AVX512_BASE void SoftmaxPv(int, const uint16_t*, int64_t, int64_t, float*, float*,
                                           const float*, const float*);
template SLUICE_AVX512_BASE void DecodeAttentionRows(const float*, int64_t, int, int, const float*,
                                                     const float*, int64_t, int64_t, float, float*,
                                                     int64_t, float*, const float*, const float*,
                                                     const float*);
template SLUICE_AVX512_BASE void DecodeAttentionRows(const float*, int64_t, int, int,
                                                     const uint16_t*, const uint16_t*, int64_t,
                                                     int64_t, float, float*, int64_t, float*,
                                                     const float*, const float*, const float*);
template SLUICE_AVX512_BASE void DecodeAttentionRows(const float*, int64_t, int, int, const int8_t*,
                                                     const int8_t*, int64_t, int64_t, float, float*,
                                                     int64_t, float*, const float*, const float*,
                                                     const float*);

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sluice::llm::kernels::avx512
#endif  // SLUICE_X86
