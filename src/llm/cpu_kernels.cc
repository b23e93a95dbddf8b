// Register-blocked dot products: a block of MB rows of x against NB rows of W keeps MB x NB
// eight-lane fp32 accumulators (MB x NB = 8, so eight independent FMA chains hide the FMA latency)
// and walks k eight values at a time; each weight vector is widened to fp32 once and used by
// all MB rows. Lane l of an accumulator sums the products of columns l, l + 8, l + 16, ... in
// that order, and the eight lanes are added the same way for every block shape, so the result of
// an element never depends on the shape of the block that computed it.
//
// Columns go in chunks of about 64 KiB of weights, which stay in L2 while each block of MB rows of
// x (in L1) passes over them: every weight comes from memory once per call. The AVX2 + FMA path is
// chosen at run time; other CPUs take a portable loop with the same order of additions.
#include "llm/cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SLUICE_X86 1
#endif

namespace sluice::llm {
namespace {

int64_t RoundUp8(int64_t v) { return (v + 7) & ~int64_t{7}; }
int64_t RoundUp16(int64_t v) { return (v + 15) & ~int64_t{15}; }
int64_t RoundUp32(int64_t v) { return (v + 31) & ~int64_t{31}; }
int64_t RoundUp64(int64_t v) { return (v + 63) & ~int64_t{63}; }

// The AMX layouts: one tile register's load (1 KiB) each, 16 rows of 64 bytes: bf16 tiles of 16
// rows x 32 columns, int8 tiles of 16 rows x 64 columns. Tile (t, u) -- rows [16 t, 16 t + 16),
// columns [c u, c u + c) for c columns a tile -- at (t * k_tiles + u) * 16 c, its rows one after
// the other. A layer's tiles for a range of rows form one sequential stream.
constexpr int64_t kTileElements = 16 * 32;      // bf16.
constexpr int64_t kInt8TileElements = 16 * 64;  // int8.
int64_t TileOffset(int64_t t, int64_t u, int64_t k_tiles, int64_t elements = kTileElements) {
  return (t * k_tiles + u) * elements;
}

template <class T>
void PackTiles(const T* w, int64_t n, int64_t k, T* packed, int64_t columns) {
  const int64_t k_tiles = (k + columns - 1) / columns;
  std::fill(packed, packed + PackedSize(n, k), T{0});
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; c += columns) {
      std::copy(
          w + j * k + c, w + j * k + std::min(k, c + columns),
          packed + TileOffset(j / 16, c / columns, k_tiles, 16 * columns) + (j % 16) * columns);
    }
  }
}

// Offset in the packed form of row j's weights for columns [c, c + 8), c a multiple of 8.
int64_t PackedOffset(int64_t j, int64_t c, int64_t k_padded) {
  return (j / 8) * 8 * k_padded + c * 8 + (j % 8) * 8;
}

template <class T>
void Pack(const T* w, int64_t n, int64_t k, T* packed) {
  const int64_t kp = RoundUp8(k);
  std::fill(packed, packed + PackedSize(n, k), T{0});
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; c += 8) {
      std::copy(w + j * k + c, w + j * k + std::min(k, c + 8), packed + PackedOffset(j, c, kp));
    }
  }
}

float Widen(uint16_t w) { return Bf16ToFp32(w); }
float Widen(int8_t w) { return static_cast<float>(w); }

// The portable path: eight lane sums per element, added up as the vector path does.
template <class T>
void PortableMatmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales,
                    int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  const int64_t kp = RoundUp8(k);
  for (int64_t j = n_begin; j < n_end; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float lanes[8] = {};
      for (int64_t c = 0; c < kp; c += 8) {
        const T* wc = w + PackedOffset(j, c, kp);
        for (int64_t l = 0; l < 8; ++l) {
          const float xv = c + l < k ? x[i * k + c + l] : 0.0f;
          lanes[l] = std::fma(xv, Widen(wc[l]), lanes[l]);
        }
      }
      // The order of HorizontalSum below: (l, l + 4) pairs, then (0, 2), (1, 3), then the two.
      float quad[4];
      for (int l = 0; l < 4; ++l) quad[l] = lanes[l] + lanes[l + 4];
      const float sum = (quad[0] + quad[2]) + (quad[1] + quad[3]);
      y[i * n + j] = scales != nullptr ? sum * scales[j] : sum;
    }
  }
}

// Softmax of each of `groups` rows of `len` scores, in place.
void SoftmaxRows(float* scores, int groups, int64_t len) {
  for (int g = 0; g < groups; ++g) {
    float* row = scores + g * len;
    const float max = *std::max_element(row, row + len);
    float total = 0;
    for (int64_t j = 0; j < len; ++j) total += row[j] = std::exp(row[j] - max);
    const float inverse = 1.0f / total;
    for (int64_t j = 0; j < len; ++j) row[j] *= inverse;
  }
}

float Widen(float w) { return w; }

template <class T>
void PortableDecodeAttention(const float* q, int groups, const T* k, const T* v, int64_t len,
                             int64_t d, float scale, float* out, float* scratch) {
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[g * d + c] * Widen(k[j * d + c]);
      scratch[g * len + j] = dot * scale;
    }
  }
  SoftmaxRows(scratch, groups, len);
  std::fill(out, out + groups * d, 0.0f);
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      const float p = scratch[g * len + j];
      for (int64_t c = 0; c < d; ++c) out[g * d + c] += p * Widen(v[j * d + c]);
    }
  }
}

#ifdef SLUICE_X86
#define SLUICE_AVX2 __attribute__((target("avx2,fma")))

// As PortableDecodeAttention, eight lanes of d at a time (d a multiple of 8).
SLUICE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
SLUICE_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

template <class T>
SLUICE_AVX2 void Avx2DecodeAttention(const float* q, int groups, const T* k, const T* v,
                                     int64_t len, int64_t d, float scale, float* out,
                                     float* scratch) {
  for (int64_t j = 0; j < len; ++j) {
    const T* kj = k + j * d;
    for (int g = 0; g < groups; ++g) {
      const float* qg = q + g * d;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c), Load8(kj + c), acc);
      }
      __m128 sum = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
      sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
      scratch[g * len + j] = _mm_cvtss_f32(sum) * scale;
    }
  }
  SoftmaxRows(scratch, groups, len);
  for (int g = 0; g < groups; ++g) {
    const float* p = scratch + g * len;
    for (int64_t c = 0; c < d; c += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = 0; j < len; ++j) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), Load8(v + j * d + c), acc);
      }
      _mm256_storeu_ps(out + g * d + c, acc);
    }
  }
}

SLUICE_AVX2 inline __m256 Widen8(const uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
SLUICE_AVX2 inline __m256 Widen8(const int8_t* w) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
SLUICE_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// Rows [i0, i0 + MB) of x against weight rows [j0, j0 + NB), all in one group of eight.
template <int MB, int NB, class T>
SLUICE_AVX2 void Block(const float* x, int64_t k, const T* w, const float* scales, int64_t n,
                       float* y, int64_t i0, int64_t j0) {
  // The accumulators must live in registers: the loops over the block are unrolled (pragmas), as
  // GCC at -O2 otherwise keeps the array in memory and every FMA waits on a store.
  __m256 acc[MB][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int64_t kp = RoundUp8(k), k8 = k & ~int64_t{7};
  const T* wr = w + PackedOffset(j0, 0, kp);
  const float* xr[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) xr[i] = x + (i0 + i) * k;
  for (int64_t c = 0; c < kp; c += 8) {
    __m256 xv[MB];
    if (c < k8) {
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) xv[i] = _mm256_loadu_ps(xr[i] + c);
    } else {  // The last, partial run of columns: the padding weights are zero.
      alignas(32) int32_t mask[8];
      for (int l = 0; l < 8; ++l) mask[l] = c + l < k ? -1 : 0;
      const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask));
      for (int i = 0; i < MB; ++i) xv[i] = _mm256_maskload_ps(xr[i] + c, lanes);
    }
    const T* wc = wr + c * 8;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m256 wv = Widen8(wc + j * 8);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      const float sum = HorizontalSum(acc[i][j]);
      y[(i0 + i) * n + j0 + j] = scales != nullptr ? sum * scales[j0 + j] : sum;
    }
  }
}

// Columns [j_begin, j_end) for every row of x; j_end - j_begin is a multiple of NB, and a block
// of NB columns never straddles two groups of eight.
template <int MB, int NB, class T>
SLUICE_AVX2 void Columns(const float* x, int64_t m, int64_t k, const T* w, const float* scales,
                         int64_t n, float* y, int64_t j_begin, int64_t j_end) {
  const int64_t group_bytes = 8 * RoundUp8(k) * static_cast<int64_t>(sizeof(T));
  const int64_t chunk = std::max<int64_t>(1, (64 << 10) / group_bytes) * 8;
  for (int64_t c0 = j_begin; c0 < j_end; c0 += chunk) {
    const int64_t c1 = std::min(j_end, c0 + chunk);
    int64_t i = 0;
    for (; i + MB <= m; i += MB) {
      for (int64_t j = c0; j < c1; j += NB) Block<MB, NB, T>(x, k, w, scales, n, y, i, j);
    }
    if constexpr (MB > 1) {
      for (; i < m; ++i) {
        for (int64_t j = c0; j < c1; j += NB) Block<1, NB, T>(x, k, w, scales, n, y, i, j);
      }
    }
  }
}

template <class T>
SLUICE_AVX2 void Avx2Matmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales,
                            int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  // Whole groups of eight columns, then the last group's real columns one at a time.
  const int64_t grouped = n_begin + (n_end - n_begin) / 8 * 8;
  if (m == 1) {
    Columns<1, 8, T>(x, m, k, w, scales, n, y, n_begin, grouped);
  } else if (m < 4) {
    Columns<2, 4, T>(x, m, k, w, scales, n, y, n_begin, grouped);
  } else {
    Columns<4, 2, T>(x, m, k, w, scales, n, y, n_begin, grouped);
  }
  Columns<4, 1, T>(x, m, k, w, scales, n, y, grouped, n_end);
}

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
#define SLUICE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// GCC 12 warns that the "undefined" vector inside its own AVX-512 conversion intrinsics may be
// used uninitialized (a false positive of its headers, not of this code).
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
SLUICE_AVX512 void Avx512Matmul(const MatmulInput& x, const T* w, const float* scales, int64_t n,
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

// The first min(16, max(0, count)) lanes.
inline __mmask16 FirstLanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xffff : count > 0 ? (1u << count) - 1 : 0);
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
#define SLUICE_AMX                                                                         \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16,amx-int8," \
                        "prfchw")))

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

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
  _tile_loadconfig(&config);
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
  _tile_loadconfig(&config);
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

// e^x for x <= 0 (softmax scores less their maximum), 16 lanes: x = n ln 2 + r with |r| <= ln 2 /
// 2, e^r by its degree-6 Taylor polynomial (relative error below 3e-7 on that range), times 2^n
// built in the exponent bits. Below -87 the result is 0, as expf's would underflow to denormals.
SLUICE_AVX512 inline __m512 Exp16(__m512 x) {
  const __m512 floor_x = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, floor_x, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor_x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln 2, with ln 2 split in two so that n ln 2 is exact enough.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i scale =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), p, _mm512_castsi512_ps(scale));
}

SLUICE_AVX512 int64_t Avx512ArgMax(const float* x, int64_t n) {
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
SLUICE_AVX512 void Avx512RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight,
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
SLUICE_AVX512 void Avx512SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
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
// v: [len, d] from the first column wanted; p: G rows of len; out: G rows of d.
SLUICE_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
SLUICE_AVX512 inline __m512 Load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <class T, int G, int V>
SLUICE_AVX512 void AccumulatePv(const T* v, int64_t d, int64_t len, const float* p, float* out) {
  __m512 acc[G][V];
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < V; ++u) acc[g][u] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < len; ++j) {
    const T* vj = v + j * d;
    __m512 rows[V];
    for (int u = 0; u < V; ++u) rows[u] = Load16(vj + 16 * u);
    for (int g = 0; g < G; ++g) {
      const __m512 weight = _mm512_set1_ps(p[g * len + j]);
      for (int u = 0; u < V; ++u) acc[g][u] = _mm512_fmadd_ps(weight, rows[u], acc[g][u]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < V; ++u) _mm512_storeu_ps(out + g * d + 16 * u, acc[g][u]);
  }
}

template <class T>
using AccumulatePvFn = void (*)(const T*, int64_t, int64_t, const float*, float*);
// [groups - 1][vectors - 1].
template <class T>
constexpr AccumulatePvFn<T> kAccumulatePv[4][4] = {
    {AccumulatePv<T, 1, 1>, AccumulatePv<T, 1, 2>, AccumulatePv<T, 1, 3>, AccumulatePv<T, 1, 4>},
    {AccumulatePv<T, 2, 1>, AccumulatePv<T, 2, 2>, AccumulatePv<T, 2, 3>, AccumulatePv<T, 2, 4>},
    {AccumulatePv<T, 3, 1>, AccumulatePv<T, 3, 2>, AccumulatePv<T, 3, 3>, AccumulatePv<T, 3, 4>},
    {AccumulatePv<T, 4, 1>, AccumulatePv<T, 4, 2>, AccumulatePv<T, 4, 3>, AccumulatePv<T, 4, 4>}};

// As PortableDecodeAttention, 16 lanes of d at a time (d a multiple of 16): each cached key and
// value row is read once for all the groups' queries, and the softmax's exponentials are vectors.
// The 16 sums of the lanes of a[0] .. a[15], as one vector (lane i: the sum of a[i]'s lanes): pairs
// interleaved and added, then pairs of pairs, then the 128-bit lanes exchanged and added. 46
// instructions where sixteen horizontal sums take about 150.
SLUICE_AVX512 inline __m512 SumLanes16(const __m512 (&a)[16]) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // quads[m], 128-bit lane L: the sums over lane L of a[4 m] .. a[4 m + 3].
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88),
                       _mm512_shuffle_f32x4(low, high, 0xDD));
}

template <class T>
SLUICE_AVX512 void Avx512SoftmaxPv(int groups, const T* v, int64_t len, int64_t d, float* out,
                                   float* scratch);

// As PortableDecodeAttention, 16 lanes of d at a time (d a multiple of 16, at most 256): the
// scores of 16 cached positions at a time, their keys read (and widened from bf16) once for all
// the groups' queries; the softmax's exponentials are vectors; each value row is read once too.
template <class T>
SLUICE_AVX512 void Avx512DecodeAttention(const float* q, int groups, const T* k, const T* v,
                                         int64_t len, int64_t d, float scale, float* out,
                                         float* scratch) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  alignas(64) float widened[16 * 256];
  // The cache rows of one (sequence, KV head) are short streams, a few KB each, that the hardware
  // prefetcher barely ramps up on: the keys two blocks ahead are asked for, and this block's
  // values too (into L2; the p.V sums below read them).
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t block_elements = 16 * d;
  for (int64_t e = 0; e < std::min<int64_t>(len, 32) * d; e += kLine) {  // The first two blocks.
    _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
  }
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, len - j0);
    const int64_t ahead = std::min<int64_t>(len, j0 + 48) * d;
    for (int64_t e = std::min<int64_t>(len, j0 + 32) * d; e < ahead; e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(k + e), _MM_HINT_T0);
    }
    for (int64_t e = j0 * d; e < j0 * d + std::min(block_elements, count * d); e += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(v + e), _MM_HINT_T1);
    }
    const float* keys;
    if constexpr (std::is_same_v<T, float>) {
      keys = k + j0 * d;
    } else {
      for (int64_t e = 0; e < count * d; e += 16) {
        _mm512_store_ps(widened + e, Load16(k + j0 * d + e));
      }
      keys = widened;
    }
    for (int g = 0; g < groups; ++g) {
      const float* qg = q + g * d;
      __m512 dots[16];
      for (int64_t jj = 0; jj < 16; ++jj) {
        if (jj >= count) {
          dots[jj] = _mm512_setzero_ps();
          continue;
        }
        const float* kj = keys + jj * d;
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(kj));
        for (int64_t c = 16; c < d; c += 16) {
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + c), _mm512_loadu_ps(kj + c), acc);
        }
        dots[jj] = acc;
      }
      _mm512_mask_storeu_ps(scratch + g * len + j0, FirstLanes(count),
                            _mm512_mul_ps(SumLanes16(dots), scale_v));
    }
  }
  Avx512SoftmaxPv(groups, v, len, d, out, scratch);
}

// The rest of an attention once its scores are in scratch (`groups` rows of len): each row's
// softmax, then out[g] = sum_j p[g, j] v[j], 64 columns (four vectors) of up to four groups per
// pass over v.
template <class T>
SLUICE_AVX512 void Avx512SoftmaxPv(int groups, const T* v, int64_t len, int64_t d, float* out,
                                   float* scratch) {
  for (int g = 0; g < groups; ++g) {
    float* row = scratch + g * len;
    const float max = *std::max_element(row, row + len);
    const __m512 max_v = _mm512_set1_ps(max);
    __m512 total_v = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 lanes = FirstLanes(len - j);
      const __m512 e = _mm512_maskz_mov_ps(
          lanes, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + j), max_v)));
      _mm512_mask_storeu_ps(row + j, lanes, e);
      total_v = _mm512_add_ps(total_v, e);
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total_v));
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 lanes = FirstLanes(len - j);
      _mm512_mask_storeu_ps(row + j, lanes,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + j), inverse));
    }
  }
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int vectors = static_cast<int>(std::min<int64_t>(4, (d - c0) / 16));
    for (int g0 = 0; g0 < groups; g0 += 4) {
      const int gs = std::min(4, groups - g0);
      kAccumulatePv<T>[gs - 1][vectors - 1](v + c0, d, len, scratch + g0 * len, out + g0 * d + c0);
    }
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
  _tile_loadconfig(&config);
  alignas(64) uint16_t rounded[16 * 128];
  alignas(64) uint32_t pairs[4][16][16];
  RoundRows(q, groups, d, d, rounded);
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
SLUICE_AMX void AmxDecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v,
                                   int64_t len, int64_t d, float scale, float* out,
                                   float* scratch) {
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
  Avx512SoftmaxPv(groups, v, len, d, out, scratch);
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
SLUICE_AMX void AmxMatmul(const MatmulInput& x, const void* weights, const float* scales, int64_t n,
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

bool AmxUsable() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u, amx_int8 = (edx >> 25) & 1u;
  if (!amx_bf16 || !amx_tile || !amx_int8) return false;
  // Linux hands out the 8 KiB of tile state only to processes that ask (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA).
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// SLUICE_CPU_KERNELS=portable|avx2|avx512bf16 caps the path (to compare them on one machine).
KernelIsa LimitFromEnvironment() {
  const char* name = std::getenv("SLUICE_CPU_KERNELS");
  if (name == nullptr) return KernelIsa::kAmx;
  for (KernelIsa isa :
       {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512Bf16, KernelIsa::kAmx}) {
    if (std::strcmp(name, KernelIsaName(isa)) == 0) return isa;
  }
  std::fprintf(stderr,
               "SLUICE_CPU_KERNELS=%s is none of portable, avx2, avx512bf16, amx: ignored\n", name);
  return KernelIsa::kAmx;
}

std::atomic<KernelIsa> isa_limit{LimitFromEnvironment()};

KernelIsa Supported() {
  static const KernelIsa best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
      return AmxUsable() ? KernelIsa::kAmx : KernelIsa::kAvx512Bf16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KernelIsa::kAvx2;
    return KernelIsa::kPortable;
  }();
  return best;
}
#else
std::atomic<KernelIsa> isa_limit{KernelIsa::kAmx};
KernelIsa Supported() { return KernelIsa::kPortable; }
#endif

// The path in use: the best the CPU has, within the limit.
KernelIsa Active() { return std::min(Supported(), isa_limit.load(std::memory_order_relaxed)); }

}  // namespace

KernelIsa BestKernelIsa() { return Supported(); }

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAmx:
      return "amx";
    case KernelIsa::kAvx512Bf16:
      return "avx512bf16";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kPortable:
      break;
  }
  return "portable";
}

const char* CpuKernelIsa() { return KernelIsaName(Active()); }

void LimitKernelIsa(KernelIsa limit) { isa_limit.store(limit); }

int64_t PackedSize(int64_t n, int64_t k) { return RoundUp16(n) * RoundUp64(k); }

void PackBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
  if (Active() == KernelIsa::kAmx) return PackTiles(w, n, k, packed, 32);
  Pack(w, n, k, packed);
}
void PackInt8(const int8_t* w, int64_t n, int64_t k, int8_t* packed) {
  if (Active() == KernelIsa::kAmx) return PackTiles(w, n, k, packed, 64);
  Pack(w, n, k, packed);
}

void MatmulInput::Prepare(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights) {
  Reserve(x_rows, rows, columns, int8_weights);
  Fill(0, Units());
}

void MatmulInput::Reserve(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights) {
  x = x_rows;
  m = rows;
  k = columns;
  isa = Active();
  for_int8 = int8_weights;
#ifdef SLUICE_X86
  if (isa == KernelIsa::kAvx512Bf16) {
    this->rows.resize(static_cast<size_t>(m * RoundUp8(k)));
  } else if (isa == KernelIsa::kAmx && !int8_weights) {
    pairs.resize(static_cast<size_t>(((m + 15) / 16) * (RoundUp32(k) / 32) * 256));
  }
#endif
}

// The AMX bf16 form goes by (block of 16 rows, 32 columns), AVX-512 BF16's by blocks of 16 rows;
// the int8 AMX form is made in one piece (its rows' scales come first); the paths that keep x
// fp32 need nothing.
int64_t MatmulInput::Units() const {
  if (isa == KernelIsa::kAmx && for_int8) return 1;
  if (isa == KernelIsa::kAmx) return (m + 15) / 16 * (RoundUp32(k) / 32);
  if (isa == KernelIsa::kAvx512Bf16) return (m + 15) / 16;
  return 0;
}

void MatmulInput::Fill(int64_t unit_begin, int64_t unit_end) {
#ifdef SLUICE_X86
  if (unit_begin >= unit_end) return;
  if (isa == KernelIsa::kAvx512Bf16) {
    const int64_t first = unit_begin * 16, last = std::min(m, unit_end * 16);
    RoundRows(x + first * k, last - first, k, RoundUp8(k), rows.data() + first * RoundUp8(k));
  } else if (isa == KernelIsa::kAmx && for_int8) {
    QuadRows(x, m, k, this);
  } else if (isa == KernelIsa::kAmx) {
    PairRows(x, m, k, &pairs, unit_begin, unit_end);
  }
#endif
}

namespace {

// The path x was prepared for; scales is null for bf16 weights.
template <class T>
void Dispatch(const MatmulInput& x, const T* w, const float* scales, int64_t n, float* y,
              int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  switch (x.isa) {
    case KernelIsa::kAmx:
      if constexpr (std::is_same_v<T, int8_t>) {
        if (!x.for_int8) {  // Prepared for bf16 weights: x's int8 form is needed.
          thread_local MatmulInput quads;
          quads.Prepare(x.x, x.m, x.k, true);
          return AmxMatmul<true>(quads, w, scales, n, y, n_begin, n_end);
        }
        return AmxMatmul<true>(x, w, scales, n, y, n_begin, n_end);
      } else {
        return AmxMatmul<false>(x, w, nullptr, n, y, n_begin, n_end);
      }
    case KernelIsa::kAvx512Bf16:
      return Avx512Matmul(x, w, scales, n, y, n_begin, n_end);
    case KernelIsa::kAvx2:
      return Avx2Matmul(x.x, x.m, x.k, w, scales, n, y, n_begin, n_end);
    case KernelIsa::kPortable:
      break;
  }
#endif
  PortableMatmul(x.x, x.m, x.k, w, scales, n, y, n_begin, n_end);
}

}  // namespace

void MatmulBf16(const MatmulInput& x, const uint16_t* w, int64_t n, float* y, int64_t n_begin,
                int64_t n_end) {
  Dispatch(x, w, nullptr, n, y, n_begin, n_end);
}

void MatmulInt8(const MatmulInput& x, const int8_t* w, const float* scales, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
  Dispatch(x, w, scales, n, y, n_begin, n_end);
}

void MatmulBf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
  thread_local MatmulInput input;
  input.Prepare(x, m, k);
  MatmulBf16(input, w, n, y, n_begin, n_end);
}

void MatmulInt8(const float* x, int64_t m, int64_t k, const int8_t* w, const float* scales,
                int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  thread_local MatmulInput input;
  input.Prepare(x, m, k, true);
  MatmulInt8(input, w, scales, n, y, n_begin, n_end);
}

namespace {

template <class T>
void DecodeAttentionOn(const float* q, int groups, const T* k, const T* v, int64_t len, int64_t d,
                       float scale, float* out, float* scratch) {
#ifdef SLUICE_X86
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (Active() >= KernelIsa::kAmx && d % 32 == 0 && d <= 128 && groups <= 16) {
      if (groups <= 4 && d <= 64) {
        return kFusedAttention[groups - 1][d / 32 - 1](q, k, v, len, scale, out);
      }
      return AmxDecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
    }
  }
  if (Active() >= KernelIsa::kAvx512Bf16 && d % 16 == 0 && d <= 256) {
    return Avx512DecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
  }
  if (Active() >= KernelIsa::kAvx2 && d % 8 == 0) {
    return Avx2DecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
  }
#endif
  PortableDecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
}

}  // namespace

void DecodeAttention(const float* q, int groups, const float* k, const float* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch) {
  DecodeAttentionOn(q, groups, k, v, len, d, scale, out, scratch);
}

void DecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch) {
  DecodeAttentionOn(q, groups, k, v, len, d, scale, out, scratch);
}

void ToBf16(const float* x, int64_t n, uint16_t* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return RoundRows(x, 1, n, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = Fp32ToBf16(x[i]);
}

int64_t ArgMax(const float* x, int64_t n) {
  if (n <= 0) return 0;
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) {
    const int64_t at = Avx512ArgMax(x, n);
    if (!std::isnan(x[at])) return at;  // NaNs: the portable rule below.
  }
#endif
  return std::max_element(x, x + n) - x;
}

void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return Avx512RmsNorm(x, rows, width, weight, eps, out);
#endif
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * width;
    float squares = 0;
    for (int64_t c = 0; c < width; ++c) squares += row[c] * row[c];
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
    for (int64_t c = 0; c < width; ++c) out[t * width + c] = weight[c] * (row[c] * inverse);
  }
}

void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return Avx512SwiGlu(gate_up, rows, inter, out);
#endif
  for (int64_t t = 0; t < rows; ++t) {
    const float* gate = gate_up + t * 2 * inter;
    for (int64_t c = 0; c < inter; ++c) {
      const float g = gate[c];
      out[t * inter + c] = g / (1.0f + std::exp(-g)) * gate[inter + c];
    }
  }
}

uint16_t Fp32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFp32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

}  // namespace sluice::llm
