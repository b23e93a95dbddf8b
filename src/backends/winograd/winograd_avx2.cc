// Conv3x3's kernels with AVX2 and FMA (this file is compiled with -mavx2 -mfma; the caller checks
// the CPU first).
#define SLUICE_WINOGRAD_NS avx2
#include "backends/winograd/winograd_kernels.inc"
