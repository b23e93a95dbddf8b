// GGUF block-format products on AVX-512 VNNI: VPDPBUSD on 256-bit vectors (AVX-512 VL), four byte
// products summed into each int32 lane by one instruction.
#include "llm/files/gguf.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avx512vnni
#define SLUICE_QUANT_TARGET SLUICE_AVX512VNNI
#define SLUICE_QUANT_DPBUSD(a, u, s) _mm256_dpbusd_epi32(a, u, s)
#define SLUICE_QUANT_ROWS 8
#include "llm/kernels/quant_x86.inc"
#endif
