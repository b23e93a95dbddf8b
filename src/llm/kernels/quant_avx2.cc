// GGUF block-format products on AVX2: VPMADDUBSW sums byte pairs into int16, a few steps of them
// added in int16 where they cannot overflow (quant_x86.inc), VPMADDWD pairs of those into int32.
// And x's quantisation, eight lanes at a time.
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avx2
#define SLUICE_QUANT_ISA QuantIsa::kAvx2
#define SLUICE_QUANT_TARGET SLUICE_QUANT_AVX2
#include "llm/kernels/quant_x86.inc"
#endif

#ifdef SLUICE_X86
namespace sluice::llm::kernels::quant_avx2 {

// Per block: the largest magnitude from four vectors, the same scale and reciprocal as the
// portable loop, products rounded to nearest even (VROUNDPS), packed to bytes (the packs work
// within 128-bit lanes, so the dwords are put back in order after), and the sum of the ints.
SLUICE_AVX2 void Quantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                          float* q_sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < rows * (k / 32); ++b) {
    const float* from = x + b * 32;
    __m256 v[4], magnitude[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(from + 8 * i);
      magnitude[i] = _mm256_andnot_ps(sign, v[i]);
    }
    const __m256 largest = _mm256_max_ps(_mm256_max_ps(magnitude[0], magnitude[1]),
                                         _mm256_max_ps(magnitude[2], magnitude[3]));
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    half = _mm_max_ss(half, _mm_movehdup_ps(half));
    const float amax = _mm_cvtss_f32(half);
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    const __m256 multiplier = _mm256_set1_ps(inverse);
    __m256i ints[4];
    for (int i = 0; i < 4; ++i) {
      ints[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], multiplier),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i total =
        _mm256_add_epi32(_mm256_add_epi32(ints[0], ints[1]), _mm256_add_epi32(ints[2], ints[3]));
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]),
                                             _mm256_packs_epi32(ints[2], ints[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32),
                        _mm256_permutevar8x32_epi32(bytes, order));
    scale[b] = d;
    q_sum[b] = d * static_cast<float>(_mm_cvtsi128_si32(sum));
  }
}

}  // namespace sluice::llm::kernels::quant_avx2
#endif
