// Register-blocked dot products: a block of MB rows of x against NB rows of W keeps MB x NB
// eight-lane fp32 accumulators (MB x NB = 8, so eight independent FMA chains hide the FMA latency)
// and walks k eight values at a time; each weight vector is widened to fp32 once and used by
// all MB rows. Output blocks go outermost, so one block of weight rows stays in L1 while every row
// of x passes over it. The AVX2 + FMA path is chosen at run time; other CPUs take a portable loop.
#include "llm/cpu_kernels.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_X86 1
#endif

namespace sluice::llm {
namespace {

// Widening loads of eight weights, and the scalar widening of one for the k tail.
struct Bf16Weights {
  using Type = uint16_t;
  static float One(uint16_t w) { return Bf16ToFp32(w); }
};
struct Int8Weights {
  using Type = int8_t;
  static float One(int8_t w) { return static_cast<float>(w); }
};

// y[i, j] = scale(j) * sum_k x[i, k] w[j, k] for j in [n_begin, n_end), scalar.
template <class W>
void PortableMatmul(const float* x, int64_t m, int64_t k, const typename W::Type* w,
                    const float* scales, int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  for (int64_t j = n_begin; j < n_end; ++j) {
    const typename W::Type* row = w + j * k;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      float sum = 0;
      for (int64_t c = 0; c < k; ++c) sum += xi[c] * W::One(row[c]);
      y[i * n + j] = scales != nullptr ? sum * scales[j] : sum;
    }
  }
}

#ifdef SLUICE_X86
#define SLUICE_AVX2 __attribute__((target("avx2,fma")))

SLUICE_AVX2 inline __m256 Widen(const uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
SLUICE_AVX2 inline __m256 Widen(const int8_t* w) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
SLUICE_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// How far ahead of the current weights each row is prefetched: the hardware prefetcher does not
// follow NB interleaved row streams well enough to keep up with memory.
constexpr int64_t kAhead = 1024;

// Rows [i0, i0 + MB) of x against weight rows [j0, j0 + NB).
template <int MB, int NB, class W>
SLUICE_AVX2 void Block(const float* x, int64_t k, const typename W::Type* w, const float* scales,
                       int64_t n, float* y, int64_t i0, int64_t j0) {
  // The accumulators must live in registers: the loops over the block are unrolled by hand
  // (pragmas), as GCC at -O2 otherwise keeps the array in memory and every FMA waits on a store.
  __m256 acc[MB][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const float* xr[MB];
  const typename W::Type* wr[NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) xr[i] = x + (i0 + i) * k;
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) wr[j] = w + (j0 + j) * k;
  const int64_t k8 = k & ~int64_t{7};
  constexpr int64_t kLine = 64 / sizeof(typename W::Type);  // Weights per cache line.
  for (int64_t c = 0; c < k8; c += 8) {
    if (c % kLine == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(wr[j] + c) + kAhead, _MM_HINT_T0);
    }
    __m256 xv[MB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) xv[i] = _mm256_loadu_ps(xr[i] + c);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m256 wv = Widen(wr[j] + c);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float sum = HorizontalSum(acc[i][j]);
      for (int64_t c = k8; c < k; ++c) sum += xr[i][c] * W::One(wr[j][c]);
      y[(i0 + i) * n + j0 + j] = scales != nullptr ? sum * scales[j0 + j] : sum;
    }
  }
}

// Columns [j_begin, j_end) (a multiple of NB wide) for every row of x. The columns go in
// chunks of about 64 KiB of weights, which stay in L2 while each block of MB rows of x, held in
// L1, passes over them: x is read from L1 and each weight from memory once.
template <int MB, int NB, class W>
SLUICE_AVX2 void Columns(const float* x, int64_t m, int64_t k, const typename W::Type* w,
                         const float* scales, int64_t n, float* y, int64_t j_begin, int64_t j_end) {
  const int64_t row_bytes = k * static_cast<int64_t>(sizeof(typename W::Type));
  const int64_t chunk = std::max<int64_t>(1, (64 << 10) / (row_bytes * NB)) * NB;
  for (int64_t c0 = j_begin; c0 < j_end; c0 += chunk) {
    const int64_t c1 = std::min(j_end, c0 + chunk);
    int64_t i = 0;
    for (; i + MB <= m; i += MB) {
      for (int64_t j = c0; j < c1; j += NB) Block<MB, NB, W>(x, k, w, scales, n, y, i, j);
    }
    if constexpr (MB > 1) {
      for (; i < m; ++i) {
        for (int64_t j = c0; j < c1; j += NB) Block<1, NB, W>(x, k, w, scales, n, y, i, j);
      }
    }
  }
}

template <class W>
SLUICE_AVX2 void Avx2Matmul(const float* x, int64_t m, int64_t k, const typename W::Type* w,
                            const float* scales, int64_t n, float* y, int64_t n_begin,
                            int64_t n_end) {
  const int nb = m == 1 ? 8 : m < 4 ? 4 : 2;
  const int64_t blocked = n_begin + (n_end - n_begin) / nb * nb;
  if (nb == 8) {
    Columns<1, 8, W>(x, m, k, w, scales, n, y, n_begin, blocked);
  } else if (nb == 4) {
    Columns<2, 4, W>(x, m, k, w, scales, n, y, n_begin, blocked);
  } else {
    Columns<4, 2, W>(x, m, k, w, scales, n, y, n_begin, blocked);
  }
  Columns<4, 1, W>(x, m, k, w, scales, n, y, blocked, n_end);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
bool HasAvx2() { return false; }
#endif

}  // namespace

const char* CpuKernelIsa() { return HasAvx2() ? "avx2" : "portable"; }

void MatmulBf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  if (HasAvx2()) return Avx2Matmul<Bf16Weights>(x, m, k, w, nullptr, n, y, n_begin, n_end);
#endif
  PortableMatmul<Bf16Weights>(x, m, k, w, nullptr, n, y, n_begin, n_end);
}

void MatmulInt8(const float* x, int64_t m, int64_t k, const int8_t* w, const float* scales,
                int64_t n, float* y, int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  if (HasAvx2()) return Avx2Matmul<Int8Weights>(x, m, k, w, scales, n, y, n_begin, n_end);
#endif
  PortableMatmul<Int8Weights>(x, m, k, w, scales, n, y, n_begin, n_end);
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
