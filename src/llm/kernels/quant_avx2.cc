// GGUF block-format products on AVX2: VPMADDUBSW sums byte pairs into int16 (no overflow: |w| <=
// 128 and |x| <= 127), VPMADDWD pairs of those into int32.
#include "llm/files/gguf.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avx2
#define SLUICE_QUANT_TARGET SLUICE_AVX2
#define SLUICE_QUANT_DOT(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#include "llm/kernels/quant_x86.inc"
#endif
