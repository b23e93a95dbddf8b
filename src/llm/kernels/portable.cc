// The portable path: plain C++ that every CPU runs, and the reference the vector paths are tested
// against. Its sums are taken in the same order as the AVX2 path's (eight lanes, then the lanes
// added in pairs), so the two give the same results.
#include <algorithm>
#include <cmath>

#include "llm/kernels/internal.h"

namespace sluice::llm::kernels::portable {
namespace {

float Widen(uint16_t w) { return Bf16ToFp32(w); }
float Widen(int8_t w) { return static_cast<float>(w); }
float Widen(float w) { return w; }

}  // namespace

// The portable path: eight lane sums per element, added up as the vector path does.
template <class T>
void Matmul(const float* x, int64_t m, int64_t k, const T* w, const float* scales, int64_t n,
            float* y, int64_t n_begin, int64_t n_end) {
  const int64_t kp = RoundUp8(k);
  for (int64_t j = n_begin; j < n_end; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float lanes[8] = {};
      for (int64_t c = 0; c < kp; c += 8) {
        const T* wc = w + PackedOffset(j, c, kp);
        for (int64_t l = 0; l < 8; ++l) {
          const float xv = c + l < k ? x[i * k + c + l] : 0.0f;
          lanes[l] = std::fma(xv, Widen(wc[l]), lanes[l]);
        }
      }
      // The order of HorizontalSum below: (l, l + 4) pairs, then (0, 2), (1, 3), then the two.
      float quad[4];
      for (int l = 0; l < 4; ++l) quad[l] = lanes[l] + lanes[l + 4];
      const float sum = (quad[0] + quad[2]) + (quad[1] + quad[3]);
      y[i * n + j] = scales != nullptr ? sum * scales[j] : sum;
    }
  }
}

void SoftmaxRows(float* scores, int groups, int64_t len, const float* sinks) {
  for (int g = 0; g < groups; ++g) {
    float* row = scores + g * len;
    float max = *std::max_element(row, row + len);
    float total = 0;
    if (sinks != nullptr) {
      max = std::max(max, sinks[g]);
      total = std::exp(sinks[g] - max);
    }
    for (int64_t j = 0; j < len; ++j) total += row[j] = std::exp(row[j] - max);
    const float inverse = 1.0f / total;
    for (int64_t j = 0; j < len; ++j) row[j] *= inverse;
  }
}

template <class T>
void DecodeAttention(const float* q, int groups, const T* k, const T* v, int64_t len, int64_t d,
                     float scale, float* out, float* scratch, const float* sinks) {
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[g * d + c] * Widen(k[j * d + c]);
      scratch[g * len + j] = dot * scale;
    }
  }
  SoftmaxRows(scratch, groups, len, sinks);
  std::fill(out, out + groups * d, 0.0f);
  for (int64_t j = 0; j < len; ++j) {
    for (int g = 0; g < groups; ++g) {
      const float p = scratch[g * len + j];
      for (int64_t c = 0; c < d; ++c) out[g * d + c] += p * Widen(v[j * d + c]);
    }
  }
}

void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * width;
    float squares = 0;
    for (int64_t c = 0; c < width; ++c) squares += row[c] * row[c];
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
    for (int64_t c = 0; c < width; ++c) out[t * width + c] = weight[c] * (row[c] * inverse);
  }
}

void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* gate = gate_up + t * 2 * inter;
    for (int64_t c = 0; c < inter; ++c) {
      const float g = gate[c];
      out[t * inter + c] = g / (1.0f + std::exp(-g)) * gate[inter + c];
    }
  }
}

void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  for (int64_t t = 0; t < rows; ++t) {
    const float* gate = gate_up + t * 2 * inter;
    for (int64_t c = 0; c < inter; ++c) {
      const float g = gate[c];
      // g (1 + tanh(u)) / 2 = g sigmoid(2 u), without 1 + tanh(u)'s cancellation for g < 0.
      const float z = 2.0f * kSqrt2OverPi * (g + kCubic * g * g * g);
      const float e = std::exp(-std::abs(z));
      out[t * inter + c] = (z >= 0 ? g : g * e) / (1.0f + e) * gate[inter + c];
    }
  }
}

template void Matmul(const float*, int64_t, int64_t, const uint16_t*, const float*, int64_t, float*,
                     int64_t, int64_t);
template void Matmul(const float*, int64_t, int64_t, const int8_t*, const float*, int64_t, float*,
                     int64_t, int64_t);
template void DecodeAttention(const float*, int, const float*, const float*, int64_t, int64_t,
                              float, float*, float*, const float*);
template void DecodeAttention(const float*, int, const uint16_t*, const uint16_t*, int64_t, int64_t,
                              float, float*, float*, const float*);

}  // namespace sluice::llm::kernels::portable
