// Conv3x3's kernels for CPUs without AVX2 and FMA: the same source, the compiler's baseline ISA.
#define SLUICE_WINOGRAD_NS generic
#include "backends/winograd/winograd_kernels.inc"
