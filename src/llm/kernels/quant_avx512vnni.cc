// GGUF block-format products on AVX-512 VNNI: VPDPBUSD on 256-bit vectors (AVX-512 VL), four byte
// products summed into each int32 lane by one instruction, and on 512-bit vectors over sixteen
// repacked rows at once (quant_x86_repacked.inc's RepackedRowsWide).
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avx512vnni
#define SLUICE_QUANT_TARGET SLUICE_AVX512VNNI
#define SLUICE_QUANT_DPBUSD(a, u, s) _mm256_dpbusd_epi32(a, u, s)
#define SLUICE_QUANT_ISA QuantIsa::kAvx512Vnni
#define SLUICE_QUANT_WIDE 1  // 512-bit products over sixteen repacked rows at once as well.
#include "llm/kernels/quant_x86.inc"
#endif

#ifdef SLUICE_X86
namespace sluice::llm::kernels::quant_avx512vnni {

// GCC 12's AVX-512 intrinsics warn of their own "undefined" vectors (see internal.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Sixteen blocks at a time: each block's largest magnitude is one vector (its two halves' lanes),
// and ReduceLanes16 gives the sixteen blocks' maxima as one vector, so the scales and their
// reciprocals are one division each; the products are rounded to nearest even and narrowed with
// signed saturation (VPMOVSDB, as the AVX2 path's packs), and the integer sums reduced as the
// maxima were. A last group of fewer than sixteen blocks goes through a zero-padded copy.
SLUICE_AVX512VNNI void Quantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                                float* q_sum) {
  const int64_t blocks = rows * (k / 32);
  alignas(64) float padded[16 * 32];
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    const float* from = x + b0 * 32;
    if (count < 16) {
      std::fill(std::copy(from, from + count * 32, padded), padded + 16 * 32, 0.0f);
      from = padded;
    }
    __m512 largest[16];
    for (int b = 0; b < 16; ++b) {
      largest[b] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(from + 32 * b)),
                                 _mm512_abs_ps(_mm512_loadu_ps(from + 32 * b + 16)));
    }
    const __m512 d = _mm512_div_ps(ReduceLanes16(largest, MaxLanes{}), _mm512_set1_ps(127.0f));
    const __mmask16 nonzero = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    alignas(64) float inverse[16];
    _mm512_store_ps(inverse, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0f), d));
    __m512 totals[16];
    for (int b = 0; b < 16; ++b) {
      const __m512 multiplier = _mm512_set1_ps(inverse[b]);
      __m512i ints[2];
      for (int h = 0; h < 2; ++h) {
        ints[h] = _mm512_cvt_roundps_epi32(
            _mm512_mul_ps(_mm512_loadu_ps(from + 32 * b + 16 * h), multiplier),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (b < count) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q + (b0 + b) * 32 + 16 * h),
                           _mm512_cvtsepi32_epi8(ints[h]));
        }
      }
      totals[b] = _mm512_castsi512_ps(_mm512_add_epi32(ints[0], ints[1]));
    }
    const __m512 total = ReduceLanes16(totals, AddIntLanes{});
    const __mmask16 lanes = FirstLanes(count);
    _mm512_mask_storeu_ps(scale + b0, lanes, d);
    _mm512_mask_storeu_ps(q_sum + b0, lanes,
                          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_castps_si512(total))));
  }
}

// Each row's blocks of 256: the largest magnitude over sixteen vectors, d = it / 127, the
// products rounded to nearest even and narrowed with signed saturation as Quantize's are, then
// each step of four bytes put where the group's layout has it.
SLUICE_AVX512VNNI void QuantizeTileRows(QuantInput* x, int64_t row_begin, int64_t row_end) {
  const int64_t k = x->k, blocks = k / 256, full = x->m / kTileGroupRows * kTileGroupRows;
  alignas(64) int8_t q[256];
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t first = r < full ? r / kTileGroupRows * kTileGroupRows : full;
    const int64_t rows = r < full ? kTileGroupRows : x->m - full, i = r - first;
    int8_t* to = x->tile_q.data() + first * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* from = x->x + r * k + 256 * b;
      __m512 largest = _mm512_setzero_ps();
      for (int v = 0; v < 16; ++v) {
        largest = _mm512_max_ps(largest, _mm512_abs_ps(_mm512_loadu_ps(from + 16 * v)));
      }
      const float d = _mm512_reduce_max_ps(largest) / 127.0f;
      const __m512 multiplier = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      __m512i total = _mm512_setzero_si512();
      for (int v = 0; v < 16; ++v) {
        const __m512i ints =
            _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(from + 16 * v), multiplier),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_store_si128(reinterpret_cast<__m128i*>(q + 16 * v), _mm512_cvtsepi32_epi8(ints));
        total = _mm512_add_epi32(total, ints);
      }
      int8_t* block = to + 256 * rows * b;
      for (int64_t s = 0; s < 64; ++s) std::memcpy(block + 4 * (rows * s + i), q + 4 * s, 4);
      const int64_t at = first * blocks + rows * b + i;
      x->tile_scale[static_cast<size_t>(at)] = d;
      x->tile_offset[static_cast<size_t>(at)] = -128 * _mm512_reduce_add_epi32(total);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sluice::llm::kernels::quant_avx512vnni
#endif
