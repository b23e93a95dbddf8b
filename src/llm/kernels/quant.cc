// GGUF's block formats: their layouts (as llama.cpp's ggml-common.h defines them), the portable
// unpacking and products, x's quantisation, and the choice of path. The vector paths are in
// quant_avx2.cc, quant_avxvnni.cc and quant_avx512vnni.cc; the repacked records (eight rows'
// blocks interleaved at load) in quant_repack.cc.
//
// Layouts, each block little-endian, fp16 scales:
//   Q4_0  32 weights, 18 bytes: d; 16 bytes, weight l in byte l's low nibble, l + 16 in its high
//         nibble; w = d (q - 8).
//   Q4_1  32 weights, 20 bytes: d, m; nibbles as Q4_0; w = d q + m.
//   Q5_0  32 weights, 22 bytes: d; 32 fifth bits (bit l for weight l); nibbles as Q4_0;
//         w = d (q - 16).
//   Q5_1  32 weights, 24 bytes: d, m; fifth bits and nibbles as Q5_0; w = d q + m.
//   Q8_0  32 weights, 34 bytes: d; 32 signed bytes; w = d q.
//   Q4_K  256 weights, 144 bytes: d, dmin; 12 bytes of eight 6-bit scales and mins; 128 bytes of
//         nibbles, each 64 weights' 32 bytes holding the first 32 in low nibbles and the next 32
//         in high ones; w = d sc q - dmin m for the 32-weight run's (sc, m).
//   Q5_K  256 weights, 176 bytes: as Q4_K with 32 bytes of fifth bits (run c: bit c of byte l for
//         its weight l) between the scales and the nibbles.
//   Q6_K  256 weights, 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed
//         8-bit scales (one per 16 weights), d; w = d sc (q - 32).
//   Q2_K  256 weights, 84 bytes: 16 bytes of a 4-bit scale (low nibble) and min (high) per 16
//         weights; 64 bytes of 2-bit values, run c (32 weights) in bit pair c % 4 of the 32 bytes
//         at 16 + 32 (c / 4); d, dmin; w = d sc q - dmin m.
//   Q3_K  256 weights, 110 bytes: 32 bytes of third bits (run c: bit c of byte l for its weight
//         l), 64 bytes of low bit pairs as Q2_K's, 12 bytes of 6-bit scales (one per 16; low
//         nibbles in bytes 0-7, high pairs in bytes 8-11), d; w = d (sc - 32) (q - 4 (1 - h)).
//   IQ4_NL 32 weights, 18 bytes: d; nibbles as Q4_0's, each an index into 16 levels;
//         w = d level[q].
//   IQ4_XS 256 weights, 136 bytes: d; the runs' 6-bit scales' high bit pairs (2 bytes) and low
//         nibbles (4 bytes); run c's 16 bytes of nibbles as IQ4_NL's; w = d (sc - 32) level[q].
//   IQ3_S  256 weights, 110 bytes: d; 64 bytes of grid indices' low 8 bits (run c: 8 c .. 8 c + 7,
//         one a 4 weights); 8 bytes of their ninth bits (run c's in byte 66 + c, bit i for its
//         index i); 32 bytes of signs (run c's at 74 + 4 c, bit l of those 4 bytes for weight
//         l); 4 bytes of 4-bit run scales (run c: byte 106 + c / 2, nibble c % 2);
//         w = d (1 + 2 sc) grid[index][l % 4] (-1 where the sign bit is set), the grid ggml's
//         512 entries of four magnitudes 1, 3, ..., 15 (kIq3sGrid, from the gguf package).
//   MXFP4  32 weights, 17 bytes: e (E8M0: 2^(e - 127)); nibbles as Q4_0's, each an FP4 (E2M1)
//         code: w = 2^(e - 128) level[q] with the codes' values doubled, 0, 1, 2, 3, 4, 6, 8, 12
//         and their negatives (kMxfp4Levels; E8m0Half).
//   IQ2_XS 256 weights, 74 bytes: d; 32 16-bit words, one a 8 weights (run c's at 2 + 8 c): the low
//         9 bits a grid index, the high 7 the first 7 of its weights' sign bits (the eighth makes
//         their count even: Iq2Signs); 8 bytes of 4-bit scales (run c's byte 66 + c, its first
//         16 weights' in the low nibble); w = d (1 + 2 sc) / 8 grid[index][l % 8] (-1 where the
//         sign bit is set), the grid ggml's 512 entries of eight magnitudes 8, 25, 43
//         (kIq2xsGrid, from the gguf package).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/ggml_grids.h"
#include "llm/kernels/internal.h"

namespace sluice::llm {
namespace kernels::quant {
namespace {

// Q3_K's 6-bit scale of group i (16 weights), minus 32.
int Q3KScale(const uint8_t* packed, int i) {
  const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
  const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace

void UnpackIq2XsWord(uint16_t word, int8_t* q) {
  const uint64_t entry = kIq2xsGrid[word & 511];
  const int signs = Iq2Signs(word >> 9);
  for (int j = 0; j < 8; ++j) {
    const auto magnitude = static_cast<int>((entry >> (8 * j)) & 0xFF);
    q[j] = static_cast<int8_t>((signs >> j) & 1 ? -magnitude : magnitude);
  }
}

void Iq2XsHalfScales(uint16_t d, uint8_t scales, float* out) {
  const float eighth = Fp16ToFp32(d) * 0.125f;  // d (0.5 + s) / 4 = d / 8 (1 + 2 s).
  for (int h = 0; h < 2; ++h)
    out[h] = eighth * static_cast<float>(1 + 2 * ((scales >> (4 * h)) & 0xF));
}

int64_t BlockElements(uint32_t type) {
  int64_t elements = 0, bytes = 0;
  GgmlBlockLayout(type, &elements, &bytes);
  return elements;
}

int64_t BlockBytes(uint32_t type) {
  int64_t elements = 0, bytes = 0;
  GgmlBlockLayout(type, &elements, &bytes);
  return bytes;
}

void UnpackChunk(uint32_t type, const uint8_t* block, int c, Chunk* out) {
  out->bias = 0;
  out->bias2 = 0;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const bool q4_1 = static_cast<GgmlType>(type) == GgmlType::kQ4_1;
      const float d = Fp16ToFp32(Half(block));
      const uint8_t* qs = block + (q4_1 ? 4 : 2);
      const int offset = q4_1 ? 0 : 8;
      for (int l = 0; l < 16; ++l) {
        out->q[l] = static_cast<int8_t>((qs[l] & 0xF) - offset);
        out->q[l + 16] = static_cast<int8_t>((qs[l] >> 4) - offset);
      }
      out->scale[0] = out->scale[1] = d;
      if (q4_1) out->bias = Fp16ToFp32(Half(block + 2));
      return;
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool q5_1 = static_cast<GgmlType>(type) == GgmlType::kQ5_1;
      uint32_t high;
      std::memcpy(&high, block + (q5_1 ? 4 : 2), 4);
      const uint8_t* qs = block + (q5_1 ? 8 : 6);
      const int offset = q5_1 ? 0 : 16;
      for (int l = 0; l < 16; ++l) {
        out->q[l] = static_cast<int8_t>(((qs[l] & 0xF) | (((high >> l) & 1) << 4)) - offset);
        out->q[l + 16] =
            static_cast<int8_t>(((qs[l] >> 4) | (((high >> (l + 16)) & 1) << 4)) - offset);
      }
      out->scale[0] = out->scale[1] = Fp16ToFp32(Half(block));
      if (q5_1) out->bias = Fp16ToFp32(Half(block + 2));
      return;
    }
    case GgmlType::kQ8_0:
      std::memcpy(out->q, block + 2, 32);
      out->scale[0] = out->scale[1] = Fp16ToFp32(Half(block));
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool q5 = static_cast<GgmlType>(type) == GgmlType::kQ5_K;
      const float d = Fp16ToFp32(Half(block)), dmin = Fp16ToFp32(Half(block + 2));
      const uint8_t* scales = block + 4;
      const uint8_t* qh = block + 16;
      const uint8_t* qs = block + (q5 ? 48 : 16) + 32 * (c / 2);
      const int shift = (c % 2) * 4;
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> shift) & 0xF;
        if (q5) q |= ((qh[l] >> c) & 1) << 4;
        out->q[l] = static_cast<int8_t>(q);
      }
      int sc = 0, m = 0;
      ScaleMin(scales, c, &sc, &m);
      out->scale[0] = out->scale[1] = d * static_cast<float>(sc);
      out->bias = -dmin * static_cast<float>(m);
      return;
    }
    case GgmlType::kQ6_K: {
      const int half = c / 4, r = c % 4;
      const uint8_t* ql = block + 64 * half + (r % 2) * 32;
      const uint8_t* qh = block + 128 + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(block + 192) + 8 * half;
      const float d = Fp16ToFp32(Half(block + 208));
      const int low_shift = (r / 2) * 4, high_shift = 2 * r;
      for (int l = 0; l < 32; ++l) {
        const int q = ((ql[l] >> low_shift) & 0xF) | (((qh[l] >> high_shift) & 3) << 4);
        out->q[l] = static_cast<int8_t>(q - 32);
      }
      out->scale[0] = d * static_cast<float>(sc[2 * r]);
      out->scale[1] = d * static_cast<float>(sc[2 * r + 1]);
      return;
    }
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K: {
      const bool q3 = static_cast<GgmlType>(type) == GgmlType::kQ3_K;
      const uint8_t* qs = block + (q3 ? 32 : 16) + 32 * (c / 4);
      const int shift = 2 * (c % 4);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> shift) & 3;
        if (q3) q -= ((block[l] >> c) & 1) != 0 ? 0 : 4;
        out->q[l] = static_cast<int8_t>(q);
      }
      if (q3) {
        const float d = Fp16ToFp32(Half(block + 108));
        for (int h = 0; h < 2; ++h) {
          out->scale[h] = d * static_cast<float>(Q3KScale(block + 96, 2 * c + h));
        }
      } else {
        const float d = Fp16ToFp32(Half(block + 80)), dmin = Fp16ToFp32(Half(block + 82));
        for (int h = 0; h < 2; ++h) out->scale[h] = d * static_cast<float>(block[2 * c + h] & 0xF);
        out->bias = -dmin * static_cast<float>(block[2 * c] >> 4);
        out->bias2 = -dmin * static_cast<float>(block[2 * c + 1] >> 4) - out->bias;
      }
      return;
    }
    case GgmlType::kMXFP4: {
      for (int l = 0; l < 16; ++l) {
        out->q[l] = kMxfp4Levels[block[1 + l] & 0xF];
        out->q[l + 16] = kMxfp4Levels[block[1 + l] >> 4];
      }
      out->scale[0] = out->scale[1] = E8m0Half(block[0]);
      return;
    }
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS: {
      const bool xs = static_cast<GgmlType>(type) == GgmlType::kIQ4_XS;
      const uint8_t* qs = block + (xs ? 8 + 16 * c : 2);
      for (int l = 0; l < 16; ++l) {
        out->q[l] = kIq4Levels[qs[l] & 0xF];
        out->q[l + 16] = kIq4Levels[qs[l] >> 4];
      }
      float d = Fp16ToFp32(Half(block));
      if (xs) {
        const uint16_t high = Half(block + 2);
        const int scale =
            (((block[4 + c / 2] >> (4 * (c % 2))) & 0xF) | (((high >> (2 * c)) & 3) << 4));
        d *= static_cast<float>(scale - 32);
      }
      out->scale[0] = out->scale[1] = d;
      return;
    }
    case GgmlType::kIQ3_S: {
      const uint8_t *qs = block + 2 + 8 * c, *signs = block + 74 + 4 * c;
      const int high = block[66 + c];
      for (int i = 0; i < 8; ++i) {
        const uint32_t entry = kIq3sGrid[qs[i] | (((high >> i) & 1) << 8)];
        for (int j = 0; j < 4; ++j) {
          const int l = 4 * i + j, magnitude = static_cast<int>((entry >> (8 * j)) & 0xFF);
          out->q[l] = static_cast<int8_t>((signs[l / 8] >> (l % 8)) & 1 ? -magnitude : magnitude);
        }
      }
      const int scale = (block[106 + c / 2] >> (4 * (c % 2))) & 0xF;
      out->scale[0] = out->scale[1] = Fp16ToFp32(Half(block)) * static_cast<float>(1 + 2 * scale);
      return;
    }
    case GgmlType::kIQ2_XS:
      for (int i = 0; i < 4; ++i) UnpackIq2XsWord(Half(block + 2 + 8 * c + 2 * i), out->q + 8 * i);
      Iq2XsHalfScales(Half(block), block[66 + c], out->scale);
      return;
    default:
      break;
  }
  std::memset(out->q, 0, sizeof out->q);
  out->scale[0] = out->scale[1] = 0;
}

void PortableQuantize(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                      float* q_sum) {
  for (int64_t b = 0; b < rows * (k / 32); ++b) {
    const float* from = x + b * 32;
    int8_t* to = q + b * 32;
    float amax = 0;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(from[l]));
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    int32_t total = 0;
    for (int l = 0; l < 32; ++l) {
      const auto v = static_cast<int32_t>(std::nearbyint(from[l] * inverse));
      to[l] = static_cast<int8_t>(v);
      total += v;
    }
    scale[b] = d;
    q_sum[b] = d * static_cast<float>(total);
  }
}

namespace {

// y's columns [n_begin, n_end) with unpack(j, b, &chunk) giving weight row j's run b.
template <class Unpack>
void PortableProducts(const QuantInput& x, int64_t n, float* y, int64_t n_begin, int64_t n_end,
                      const Unpack& unpack) {
  const int64_t chunks = x.k / 32;
  Chunk chunk;
  std::vector<float> sums(static_cast<size_t>(x.m));
  for (int64_t j = n_begin; j < n_end; ++j) {
    std::fill(sums.begin(), sums.end(), 0.0f);
    for (int64_t b = 0; b < chunks; ++b) {
      unpack(j, b, &chunk);
      for (int64_t i = 0; i < x.m; ++i) {
        const int8_t* xq = x.q.data() + i * x.k + b * 32;
        int32_t halves[2] = {0, 0};
        for (int l = 0; l < 32; ++l) halves[l / 16] += int32_t{chunk.q[l]} * xq[l];
        const float d = x.scale[static_cast<size_t>(i * chunks + b)];
        sums[static_cast<size_t>(i)] += d * (chunk.scale[0] * static_cast<float>(halves[0]) +
                                             chunk.scale[1] * static_cast<float>(halves[1])) +
                                        chunk.bias * x.q_sum[static_cast<size_t>(i * chunks + b)];
        if (chunk.bias2 != 0) {  // Q2_K's second min meets x's second half sum.
          const int32_t second = x.half_sum[static_cast<size_t>(2 * (i * chunks + b) + 1)];
          sums[static_cast<size_t>(i)] += chunk.bias2 * (d * static_cast<float>(second));
        }
      }
    }
    for (int64_t i = 0; i < x.m; ++i) y[i * n + j] = sums[static_cast<size_t>(i)];
  }
}

}  // namespace

void PortableMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n, float* y,
                    int64_t n_begin, int64_t n_end) {
  const int64_t block = BlockElements(type), block_bytes = BlockBytes(type);
  const int64_t row_bytes = x.k / block * block_bytes, per_block = block / 32;
  const auto* rows = static_cast<const uint8_t*>(w);
  PortableProducts(x, n, y, n_begin, n_end, [&](int64_t j, int64_t b, Chunk* chunk) {
    UnpackChunk(type, rows + j * row_bytes + (b / per_block) * block_bytes,
                static_cast<int>(b % per_block), chunk);
  });
}

void PortableRepackedMatmul(const QuantInput& x, uint32_t type, const void* w, int64_t n, float* y,
                            int64_t n_begin, int64_t n_end) {
  const int64_t per_block = BlockElements(type) / 32, record = 8 * BlockBytes(type);
  const int64_t group = x.k / 32 / per_block * record;
  const auto* groups = static_cast<const uint8_t*>(w);
  PortableProducts(x, n, y, n_begin, n_end, [&](int64_t j, int64_t b, Chunk* chunk) {
    UnpackRepacked(type, groups + j / 8 * group + b / per_block * record, static_cast<int>(j % 8),
                   static_cast<int>(b % per_block), chunk);
  });
}

}  // namespace kernels::quant

namespace {

QuantIsa SupportedQuant() {
#ifdef SLUICE_X86
  static const QuantIsa best = [] {
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw")) {
      return QuantIsa::kAvx512Vnni;
    }
    // F16C is CPUID 1 ECX bit 29 (clang 14's __builtin_cpu_supports does not know its name).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
    const bool f16c = ((ecx >> 29) & 1u) != 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
      // AVX-VNNI (CPUID 7.1 EAX bit 4); __builtin_cpu_supports learnt its name after GCC 12.
      __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
      return (eax >> 4) & 1u ? QuantIsa::kAvxVnni : QuantIsa::kAvx2;
    }
    return QuantIsa::kPortable;
  }();
  return best;
#else
  return QuantIsa::kPortable;
#endif
}

QuantIsa QuantLimitFromEnvironment() {
  const char* name = std::getenv("SLUICE_QUANT_KERNELS");
  if (name == nullptr || std::strcmp(name, "amx") == 0) return QuantIsa::kAvx512Vnni;
  for (QuantIsa isa :
       {QuantIsa::kPortable, QuantIsa::kAvx2, QuantIsa::kAvxVnni, QuantIsa::kAvx512Vnni}) {
    if (std::strcmp(name, QuantIsaName(isa)) == 0) return isa;
  }
  std::fprintf(stderr,
               "SLUICE_QUANT_KERNELS=%s is none of portable, avx2, avxvnni, avx512vnni, amx: "
               "ignored\n",
               name);
  return QuantIsa::kAvx512Vnni;
}

// AMX's int8 tiles for Q8_0 and Q4_0 products of 16 rows or more, where the CPU has them: on
// unless SLUICE_QUANT_KERNELS names another path. Asked for (=amx) where there are none, refused
// with a line saying so.
bool AmxQuantFromEnvironment() {
  const char* name = std::getenv("SLUICE_QUANT_KERNELS");
  if (name != nullptr && std::strcmp(name, "amx") == 0) {
#ifdef SLUICE_X86
    if (kernels::quant_amx::Usable()) return true;
#endif
    std::fprintf(stderr,
                 "SLUICE_QUANT_KERNELS=amx: this CPU (or its kernel) gives no AMX int8 tiles; "
                 "the best other path serves\n");
    return false;
  }
  return name == nullptr;
}

std::atomic<QuantIsa> quant_limit{QuantLimitFromEnvironment()};
// The grids read by AVX-512 VBMI's permutes where the CPU has them (kernels.h): where they are
// faster unless SLUICE_QUANT_KERNELS names a path (=avx512vnni is the path without them).
std::atomic<VbmiGrids> vbmi_grids{[] {
  const char* name = std::getenv("SLUICE_QUANT_KERNELS");
  return name == nullptr || std::strcmp(name, "amx") == 0 ? VbmiGrids::kWhereFaster
                                                          : VbmiGrids::kNone;
}()};
std::atomic<bool> amx_quant{AmxQuantFromEnvironment()};
// The int8 tiles of many-row K-quant products: on unless SLUICE_INT8_TILES=off or
// SLUICE_QUANT_KERNELS names a path.
std::atomic<bool> int8_tiles{[] {
  const char* name = std::getenv("SLUICE_QUANT_KERNELS");
  const char* tiles = std::getenv("SLUICE_INT8_TILES");
  if (tiles != nullptr && std::strcmp(tiles, "off") != 0 && std::strcmp(tiles, "on") != 0) {
    std::fprintf(stderr, "SLUICE_INT8_TILES=%s is neither on nor off: ignored\n", tiles);
  }
  if (tiles != nullptr && std::strcmp(tiles, "off") == 0) return false;
  return name == nullptr || std::strcmp(name, "amx") == 0;
}()};

// The best path within the limit. AVX-VNNI and AVX-512 VNNI are not ordered by what a CPU has
// (one may have either): below a limit the CPU does not reach, the next lower path it has.
QuantIsa ActiveQuant() {
  const QuantIsa best = SupportedQuant(), limit = quant_limit.load(std::memory_order_relaxed);
  if (best <= limit) return best;
  if (limit == QuantIsa::kAvxVnni && best == QuantIsa::kAvx512Vnni) return QuantIsa::kAvx2;
  return limit;
}

// Whether Q8_0 and Q4_0 products of 16 rows or more go through AMX's tiles.
bool ActiveAmxQuant() {
#ifdef SLUICE_X86
  return amx_quant.load(std::memory_order_relaxed) && ActiveQuant() == QuantIsa::kAvx512Vnni &&
         kernels::quant_amx::Usable();
#else
  return false;
#endif
}

}  // namespace

QuantIsa BestQuantIsa() { return SupportedQuant(); }

const char* QuantIsaName(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni:
      return "avx512vnni";
    case QuantIsa::kAvxVnni:
      return "avxvnni";
    case QuantIsa::kAvx2:
      return "avx2";
    case QuantIsa::kPortable:
      break;
  }
  return "portable";
}

const char* QuantKernelIsa() {
  return ActiveAmxQuant() ? "amx+avx512vnni" : QuantIsaName(ActiveQuant());
}

void LimitQuantIsa(QuantIsa limit) { quant_limit.store(limit); }

void UseVbmiGrids(VbmiGrids which) { vbmi_grids.store(which); }

bool VbmiGridsInUse(uint32_t ggml_type) {
#ifdef SLUICE_X86
  // Every repacked product asks (MatmulQuantRepacked): the other types answered first.
  const bool iq2_xs = ggml_type == static_cast<uint32_t>(GgmlType::kIQ2_XS);
  const bool iq3_s = ggml_type == static_cast<uint32_t>(GgmlType::kIQ3_S);
  if (!iq2_xs && !iq3_s) return false;
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  // IQ3_S's eight-lane gathers against its permutes (build/llm_kernels_benchmark
  // --benchmark_filter='Quant/rows:(1|16)/threads:(1|2)/type:21/repacked:1/model:1', alternated):
  // on an AMD EPYC Zen 4 the gathers took 2.2 x the permutes' time at one row of x and 1.6 x at
  // 16 (AMD's gathers are microcoded). On an Intel Xeon (family 6 model 207) an earlier form of
  // the permutes (16-bit codes, VPERMT2W: three micro-ops on one port there) took 1.2-1.6 x the
  // gathers' time at one core; this byte form is not measured on Intel, which keeps its gathers.
  static const bool slow_gathers = __builtin_cpu_is("amd");
  const VbmiGrids which = vbmi_grids.load(std::memory_order_relaxed);
  const bool faster = iq2_xs || slow_gathers;
  return vbmi && ActiveQuant() == QuantIsa::kAvx512Vnni &&
         (which == VbmiGrids::kAll || (which == VbmiGrids::kWhereFaster && faster));
#else
  (void)ggml_type;
  return false;
#endif
}

void UseAmxQuant(bool on) { amx_quant.store(on); }

void UseInt8Tiles(bool on) { int8_tiles.store(on); }

bool Int8TilesInUse() {
  return int8_tiles.load(std::memory_order_relaxed) && ActiveQuant() == QuantIsa::kAvx512Vnni;
}

bool IsQuantType(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ2_XS:
    case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

int64_t QuantRowBytes(uint32_t ggml_type, int64_t k) {
  return k / kernels::quant::BlockElements(ggml_type) * kernels::quant::BlockBytes(ggml_type);
}

void DequantizeRow(uint32_t ggml_type, const void* row, int64_t k, float* out) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kF32:
      std::memcpy(out, row, static_cast<size_t>(k) * 4);
      return;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t c = 0; c < k; ++c) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * c, 2);
        out[c] = static_cast<GgmlType>(ggml_type) == GgmlType::kF16 ? Fp16ToFp32(bits)
                                                                    : Bf16ToFp32(bits);
      }
      return;
    default:
      break;
  }
  if (IsLowBitType(ggml_type)) return DequantizeLowBitRow(ggml_type, bytes, k, out);
  if (!IsQuantType(ggml_type)) {
    std::fill(out, out + k, 0.0f);
    return;
  }
  const int64_t block = kernels::quant::BlockElements(ggml_type);
  const int64_t block_bytes = kernels::quant::BlockBytes(ggml_type);
  kernels::quant::Chunk chunk;
  for (int64_t c = 0; c < k; c += 32) {
    kernels::quant::UnpackChunk(ggml_type, bytes + (c / block) * block_bytes,
                                static_cast<int>((c % block) / 32), &chunk);
    for (int l = 0; l < 32; ++l) {
      out[c + l] = chunk.scale[l / 16] * static_cast<float>(chunk.q[l]) + chunk.bias;
    }
  }
}

void QuantizeQ8_0(const float* w, int64_t n, void* blocks) {
  auto* out = static_cast<uint8_t*>(blocks);
  for (int64_t b = 0; b < n / 32; ++b, out += 34) {
    const float* from = w + b * 32;
    float amax = 0;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(from[l]));
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t half = Fp32ToFp16(d);
    std::memcpy(out, &half, 2);
    for (int l = 0; l < 32; ++l) {
      out[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(std::round(from[l] * inverse)));
    }
  }
}

void QuantInput::Prepare(const float* x_rows, int64_t rows, int64_t columns) {
  Reserve(x_rows, rows, columns);
  Fill(0, rows);
}

void QuantInput::Reserve(const float* x_rows, int64_t rows, int64_t columns, bool tiles_wanted,
                         bool tiles_alone) {
  x = x_rows;
  m = rows;
  k = columns;
  q.resize(static_cast<size_t>(m * k));
  scale.resize(static_cast<size_t>(m * (k / 32)));
  q_sum.resize(static_cast<size_t>(m * (k / 32)));
  half_sum.resize(static_cast<size_t>(m * (k / 16)));
  group_rows = m > 1 ? kernels::QuantRowsAtOnce(ActiveQuant()) : 0;
  if (group_rows > 0) {
    grouped_q.resize(q.size());
    grouped_scale.resize(scale.size());
    grouped_q_sum.resize(q_sum.size());
    grouped_half_sum.resize(half_sum.size());
  }
  tiles = tiles_wanted && m >= kInt8TileRows && k % 256 == 0 && Int8TilesInUse();
  if (tiles) {
    tile_q.resize(q.size());
    tile_scale.resize(static_cast<size_t>(m * (k / 256)));
    tile_offset.resize(tile_scale.size());
  }
  per_run = !(tiles && tiles_alone);
}

void GroupQuantRows(const QuantInput& x, int64_t group_rows, int64_t row_begin, int64_t row_end,
                    int8_t* q, float* scale, float* q_sum, int32_t* half_sum) {
  const int64_t runs = x.k / 32, full = x.m / group_rows * group_rows;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t first = r < full ? r / group_rows * group_rows : full;
    const int64_t rows = r < full ? group_rows : x.m - full, i = r - first;
    const int8_t* from = x.q.data() + r * x.k;
    int8_t* to = q + first * x.k;
    for (int64_t c = 0; c < runs; ++c) {
      for (int64_t s = 0; s < 8; ++s) {
        std::memcpy(to + 32 * rows * c + 4 * (rows * s + i), from + 32 * c + 4 * s, 4);
      }
      scale[first * runs + rows * c + i] = x.scale[static_cast<size_t>(r * runs + c)];
      q_sum[first * runs + rows * c + i] = x.q_sum[static_cast<size_t>(r * runs + c)];
      for (int64_t h = 0; h < 2; ++h) {
        half_sum[2 * (first * runs + rows * c + i) + h] =
            x.half_sum[static_cast<size_t>(2 * (r * runs + c) + h)];
      }
    }
  }
}

void QuantInput::Fill(int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end) return;
  if (per_run) Quantize(row_begin, row_end);
  if (per_run && group_rows > 0) {
    GroupQuantRows(*this, group_rows, row_begin, row_end, grouped_q.data(), grouped_scale.data(),
                   grouped_q_sum.data(), grouped_half_sum.data());
  }
#ifdef SLUICE_X86
  if (tiles) kernels::quant_avx512vnni::QuantizeTileRows(this, row_begin, row_end);
#endif
}

namespace {

// x's rows quantised per 32 on the path in use.
void QuantizeOnPath(const float* x, int64_t rows, int64_t k, int8_t* q, float* scale,
                    float* q_sum) {
#ifdef SLUICE_X86
  if (ActiveQuant() >= QuantIsa::kAvx512Vnni) {
    return kernels::quant_avx512vnni::Quantize(x, rows, k, q, scale, q_sum);
  }
  if (ActiveQuant() >= QuantIsa::kAvx2) {
    return kernels::quant_avx2::Quantize(x, rows, k, q, scale, q_sum);
  }
#endif
  kernels::quant::PortableQuantize(x, rows, k, q, scale, q_sum);
}

}  // namespace

void QuantInput::Quantize(int64_t row_begin, int64_t row_end) {
  const int64_t chunks = k / 32;
  QuantizeOnPath(x + row_begin * k, row_end - row_begin, k, q.data() + row_begin * k,
                 scale.data() + row_begin * chunks, q_sum.data() + row_begin * chunks);
  const int8_t* from = q.data() + row_begin * k;
  int32_t* sums = half_sum.data() + row_begin * (k / 16);
  for (int64_t h = 0; h < (row_end - row_begin) * (k / 16); ++h) {
    int32_t total = 0;
    for (int64_t b = 0; b < 16; ++b) total += from[16 * h + b];
    sums[h] = total;
  }
}

namespace {

// x made again, per 32 as well, for a product that meets an input made for the int8 tiles alone
// (per_run false) and that the tiles do not take whole: the bits of an input made for both.
const QuantInput& PerRun(const QuantInput& x) {
  thread_local QuantInput made;
  made.Reserve(x.x, x.m, x.k, /*tiles_wanted=*/x.tiles);
  made.Fill(0, x.m);
  return made;
}

// Whether a repacked product over columns [n_begin, n_end) takes the int8 tiles for every column
// (RepackedColumns on AVX-512 VNNI: whole sixteens from a multiple of 16).
bool TilesTakeWhole(const QuantInput& x, uint32_t ggml_type, int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  return x.tiles && TakesInt8Tiles(ggml_type) && ActiveQuant() == QuantIsa::kAvx512Vnni &&
         !(x.m >= 16 && kernels::quant_amx::Handles(ggml_type) && ActiveAmxQuant()) &&
         !VbmiGridsInUse(ggml_type) && n_begin % 16 == 0 && (n_end - n_begin) % 16 == 0;
#else
  return false;
#endif
}

}  // namespace

void MatmulQuant(const QuantInput& x, uint32_t ggml_type, const void* w, int64_t n, float* y,
                 int64_t n_begin, int64_t n_end) {
  if (!x.per_run) return MatmulQuant(PerRun(x), ggml_type, w, n, y, n_begin, n_end);
#ifdef SLUICE_X86
  switch (ActiveQuant()) {
    case QuantIsa::kAvx512Vnni:
      return kernels::quant_avx512vnni::Matmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kAvxVnni:
      return kernels::quant_avxvnni::Matmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kAvx2:
      return kernels::quant_avx2::Matmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kPortable:
      break;
  }
#endif
  kernels::quant::PortableMatmul(x, ggml_type, w, n, y, n_begin, n_end);
}

void MatmulQuantRepacked(const QuantInput& x, uint32_t ggml_type, const void* w, int64_t n,
                         float* y, int64_t n_begin, int64_t n_end) {
  if (!x.per_run && !TilesTakeWhole(x, ggml_type, n_begin, n_end)) {
    return MatmulQuantRepacked(PerRun(x), ggml_type, w, n, y, n_begin, n_end);
  }
#ifdef SLUICE_X86
  switch (ActiveQuant()) {
    case QuantIsa::kAvx512Vnni:
      if (x.m >= 16 && kernels::quant_amx::Handles(ggml_type) && ActiveAmxQuant()) {
        return kernels::quant_amx::RepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
      }
      if (VbmiGridsInUse(ggml_type)) {
        return kernels::quant_avx512vbmi::RepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
      }
      return kernels::quant_avx512vnni::RepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kAvxVnni:
      return kernels::quant_avxvnni::RepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kAvx2:
      return kernels::quant_avx2::RepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
    case QuantIsa::kPortable:
      break;
  }
#endif
  kernels::quant::PortableRepackedMatmul(x, ggml_type, w, n, y, n_begin, n_end);
}

uint16_t Fp32ToFp16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);  // Inf, NaN.
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // Rounds past 65504: infinity.
  if (x < 0x38800000u) {  // Below 2^-14: a subnormal half, value / 2^-24 rounded to nearest even.
    float magnitude;
    std::memcpy(&magnitude, &x, sizeof magnitude);
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  // Rebias the exponent (127 -> 15) and round the mantissa to 10 bits, ties to even; a carry
  // moves into the exponent as it should.
  const uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float Fp16ToFp32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  uint32_t out;
  if (exponent == 0x1F) {
    out = sign | 0x7F800000u | (mantissa << 13);  // Inf, NaN.
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // Subnormal: the value is mantissa * 2^-24, exact in fp32.
    float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -value : value;
  }
  float value;
  std::memcpy(&value, &out, sizeof value);
  return value;
}

}  // namespace sluice::llm
