// The kernels' entry points (llm/kernels/kernels.h): which instruction set this CPU has, the
// SLUICE_CPU_KERNELS cap, the packed layouts, and each call sent to the path in use.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "llm/kernels/internal.h"

namespace sluice::llm {
namespace kernels {
namespace {

template <class T>
void PackTiles(const T* w, int64_t n, int64_t k, T* packed, int64_t columns) {
  const int64_t k_tiles = (k + columns - 1) / columns;
  std::fill(packed, packed + PackedSize(n, k), T{0});
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; c += columns) {
      std::copy(
          w + j * k + c, w + j * k + std::min(k, c + columns),
          packed + TileOffset(j / 16, c / columns, k_tiles, 16 * columns) + (j % 16) * columns);
    }
  }
}

template <class T>
void Pack(const T* w, int64_t n, int64_t k, T* packed) {
  const int64_t kp = RoundUp8(k);
  std::fill(packed, packed + PackedSize(n, k), T{0});
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; c += 8) {
      std::copy(w + j * k + c, w + j * k + std::min(k, c + 8), packed + PackedOffset(j, c, kp));
    }
  }
}

#ifdef SLUICE_X86
// SLUICE_CPU_KERNELS=portable|avx2|avx512bf16 caps the path (to compare them on one machine).
KernelIsa LimitFromEnvironment() {
  const char* name = std::getenv("SLUICE_CPU_KERNELS");
  if (name == nullptr) return KernelIsa::kAmx;
  for (KernelIsa isa :
       {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512Bf16, KernelIsa::kAmx}) {
    if (std::strcmp(name, KernelIsaName(isa)) == 0) return isa;
  }
  std::fprintf(stderr,
               "SLUICE_CPU_KERNELS=%s is none of portable, avx2, avx512bf16, amx: ignored\n", name);
  return KernelIsa::kAmx;
}

std::atomic<KernelIsa> isa_limit{LimitFromEnvironment()};

KernelIsa Supported() {
  static const KernelIsa best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
      return amx::Usable() ? KernelIsa::kAmx : KernelIsa::kAvx512Bf16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KernelIsa::kAvx2;
    return KernelIsa::kPortable;
  }();
  return best;
}

// Whether attention takes avx512.cc's kernels (SLUICE_AVX512_BASE: AVX-512 F, BW and VL): on the
// AVX-512 BF16 and AMX paths, and on the AVX2 path of a CPU whose AVX-512 lacks BF16 (Ice Lake and
// Cascade Lake Xeons), unless the path was capped below the CPU's best (to compare the paths).
bool Avx512Attention() {
  static const bool base = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  const KernelIsa active = Active();
  return active >= KernelIsa::kAvx512Bf16 ||
         (base && active == KernelIsa::kAvx2 && Supported() == KernelIsa::kAvx2);
}
#else
std::atomic<KernelIsa> isa_limit{KernelIsa::kAmx};
KernelIsa Supported() { return KernelIsa::kPortable; }
#endif

}  // namespace

KernelIsa Active() { return std::min(Supported(), isa_limit.load(std::memory_order_relaxed)); }

}  // namespace kernels

using kernels::Active;
using kernels::PackedOffset;
using kernels::RoundUp16;
using kernels::RoundUp32;
using kernels::RoundUp64;
using kernels::RoundUp8;
#ifdef SLUICE_X86
namespace avx2 = kernels::avx2;
namespace avx512 = kernels::avx512;
namespace amx = kernels::amx;
#endif
namespace portable = kernels::portable;

KernelIsa BestKernelIsa() { return kernels::Supported(); }

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAmx:
      return "amx";
    case KernelIsa::kAvx512Bf16:
      return "avx512bf16";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kPortable:
      break;
  }
  return "portable";
}

const char* CpuKernelIsa() { return KernelIsaName(Active()); }

void LimitKernelIsa(KernelIsa limit) { kernels::isa_limit.store(limit); }

int64_t PackedSize(int64_t n, int64_t k) { return RoundUp16(n) * RoundUp64(k); }

void PackBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
  if (Active() == KernelIsa::kAmx) return kernels::PackTiles(w, n, k, packed, 32);
  kernels::Pack(w, n, k, packed);
}
void PackInt8(const int8_t* w, int64_t n, int64_t k, int8_t* packed) {
  if (Active() == KernelIsa::kAmx) return kernels::PackTiles(w, n, k, packed, 64);
  kernels::Pack(w, n, k, packed);
}

void MatmulInput::Prepare(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights) {
  Reserve(x_rows, rows, columns, int8_weights);
  Fill(0, Units());
}

void MatmulInput::Reserve(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights) {
  x = x_rows;
  m = rows;
  k = columns;
  isa = Active();
  for_int8 = int8_weights;
#ifdef SLUICE_X86
  if (isa == KernelIsa::kAvx512Bf16) {
    this->rows.resize(static_cast<size_t>(m * RoundUp8(k)));
  } else if (isa == KernelIsa::kAmx && !int8_weights) {
    pairs.resize(static_cast<size_t>(((m + 15) / 16) * (RoundUp32(k) / 32) * 256));
  }
#endif
}

// The AMX bf16 form goes by (block of 16 rows, 32 columns), AVX-512 BF16's by blocks of 16 rows;
// the int8 AMX form is made in one piece (its rows' scales come first); the paths that keep x
// fp32 need nothing.
int64_t MatmulInput::Units() const {
  if (isa == KernelIsa::kAmx && for_int8) return 1;
  if (isa == KernelIsa::kAmx) return (m + 15) / 16 * (RoundUp32(k) / 32);
  if (isa == KernelIsa::kAvx512Bf16) return (m + 15) / 16;
  return 0;
}

void MatmulInput::Fill(int64_t unit_begin, int64_t unit_end) {
#ifdef SLUICE_X86
  if (unit_begin >= unit_end) return;
  if (isa == KernelIsa::kAvx512Bf16) {
    const int64_t first = unit_begin * 16, last = std::min(m, unit_end * 16);
    avx512::RoundRows(x + first * k, last - first, k, RoundUp8(k),
                      rows.data() + first * RoundUp8(k));
  } else if (isa == KernelIsa::kAmx && for_int8) {
    amx::QuadRows(x, m, k, this);
  } else if (isa == KernelIsa::kAmx) {
    amx::PairRows(x, m, k, &pairs, unit_begin, unit_end);
  }
#endif
}

namespace {

// The path x was prepared for; scales is null for bf16 weights.
template <class T>
void Dispatch(const MatmulInput& x, const T* w, const float* scales, int64_t n, float* y,
              int64_t n_begin, int64_t n_end) {
#ifdef SLUICE_X86
  switch (x.isa) {
    case KernelIsa::kAmx:
      if constexpr (std::is_same_v<T, int8_t>) {
        if (!x.for_int8) {  // Prepared for bf16 weights: x's int8 form is needed.
          thread_local MatmulInput quads;
          quads.Prepare(x.x, x.m, x.k, true);
          return amx::Matmul<true>(quads, w, scales, n, y, n_begin, n_end);
        }
        return amx::Matmul<true>(x, w, scales, n, y, n_begin, n_end);
      } else {
        return amx::Matmul<false>(x, w, nullptr, n, y, n_begin, n_end);
      }
    case KernelIsa::kAvx512Bf16:
      return avx512::Matmul(x, w, scales, n, y, n_begin, n_end);
    case KernelIsa::kAvx2:
      return avx2::Matmul(x.x, x.m, x.k, w, scales, n, y, n_begin, n_end);
    case KernelIsa::kPortable:
      break;
  }
#endif
  portable::Matmul(x.x, x.m, x.k, w, scales, n, y, n_begin, n_end);
}

}  // namespace

void MatmulBf16(const MatmulInput& x, const uint16_t* w, int64_t n, float* y, int64_t n_begin,
                int64_t n_end) {
  Dispatch(x, w, nullptr, n, y, n_begin, n_end);
}

void MatmulInt8(const MatmulInput& x, const int8_t* w, const float* scales, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
  Dispatch(x, w, scales, n, y, n_begin, n_end);
}

void MatmulBf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                int64_t n_begin, int64_t n_end) {
  thread_local MatmulInput input;
  input.Prepare(x, m, k);
  MatmulBf16(input, w, n, y, n_begin, n_end);
}

void MatmulInt8(const float* x, int64_t m, int64_t k, const int8_t* w, const float* scales,
                int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  thread_local MatmulInput input;
  input.Prepare(x, m, k, true);
  MatmulInt8(input, w, scales, n, y, n_begin, n_end);
}

namespace {

template <class T>
void DecodeAttentionOn(const float* q, int groups, const T* k, const T* v, int64_t len, int64_t d,
                       float scale, float* out, float* scratch, const float* sinks) {
#ifdef SLUICE_X86
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (Active() >= KernelIsa::kAmx && d % 32 == 0 && d <= 128 && groups <= 16 &&
        sinks == nullptr) {
      if (groups <= 4 && d <= 64) {
        return amx::FusedDecodeAttention(q, groups, k, v, len, d, scale, out);
      }
      return amx::DecodeAttention(q, groups, k, v, len, d, scale, out, scratch);
    }
  }
  if (kernels::Avx512Attention() && d % 16 == 0 && d <= 256) {
    return avx512::DecodeAttention(q, groups, k, v, len, d, scale, out, scratch, sinks);
  }
  if (Active() >= KernelIsa::kAvx2 && d % 8 == 0) {
    return avx2::DecodeAttention(q, groups, k, v, len, d, scale, out, scratch, sinks);
  }
#endif
  portable::DecodeAttention(q, groups, k, v, len, d, scale, out, scratch, sinks);
}

template <class T>
void DecodeAttentionRowsOn(const float* q, int64_t q_stride, int rows, int groups, const T* k,
                           const T* v, int64_t len, int64_t d, float scale, float* out,
                           int64_t out_stride, float* scratch, const float* sinks) {
#ifdef SLUICE_X86
  if (kernels::Avx512Attention() && Active() != KernelIsa::kAmx && d % 16 == 0 && d <= 256) {
    return avx512::DecodeAttentionRows(q, q_stride, rows, groups, k, v, len, d, scale, out,
                                       out_stride, scratch, nullptr, nullptr, sinks);
  }
#endif
  for (int r = 0; r < rows; ++r) {
    DecodeAttentionOn(q + r * q_stride, groups, k, v, len - (rows - 1) + r, d, scale,
                      out + r * out_stride, scratch, sinks);
  }
}

}  // namespace

void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const float* k,
                         const float* v, int64_t len, int64_t d, float scale, float* out,
                         int64_t out_stride, float* scratch, const float* sinks) {
  DecodeAttentionRowsOn(q, q_stride, rows, groups, k, v, len, d, scale, out, out_stride, scratch,
                        sinks);
}

void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const uint16_t* k,
                         const uint16_t* v, int64_t len, int64_t d, float scale, float* out,
                         int64_t out_stride, float* scratch, const float* sinks) {
  DecodeAttentionRowsOn(q, q_stride, rows, groups, k, v, len, d, scale, out, out_stride, scratch,
                        sinks);
}

void QuantizeKvRow(const float* x, int64_t n, int8_t* q, float* scales) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float sum;  // The products' block sum, not needed here.
    kernels::quant::PortableQuantize(x + 32 * b, 1, 32, q + 32 * b, scales + b, &sum);
  }
}

void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const int8_t* k,
                         const float* k_scales, const int8_t* v, const float* v_scales, int64_t len,
                         int64_t d, float scale, float* out, int64_t out_stride, float* scratch,
                         const float* sinks) {
#ifdef SLUICE_X86
  if (kernels::Avx512Attention() && d % 32 == 0 && d <= 256) {
    return avx512::DecodeAttentionRows(q, q_stride, rows, groups, k, v, len, d, scale, out,
                                       out_stride, scratch, k_scales, v_scales, sinks);
  }
#endif
  // Widened into fp32 rows, then the fp32 path.
  thread_local ScratchVector<float> keys, values;
  keys.resize(static_cast<size_t>(len * d));
  values.resize(keys.size());
  for (int64_t e = 0; e < len * d; ++e) {
    keys[static_cast<size_t>(e)] = static_cast<float>(k[e]) * k_scales[e / 32];
    values[static_cast<size_t>(e)] = static_cast<float>(v[e]) * v_scales[e / 32];
  }
  DecodeAttentionRowsOn(q, q_stride, rows, groups, keys.data(), values.data(), len, d, scale, out,
                        out_stride, scratch, sinks);
}

void DecodeAttention(const float* q, int groups, const float* k, const float* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch, const float* sinks) {
  DecodeAttentionOn(q, groups, k, v, len, d, scale, out, scratch, sinks);
}

void DecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch, const float* sinks) {
  DecodeAttentionOn(q, groups, k, v, len, d, scale, out, scratch, sinks);
}

void ToBf16(const float* x, int64_t n, uint16_t* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return avx512::RoundRows(x, 1, n, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = Fp32ToBf16(x[i]);
}

int64_t ArgMax(const float* x, int64_t n) {
  if (n <= 0) return 0;
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) {
    const int64_t at = avx512::ArgMax(x, n);
    if (!std::isnan(x[at])) return at;  // NaNs: the portable rule below.
  }
#endif
  return std::max_element(x, x + n) - x;
}

void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return avx512::RmsNorm(x, rows, width, weight, eps, out);
  if (Active() >= KernelIsa::kAvx2) return avx2::RmsNorm(x, rows, width, weight, eps, out);
#endif
  portable::RmsNorm(x, rows, width, weight, eps, out);
}

void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx512Bf16) return avx512::SwiGlu(gate_up, rows, inter, out);
  if (Active() >= KernelIsa::kAvx2) return avx2::SwiGlu(gate_up, rows, inter, out);
#endif
  portable::SwiGlu(gate_up, rows, inter, out);
}

// AVX-512 CPUs take the AVX2 path: GeGLU is a small share of a gemma step.
void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
#ifdef SLUICE_X86
  if (Active() >= KernelIsa::kAvx2) return avx2::GeGlu(gate_up, rows, inter, out);
#endif
  portable::GeGlu(gate_up, rows, inter, out);
}

uint16_t Fp32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFp32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

}  // namespace sluice::llm
