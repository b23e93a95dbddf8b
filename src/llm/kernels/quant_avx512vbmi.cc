// IQ2_XS's and IQ3_S's repacked products on AVX-512 VNNI with VBMI (Ice Lake and later, AMD Zen 4
// and later): quant_x86.inc's repacked products with the grids read by byte and word permutes in
// registers (quant_x86_repacked_iq2xs.inc's Iq2XsRun, quant_x86_repacked_iq3s.inc's
// RepackedSteps), the same integer sums and fp32 steps: the same bits.
// Apart from quant_avx512vnni.cc because AVX-512 VNNI CPUs without VBMI (Cascade Lake) exist.
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"

#ifdef SLUICE_X86
#define SLUICE_QUANT_NAMESPACE quant_avx512vbmi
#define SLUICE_QUANT_TARGET SLUICE_AVX512VBMI
#define SLUICE_QUANT_DPBUSD(a, u, s) _mm256_dpbusd_epi32(a, u, s)
#define SLUICE_QUANT_ISA QuantIsa::kAvx512Vnni
#define SLUICE_QUANT_WIDE 1
#define SLUICE_QUANT_VBMI 1
// GCC 12's AVX-512 intrinsics warn of their own "undefined" vectors (see internal.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "llm/kernels/quant_x86.inc"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
