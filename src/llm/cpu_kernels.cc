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
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_X86 1
#endif

namespace sluice::llm {
namespace {

int64_t RoundUp8(int64_t v) { return (v + 7) & ~int64_t{7}; }

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

void PortableDecodeAttention(const float* q, int groups, const float* k, const float* v,
                             int64_t len, int64_t d, float scale, float* out, float* scratch) {
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[g * d + c] * k[j * d + c];
      scratch[g * len + j] = dot * scale;
    }
  }
  SoftmaxRows(scratch, groups, len);
  std::fill(out, out + groups * d, 0.0f);
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      const float p = scratch[g * len + j];
      for (int64_t c = 0; c < d; ++c) out[g * d + c] += p * v[j * d + c];
    }
  }
}

#ifdef SLUICE_X86
#define SLUICE_AVX2 __attribute__((target("avx2,fma")))

// As PortableDecodeAttention, eight lanes of d at a time (d a multiple of 8).
SLUICE_AVX2 void Avx2DecodeAttention(const float* q, int groups, const float* k, const float* v,
                                     int64_t len, int64_t d, float scale, float* out,
                                     float* scratch) {
  for (int64_t j = 0; j < len; ++j) {
    const float* kj = k + j * d;
    for (int g = 0; g < groups; ++g) {
      const float* qg = q + g * d;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c), _mm256_loadu_ps(kj + c), acc);
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
        acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * d + c), acc);
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

std::atomic<bool> force_portable{false};

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !force_portable.load(std::memory_order_relaxed);
}
#else
std::atomic<bool> force_portable{false};
bool HasAvx2() { return false; }
#endif

}  // namespace

const char* CpuKernelIsa() { return HasAvx2() ? "avx2" : "portable"; }

void ForcePortableKernels(bool portable) { force_portable.store(portable); }

int64_t PackedSize(int64_t n, int64_t k) { return RoundUp8(n) * RoundUp8(k); }

void PackBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) { Pack(w, n, k, packed); }
void PackInt8(const int8_t* w, int64_t n, int64_t k, int8_t* packed) { Pack(w, n, k, packed); }

void MatmulBf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  if (HasAvx2()) return Avx2Matmul(x, m, k, w, nullptr, n, y, n_begin, n_end);
#endif
  PortableMatmul(x, m, k, w, nullptr, n, y, n_begin, n_end);
}

void MatmulInt8(const float* x, int64_t m, int64_t k, const int8_t* w, const float* scales,
                int64_t n, float* y, int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  if (HasAvx2()) return Avx2Matmul(x, m, k, w, scales, n, y, n_begin, n_end);
#endif
  PortableMatmul(x, m, k, w, scales, n, y, n_begin, n_end);
}

void DecodeAttention(const float* q, int groups, const float* k, const float* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch) {
#ifdef SLUICE_X86
  if (HasAvx2() && d % 8 == 0) {
    return Avx2DecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
  }
#endif
  PortableDecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
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
