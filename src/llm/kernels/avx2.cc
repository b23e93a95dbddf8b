// The AVX2 + FMA path. Register-blocked dot products: a block of MB rows of x against NB rows of W
// keeps MB x NB eight-lane fp32 accumulators (MB x NB = 8, so eight independent FMA chains hide the
// FMA latency) and walks k eight values at a time; each weight vector is widened to fp32 once and
// used by all MB rows. Lane l of an accumulator sums the products of columns l, l + 8, l + 16, ...
// in that order, and the eight lanes are added the same way for every block shape, so the result
// of an element never depends on the shape of the block that computed it.
//
// Columns go in chunks of about 64 KiB of weights, which stay in L2 while each block of MB rows of
// x (in L1) passes over them: every weight comes from memory once per call.
#include <algorithm>
#include <cmath>
#include <limits>

#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
namespace sluice::llm::kernels::avx2 {

// e^x for x <= 0, eight lanes: avx512's Exp16 (internal.h) on AVX2 -- x = n ln 2 + r, e^r by its
// degree-6 Taylor polynomial, times 2^n built in the exponent bits; 0 below -87.
SLUICE_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 floor_x = _mm256_set1_ps(-87.0f);
  const __m256 kept = _mm256_cmp_ps(x, floor_x, _CMP_GE_OQ);
  x = _mm256_max_ps(x, floor_x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i scale =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(kept, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
}

// Lanes [0, count) of eight (count >= 8: all of them), for masked loads and stores.
SLUICE_AVX2 inline __m256i FirstLanes8(int64_t count) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))),
                            lanes);
}

SLUICE_AVX2 inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

SLUICE_AVX2 inline float HorizontalAdd(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

SLUICE_AVX2 void SoftmaxRows(float* scores, int groups, int64_t len, const float* sinks) {
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int g = 0; g < groups; ++g) {
    float* row = scores + g * len;
    __m256 top = lowest;
    for (int64_t j = 0; j < len; j += 8) {
      const __m256i in = FirstLanes8(len - j);
      top = _mm256_max_ps(
          top, _mm256_blendv_ps(lowest, _mm256_maskload_ps(row + j, in), _mm256_castsi256_ps(in)));
    }
    float largest = HorizontalMax(top);
    if (sinks != nullptr) largest = std::max(largest, sinks[g]);
    const __m256 max = _mm256_set1_ps(largest);
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; j += 8) {
      const __m256i in = FirstLanes8(len - j);
      const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(in),
                                     Exp8(_mm256_sub_ps(_mm256_maskload_ps(row + j, in), max)));
      _mm256_maskstore_ps(row + j, in, e);
      total = _mm256_add_ps(total, e);
    }
    const float sink = sinks != nullptr ? std::exp(sinks[g] - largest) : 0.0f;
    const __m256 inverse = _mm256_set1_ps(1.0f / (HorizontalAdd(total) + sink));
    for (int64_t j = 0; j < len; j += 8) {
      const __m256i in = FirstLanes8(len - j);
      _mm256_maskstore_ps(row + j, in, _mm256_mul_ps(_mm256_maskload_ps(row + j, in), inverse));
    }
  }
}

SLUICE_AVX2 void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight,
                         float eps, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * width;
    __m256 sums[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                      _mm256_setzero_ps()};
    for (int64_t c = 0; c < width; c += 8) {
      const __m256 v = _mm256_maskload_ps(row + c, FirstLanes8(width - c));
      sums[(c / 8) % 4] = _mm256_fmadd_ps(v, v, sums[(c / 8) % 4]);
    }
    const float squares = HorizontalAdd(
        _mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3])));
    const __m256 inverse =
        _mm256_set1_ps(1.0f / std::sqrt(squares / static_cast<float>(width) + eps));
    for (int64_t c = 0; c < width; c += 8) {
      const __m256i lanes = FirstLanes8(width - c);
      const __m256 scaled = _mm256_mul_ps(_mm256_maskload_ps(row + c, lanes), inverse);
      _mm256_maskstore_ps(out + t * width + c, lanes,
                          _mm256_mul_ps(_mm256_maskload_ps(weight + c, lanes), scaled));
    }
  }
}

// g sigmoid(z), as g / (1 + e) when z >= 0 and g e / (1 + e) when z < 0, e = e^-|z|: no
// overflow on either side.
SLUICE_AVX2 inline __m256 TimesSigmoid(__m256 g, __m256 z) {
  const __m256 e = Exp8(_mm256_or_ps(z, _mm256_set1_ps(-0.0f)));  // e^-|z|
  const __m256 negative = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), negative);
  return _mm256_div_ps(numerator, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// out[t, c] = gate(g) * up for each row of gate_up ([rows, 2 inter]: the gate, then up).
template <class Gate>
SLUICE_AVX2 inline void GatedRows(const float* gate_up, int64_t rows, int64_t inter, float* out,
                                  Gate gate) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* g = gate_up + t * 2 * inter;
    const float* up = g + inter;
    for (int64_t c = 0; c < inter; c += 8) {
      const __m256i lanes = FirstLanes8(inter - c);
      _mm256_maskstore_ps(
          out + t * inter + c, lanes,
          _mm256_mul_ps(gate(_mm256_maskload_ps(g + c, lanes)), _mm256_maskload_ps(up + c, lanes)));
    }
  }
}

// silu(g) = g sigmoid(g).
SLUICE_AVX2 void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  GatedRows(gate_up, rows, inter, out, [](__m256 g) SLUICE_AVX2 { return TimesSigmoid(g, g); });
}

// gelu(g) = g sigmoid(2 u), u = sqrt(2 / pi) (g + 0.044715 g^3).
SLUICE_AVX2 void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  GatedRows(gate_up, rows, inter, out, [](__m256 g) SLUICE_AVX2 {
    const __m256 cubic = _mm256_mul_ps(_mm256_set1_ps(0.044715f), _mm256_mul_ps(g, g));
    return TimesSigmoid(
        g, _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f), _mm256_fmadd_ps(cubic, g, g)));
  });
}

SLUICE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
SLUICE_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// The eight sums of the lanes of a[0] .. a[7], as one vector (lane i: the sum of a[i]'s lanes):
// pairs interleaved and added, then pairs of pairs, then the 128-bit halves exchanged and added.
// 21 instructions where eight horizontal sums take about 50.
SLUICE_AVX2 inline __m256 SumLanes8(const __m256 (&a)[8]) {
  __m256 pairs[4];
  for (int i = 0; i < 4; ++i) {
    pairs[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  __m256 quads[2];  // Each 128-bit half h: the sums over half h of a[4 m] .. a[4 m + 3].
  for (int m = 0; m < 2; ++m) {
    const __m256d x = _mm256_castps_pd(pairs[2 * m]), y = _mm256_castps_pd(pairs[2 * m + 1]);
    quads[m] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                       _mm256_permute2f128_ps(quads[0], quads[1], 0x31));
}

// The scores of up to eight cached positions (count) for GS queries: each key vector read (and
// widened from bf16) once for all GS queries, each (position, query) an eight-lane partial sum,
// the eight positions' sums of one query then added across lanes at once (SumLanes8).
template <class T, int GS>
SLUICE_AVX2 void Scores8(const float* q, const T* k, int64_t count, int64_t d, float scale,
                         float* scores, int64_t len) {
  __m256 dots[GS][8];
  for (int64_t jj = 0; jj < 8; ++jj) {
    __m256 acc[GS];
#pragma GCC unroll 4
    for (int g = 0; g < GS; ++g) acc[g] = _mm256_setzero_ps();
    if (jj < count) {
      const T* kj = k + jj * d;
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 key = Load8(kj + c);
#pragma GCC unroll 4
        for (int g = 0; g < GS; ++g) {
          acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), key, acc[g]);
        }
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < GS; ++g) dots[g][jj] = acc[g];
  }
  const __m256i lanes = FirstLanes8(count);
  for (int g = 0; g < GS; ++g) {
    _mm256_maskstore_ps(scores + g * len, lanes,
                        _mm256_mul_ps(SumLanes8(dots[g]), _mm256_set1_ps(scale)));
  }
}

// out[g][0, 8 V) = sum_j p[g, j] v[j][0, 8 V) for GS queries at once, each value vector read (and
// widened) once for all of them; GS x V accumulators in registers.
template <class T, int GS, int V>
SLUICE_AVX2 void AccumulatePv8(const T* v, int64_t d, int64_t len, const float* p, float* out) {
  // The loops over the accumulators are unrolled (pragmas) so that they stay in registers.
  __m256 acc[GS][V];
#pragma GCC unroll 4
  for (int g = 0; g < GS; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) acc[g][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < len; ++j) {
    __m256 value[V];
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) value[c] = Load8(v + j * d + 8 * c);
#pragma GCC unroll 4
    for (int g = 0; g < GS; ++g) {
      const __m256 weight = _mm256_broadcast_ss(p + g * len + j);
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) acc[g][c] = _mm256_fmadd_ps(weight, value[c], acc[g][c]);
    }
  }
  for (int g = 0; g < GS; ++g) {
    for (int c = 0; c < V; ++c) _mm256_storeu_ps(out + g * d + 8 * c, acc[g][c]);
  }
}

template <class T>
using ScoresFn = void (*)(const float*, const T*, int64_t, int64_t, float, float*, int64_t);
template <class T>
constexpr ScoresFn<T> kScores8[4] = {Scores8<T, 1>, Scores8<T, 2>, Scores8<T, 3>, Scores8<T, 4>};
template <class T>
using AccumulatePvFn = void (*)(const T*, int64_t, int64_t, const float*, float*);
// [groups - 1][vectors - 1]; at most 8 accumulators where the shape allows (FMA's latency wants
// eight independent chains; more spill out of the 16 registers).
template <class T>
constexpr AccumulatePvFn<T> kAccumulatePv8[4][4] = {
    {AccumulatePv8<T, 1, 1>, AccumulatePv8<T, 1, 2>, AccumulatePv8<T, 1, 3>,
     AccumulatePv8<T, 1, 4>},
    {AccumulatePv8<T, 2, 1>, AccumulatePv8<T, 2, 2>, AccumulatePv8<T, 2, 3>,
     AccumulatePv8<T, 2, 4>},
    {AccumulatePv8<T, 3, 1>, AccumulatePv8<T, 3, 2>, AccumulatePv8<T, 3, 3>, nullptr},
    {AccumulatePv8<T, 4, 1>, AccumulatePv8<T, 4, 2>, nullptr, nullptr}};
// The most vectors a pass of AccumulatePv8 covers for 1, 2, 3 or 4 queries.
constexpr int kPvVectors[4] = {4, 4, 3, 2};

// As PortableDecodeAttention, eight lanes of d at a time (d a multiple of 8): the scores of eight
// cached positions at a time, each key read once for up to four queries of the group; the
// softmax's exponentials are vectors; each value row is read once for up to four queries. (One
// horizontal sum per position and query, and the values re-read per query and per eight columns,
// ran at 2.8 GB/s of bf16 cache on one thread.)
template <class T>
SLUICE_AVX2 void DecodeAttention(const float* q, int groups, const T* k, const T* v, int64_t len,
                                 int64_t d, float scale, float* out, float* scratch,
                                 const float* sinks) {
  for (int64_t j0 = 0; j0 < len; j0 += 8) {
    const int64_t count = std::min<int64_t>(8, len - j0);
    for (int g0 = 0; g0 < groups; g0 += 4) {
      const int gs = std::min(4, groups - g0);
      kScores8<T>[gs - 1](q + g0 * d, k + j0 * d, count, d, scale, scratch + g0 * len + j0, len);
    }
  }
  SoftmaxRows(scratch, groups, len, sinks);
  for (int g0 = 0; g0 < groups; g0 += 4) {
    const int gs = std::min(4, groups - g0);
    for (int64_t c0 = 0; c0 < d; c0 += 8 * kPvVectors[gs - 1]) {
      const int vectors = static_cast<int>(std::min<int64_t>(kPvVectors[gs - 1], (d - c0) / 8));
      kAccumulatePv8<T>[gs - 1][vectors - 1](v + c0, d, len, scratch + g0 * len, out + g0 * d + c0);
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
SLUICE_AVX2 void Matmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales,
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

template SLUICE_AVX2 void Matmul(const float*, int64_t, int64_t, const uint16_t*, const float*,
                                 int64_t, float*, int64_t, int64_t);
template SLUICE_AVX2 void Matmul(const float*, int64_t, int64_t, const int8_t*, const float*,
                                 int64_t, float*, int64_t, int64_t);
template SLUICE_AVX2 void DecodeAttention(const float*, int, const float*, const float*, int64_t,
                                          int64_t, float, float*, float*, const float*);
template SLUICE_AVX2 void DecodeAttention(const float*, int, const uint16_t*, const uint16_t*,
                                          int64_t, int64_t, float, float*, float*, const float*);

}  // namespace sluice::llm::kernels::avx2
#endif  // SLUICE_X86
