// What the kernel files under llm/kernels/ share, and nothing outside them includes: the packed
// layouts' arithmetic, the target attributes of each instruction set, a few AVX-512 helpers, and
// each instruction set's entry points, which dispatch.cc calls for the path in use.
//
// One file per instruction set and concern: portable.cc (plain C++, every CPU), avx2.cc (AVX2 +
// FMA), avx512.cc (AVX-512 with BF16), amx.cc (AMX tiles), quant_*.cc (GGUF block formats), and
// dispatch.cc (CPU detection, the SLUICE_CPU_KERNELS cap, and llm/kernels/kernels.h's functions). A
// function compiled for an instruction set carries its target attribute on its declaration here
// and its definition there, so the rest of the build keeps the baseline flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_X86 1
#define SLUICE_AVX2 __attribute__((target("avx2,fma")))
#define SLUICE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// The AVX-512 of every AVX-512 CPU (Skylake-SP and later, Zen 4 and later), without BF16: the
// attention kernels (they widen bf16 by shifts) run on it wherever the CPU has it (Ice Lake and
// Cascade Lake Xeons have no AVX-512 BF16), beside the AVX2 path's products.
#define SLUICE_AVX512_BASE __attribute__((target("avx512f,avx512bw,avx512vl")))
#define SLUICE_AMX                                                              \
  __attribute__((                                                               \
      target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16,amx-int8," \
             "prfchw")))
#endif

namespace sluice::llm {
// Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ2_XS and MXFP4: their rows to fp32 from ggml's layouts,
// written apart from the products' unpacking (quant_lowbit.cc), which the tests check the products
// against.
bool IsLowBitType(uint32_t ggml_type);
void DequantizeLowBitRow(uint32_t ggml_type, const uint8_t* row, int64_t k, float* out);
}  // namespace sluice::llm

namespace sluice::llm::kernels {

inline int64_t RoundUp8(int64_t v) { return (v + 7) & ~int64_t{7}; }
inline int64_t RoundUp16(int64_t v) { return (v + 15) & ~int64_t{15}; }
inline int64_t RoundUp32(int64_t v) { return (v + 31) & ~int64_t{31}; }
inline int64_t RoundUp64(int64_t v) { return (v + 63) & ~int64_t{63}; }

// The AMX layouts: one tile register's load (1 KiB) each, 16 rows of 64 bytes: bf16 tiles of 16
// rows x 32 columns, int8 tiles of 16 rows x 64 columns. Tile (t, u) -- rows [16 t, 16 t + 16),
// columns [c u, c u + c) for c columns a tile -- at (t * k_tiles + u) * 16 c, its rows one after
// the other. A layer's tiles for a range of rows form one sequential stream.
constexpr int64_t kTileElements = 16 * 32;      // bf16.
constexpr int64_t kInt8TileElements = 16 * 64;  // int8.
inline int64_t TileOffset(int64_t t, int64_t u, int64_t k_tiles, int64_t elements = kTileElements) {
  return (t * k_tiles + u) * elements;
}

// The other paths' layout: offset of row j's weights for columns [c, c + 8), c a multiple of 8.
inline int64_t PackedOffset(int64_t j, int64_t c, int64_t k_padded) {
  return (j / 8) * 8 * k_padded + c * 8 + (j % 8) * 8;
}

// The path in use: the best the CPU has, within the limit (dispatch.cc).
KernelIsa Active();

namespace portable {
// T: uint16_t (bf16 bits) or int8_t; scales null for bf16.
template <class T>
void Matmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales, int64_t n,
            float* y, int64_t n_begin, int64_t n_end);
// T: float or uint16_t (bf16 bits). sinks: as kernels.h's DecodeAttention.
template <class T>
void DecodeAttention(const float* q, int groups, const T* k, const T* v, int64_t len, int64_t d,
                     float scale, float* out, float* scratch, const float* sinks = nullptr);
// Softmax of each of `groups` rows of `len` scores, in place; with sinks, row g's denominator
// has e^(sinks[g]) too.
void SoftmaxRows(float* scores, int groups, int64_t len, const float* sinks = nullptr);
void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out);
void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
}  // namespace portable

// GGUF's block formats, 32 weights at a time (quant.cc).
namespace quant {
// 32 weights of a block as signed bytes q with w = scale[h] * q + bias (+ bias2 in the second
// half), h the half (16 weights) a weight lies in: scale[0] == scale[1] except in Q6_K, Q3_K and
// Q2_K (a scale per 16), bias2 0 except in Q2_K (a min per 16).
struct Chunk {
  int8_t q[32];
  float scale[2];
  float bias;
  float bias2 = 0;
};
// The fp16 bits at p (a block's scale).
inline uint16_t Half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bits;
}
// MXFP4's 16 codes (E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), doubled, as ggml keeps
// them; E8m0Half is half the block's scale, so that w = E8m0Half(e) level.
inline constexpr int8_t kMxfp4Levels[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) from an E8M0 byte, as ggml's ggml_e8m0_to_fp32_half: the float's exponent field e -
// 1, or for e < 2 the subnormal 2^-128 or 2^-127.
inline float E8m0Half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
// IQ2_XS's eight sign bits of a grid entry from the 7 its word holds: the eighth makes the count of
// set bits even (ggml's ksigns_iq2xs).
constexpr int Iq2Signs(int seven) { return seven | ((__builtin_popcount(seven) & 1) << 7); }
// IQ2_XS: the 8 weights of one 16-bit word (grid index and signs) as signed bytes, and a run's two
// half scales from its block's d and scale byte (quant.cc; the file's and the repacked layouts').
void UnpackIq2XsWord(uint16_t word, int8_t* q);
void Iq2XsHalfScales(uint16_t d, uint8_t scales, float* out);
// IQ4's 16 levels (quant_lowbit.cc has its own copy: the tests check one against the other).
inline constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
// Q4_K and Q5_K's run j scale and min, 6 bits each, packed in 12 bytes.
inline void ScaleMin(const uint8_t* scales, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}
// Chunk c (32-weight run) of the block at `block` of a quantised type.
void UnpackChunk(uint32_t type, const uint8_t* block, int c, Chunk* out);
// Weights a block of the type, and its bytes.
int64_t BlockElements(uint32_t type);
int64_t BlockBytes(uint32_t type);
void PortableMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n, float* y,
                    int64_t n_begin, int64_t n_end);
// Bytes before the weights in a record of weights RepackQuant laid out: the eight rows' fp16
// scales (MXFP4: its eight E8M0 bytes), and Q4_1's and Q5_1's eight offsets after them; for the
// K-quants and IQ4_XS (a record a super-block), the rows' d (and dmin) and their runs' scales (and
// mins), as quant.cc lays them out.
constexpr int RepackedHeader(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return 32;
    case GgmlType::kMXFP4:
      return 8;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return 128;
    case GgmlType::kQ6_K:
      return 144;
    case GgmlType::kIQ4_XS:
      return 64;
    case GgmlType::kIQ3_S:
      return 48;
    case GgmlType::kIQ2_XS:
      return 80;
    case GgmlType::kQ3_K:
      return 112;
    case GgmlType::kQ2_K:
      return 160;
    default:
      return 16;
  }
}
// Bytes of one run of 32 columns of eight rows in a K-quant record (after its header): the
// nibbles (16 a row), then Q5_K's fifth bits (4 a row) or Q6_K's high pairs of bits (8 a row);
// Q2_K's bit pairs (8 a row), then Q3_K's third bits (4 a row); IQ3_S's grid indices' low bytes
// (byte 8 s + r: row r's step s), ninth bits (byte 64 + r, bit s: row r's step s) and signs (byte
// 72 + 8 t + r: row r's sign byte t, bit b the sign of weight 8 t + b); IQ2_XS's words (8 a row).
constexpr int RepackedRunBytes(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ5_K:
      return 160;
    case GgmlType::kQ6_K:
      return 192;
    case GgmlType::kQ2_K:
      return 64;
    case GgmlType::kQ3_K:
      return 96;
    case GgmlType::kIQ3_S:
      return 104;
    case GgmlType::kIQ2_XS:
      return 64;
    default:
      return 128;
  }
}
// Q2_K's min (dmin x m) of group g (16 weights) of row r in a record RepackQuant laid out: a row
// read back takes its second half's offset from it (Chunk::bias2 holds it less the first's).
float RepackedQ2KMin(const uint8_t* record, int r, int g);
// Row r's run c (32 weights) in a record RepackQuant laid out, as UnpackChunk gives it from the
// file's block (quant_repack.cc).
void UnpackRepacked(uint32_t type, const uint8_t* record, int r, int c, Chunk* out);
// As PortableMatmul, over weights that RepackQuant laid out.
void PortableRepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n, float* y,
                            int64_t n_begin, int64_t n_end);
// Rows of x (k a multiple of 32) quantised per 32: q, the blocks' scales and scale * sum(q).
void PortableQuantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                      float* q_sum);
}  // namespace quant

// Rows of x a pass of the block products takes at most on `isa`'s path (quant_x86.inc), and so
// the groups QuantInput lays x out in for them: a pass's sums and accumulators sit in vector
// registers, 2 R of them, which AVX-512's 32 hold for R = 8 and AVX2's 16 for R = 4. A verifying
// step's 5 rows then go in one pass, not 4 and 1 (which read every weight twice).
constexpr int QuantRowsAtOnce(QuantIsa isa) { return isa == QuantIsa::kAvx512Vnni ? 8 : 4; }

#ifdef SLUICE_X86

// The first min(16, max(0, count)) lanes.
inline __mmask16 FirstLanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xffff : count > 0 ? (1u << count) - 1 : 0);
}

// GCC 12 warns that the "undefined" vector inside its own AVX-512 conversion intrinsics may be
// used uninitialized (a false positive of its headers, not of this code).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// e^x for x <= 0 (softmax scores less their maximum), 16 lanes: x = n ln 2 + r with |r| <= ln 2 /
// 2, e^r by its degree-6 Taylor polynomial (relative error below 3e-7 on that range), times 2^n
// built in the exponent bits. Below -87 the result is 0, as expf's would underflow to denormals.
SLUICE_AVX512_BASE inline __m512 Exp16(__m512 x) {
  const __m512 floor_x = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, floor_x, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor_x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln 2, with ln 2 split in two so that n ln 2 is exact enough.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i scale =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), p, _mm512_castsi512_ps(scale));
}

// Lane-wise operations for ReduceLanes16 (AVX-512 F only, so that every AVX-512 path can inline
// them).
#define SLUICE_AVX512F __attribute__((target("avx512f")))
struct AddLanes {
  SLUICE_AVX512F __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};
struct MaxLanes {
  SLUICE_AVX512F __m512 operator()(__m512 a, __m512 b) const { return _mm512_max_ps(a, b); }
};
struct AddIntLanes {  // The vectors hold int32 lanes.
  SLUICE_AVX512F __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

// Lane i of the result: op over the 16 lanes of a[i], in one fixed order. Pairs interleaved and
// combined, then pairs of pairs, then the 128-bit lanes exchanged and combined: 46 instructions
// where sixteen horizontal reductions take about 150.
template <class Op>
SLUICE_AVX512F inline __m512 ReduceLanes16(const __m512 (&a)[16], Op op) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {
    pairs[i] =
        op(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] =
        op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // quads[m], 128-bit lane L: op over lane L of a[4 m] .. a[4 m + 3].
  const __m512 low = op(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                        _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 high = op(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                         _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return op(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

// 16 values widened to fp32.
SLUICE_AVX512_BASE inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
SLUICE_AVX512_BASE inline __m512 Load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
SLUICE_AVX512_BASE inline __m512 Load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace avx2 {
template <class T>
SLUICE_AVX2 void Matmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales,
                        int64_t n, float* y, int64_t n_begin, int64_t n_end);
template <class T>
SLUICE_AVX2 void DecodeAttention(const float* q, int groups, const T* k, const T* v, int64_t len,
                                 int64_t d, float scale, float* out, float* scratch,
                                 const float* sinks = nullptr);
// As portable's, eight lanes at a time (e^x by a polynomial, as avx512's).
SLUICE_AVX2 void SoftmaxRows(float* scores, int groups, int64_t len, const float* sinks = nullptr);
SLUICE_AVX2 void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight,
                         float eps, float* out);
SLUICE_AVX2 void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
SLUICE_AVX2 void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
}  // namespace avx2

namespace avx512 {
template <class T>
SLUICE_AVX512 void Matmul(const MatmulInput& x, const T* w, const float* scales, int64_t n,
                          float* y, int64_t n_begin, int64_t n_end);
// x rounded to bf16, rows of `stride` values (zeros past k).
SLUICE_AVX512 void RoundRows(const float* x, int64_t m, int64_t k, int64_t stride, uint16_t* out);
template <class T>
SLUICE_AVX512_BASE void DecodeAttention(const float* q, int groups, const T* k, const T* v,
                                        int64_t len, int64_t d, float scale, float* out,
                                        float* scratch, const float* sinks = nullptr);
// T int8_t: a q8_0 cache, each 32 values of k (v) times their scale in k_scales (v_scales),
// indexed by the element's offset / 32.
template <class T>
SLUICE_AVX512_BASE void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups,
                                            const T* k, const T* v, int64_t len, int64_t d,
                                            float scale, float* out, int64_t out_stride,
                                            float* scratch, const float* k_scales = nullptr,
                                            const float* v_scales = nullptr,
                                            const float* sinks = nullptr);
// softmax of the scores in `scratch` (with sinks: portable's SoftmaxRows'), then out[g] =
// sum_j p[g, j] v[j].
template <class T>
SLUICE_AVX512_BASE void SoftmaxPv(int groups, const T* v, int64_t len, int64_t d, float* out,
                                  float* scratch, const float* v_scales = nullptr,
                                  const float* sinks = nullptr);
SLUICE_AVX512 int64_t ArgMax(const float* x, int64_t n);
SLUICE_AVX512 void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight,
                           float eps, float* out);
SLUICE_AVX512 void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
}  // namespace avx512

// LDTILECFG's 64 bytes (palette 1): each tile register's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// LDTILECFG from `config`. Not GCC 12's _tile_loadconfig: its asm names only the first 8 bytes as
// read, so the optimiser drops the stores that fill the rows and widths, the tiles stay
// unconfigured and the first tile load faults (SIGILL); this asm reads all 64 bytes.
inline void LoadTileConfig(const TileConfig& config) {
  asm volatile("ldtilecfg %0" : : "m"(config));
}

namespace amx {
// Whether the CPU has AMX and Linux granted this process its tile state.
bool Usable();
template <bool kInt8>
SLUICE_AMX void Matmul(const MatmulInput& x, const void* weights, const float* scales, int64_t n,
                       float* y, int64_t n_begin, int64_t n_end);
// d a multiple of 32 up to 128, up to 16 groups.
SLUICE_AMX void DecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v,
                                int64_t len, int64_t d, float scale, float* out, float* scratch);
// Up to 4 groups, d 32 or 64: the softmax and p . v folded into the pass over the keys.
SLUICE_AMX void FusedDecodeAttention(const float* q, int groups, const uint16_t* k,
                                     const uint16_t* v, int64_t len, int64_t d, float scale,
                                     float* out);
SLUICE_AVX512 void PairRows(const float* x, int64_t m, int64_t k, ScratchVector<uint32_t>* pairs,
                            int64_t unit_begin, int64_t unit_end);
SLUICE_AVX512 void QuadRows(const float* x, int64_t m, int64_t k, MatmulInput* in);
}  // namespace amx

#define SLUICE_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define SLUICE_AVX512VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
// The block products on AVX2 need F16C too (the blocks' fp16 scales, eight at a time).
#define SLUICE_QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))
namespace quant_avx2 {
SLUICE_QUANT_AVX2 void Matmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                              float* y, int64_t n_begin, int64_t n_end);
SLUICE_QUANT_AVX2 void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                      float* y, int64_t n_begin, int64_t n_end);
// As quant::PortableQuantize, eight lanes at a time, with the same results.
SLUICE_AVX2 void Quantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                          float* q_sum);
}  // namespace quant_avx2
namespace quant_avxvnni {
SLUICE_AVXVNNI void Matmul(const QuantInput& x, uint32_t type, const void* w, int64_t n, float* y,
                           int64_t n_begin, int64_t n_end);
SLUICE_AVXVNNI void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                   float* y, int64_t n_begin, int64_t n_end);
}  // namespace quant_avxvnni
namespace quant_avx512vnni {
SLUICE_AVX512VNNI void Matmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                              float* y, int64_t n_begin, int64_t n_end);
SLUICE_AVX512VNNI void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                      float* y, int64_t n_begin, int64_t n_end);
// As quant::PortableQuantize, sixteen blocks at a time, with the same results.
SLUICE_AVX512VNNI void Quantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                                float* q_sum);
// Rows [row_begin, row_end) of x per 256 columns into QuantInput's tile_q, tile_scale and
// tile_offset (their layout there).
SLUICE_AVX512VNNI void QuantizeTileRows(QuantInput* x, int64_t row_begin, int64_t row_end);
}  // namespace quant_avx512vnni
// IQ2_XS's and IQ3_S's repacked products with AVX-512 VBMI's permutes (quant_avx512vbmi.cc): their
// grids read in registers. MatmulQuantRepacked sends it no other type (one would take the portable
// loop).
#define SLUICE_AVX512VBMI \
  __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
namespace quant_avx512vbmi {
SLUICE_AVX512VBMI void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                      float* y, int64_t n_begin, int64_t n_end);
}  // namespace quant_avx512vbmi
// AMX's int8 tiles for repacked Q8_0 and Q4_0 weights (quant_amx.cc), with the AVX-512 VNNI path's
// results to the bit; and the same code over tiles emulated in C++ (AVX2), for tests.
#define SLUICE_QUANT_AMX                                                           \
  __attribute__((                                                                  \
      target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,amx-tile,amx-int8,amx-bf16," \
             "avx512bf16")))
namespace quant_amx {
// Whether the CPU has AMX's int8 tiles and Linux granted this process their state.
bool Usable();
// Types whose repacked products go through the tiles.
constexpr bool Handles(uint32_t type) {
  return type == static_cast<uint32_t>(GgmlType::kQ8_0) ||
         type == static_cast<uint32_t>(GgmlType::kQ4_0);
}
SLUICE_QUANT_AMX void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                     float* y, int64_t n_begin, int64_t n_end);
}  // namespace quant_amx
namespace quant_amx_emulated {
SLUICE_QUANT_AVX2 void RepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n,
                                      float* y, int64_t n_begin, int64_t n_end);
}  // namespace quant_amx_emulated

#endif  // SLUICE_X86

}  // namespace sluice::llm::kernels
