// GGUF block-format products on AVX-VNNI (VEX-encoded VPDPBUSD, on CPUs with it and without
// AVX-512).
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avxvnni
#define SLUICE_QUANT_ISA QuantIsa::kAvxVnni
#define SLUICE_QUANT_TARGET SLUICE_AVXVNNI
#define SLUICE_QUANT_DPBUSD(a, u, s) _mm256_dpbusd_avx_epi32(a, u, s)
#include "llm/kernels/quant_x86.inc"
#endif
