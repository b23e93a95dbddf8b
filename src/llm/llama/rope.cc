#include "llm/llama/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace sluice::llm::llama {

RopeTables BuildRopeTables(const ModelArchitecture& a, int context_length) {
  RopeTables t;
  const int64_t half = a.head_dim / 2;
  at::Tensor exponents = at::arange(0, a.head_dim, 2, at::kLong).to(at::kFloat) / a.head_dim;
  at::Tensor positions = at::arange(context_length, at::kFloat).unsqueeze(1);
  if (!a.local_layers.empty() && a.rope_theta_local > 0) {
    at::Tensor local =
        positions.matmul((1.0 / at::pow(a.rope_theta_local, exponents)).unsqueeze(0));
    t.local_cos = local.cos().contiguous();
    t.local_sin = local.sin().contiguous();
  }
  at::Tensor inv_freq = 1.0 / at::pow(a.rope_theta, exponents);
  at::Tensor long_inv_freq;  // LongRoPE past the original context: the long factors' frequencies.
  if (!a.rope_freq_factors.empty()) {
    inv_freq = inv_freq / at::tensor(a.rope_freq_factors, at::kFloat);
  } else if (a.rope_scaling == RopeScaling::kLongRope) {
    if (context_length > a.rope_original_max_positions) {
      long_inv_freq = inv_freq / at::tensor(a.rope_long_factors, at::kFloat);
    }
    inv_freq = inv_freq / at::tensor(a.rope_short_factors, at::kFloat);
  }
  if (a.rope_scaling == RopeScaling::kYarn) {
    // Dimension pairs whose wavelength fits in the original context fewer than beta_slow times
    // are interpolated (divided by the factor), those fitting more than beta_fast times kept,
    // with a linear ramp between (the correction range rounded out to whole pairs, as llama.cpp
    // and transformers round it unless the config says truncate: false).
    const double d = a.head_dim, original = a.rope_original_max_positions;
    auto pair_of = [&](double rotations) {
      return d * std::log(original / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(a.rope_theta));
    };
    double low = pair_of(a.rope_yarn_beta_fast), high = pair_of(a.rope_yarn_beta_slow);
    if (a.rope_yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(0.0, low);
    high = std::min(d - 1, high);
    at::Tensor ramp = ((at::arange(half, at::kFloat) - low) / std::max(0.001, high - low))
                          .clamp(0, 1);  // 0: extrapolated, 1: interpolated.
    inv_freq = inv_freq / a.rope_factor * ramp + inv_freq * (1 - ramp);
  } else if (a.rope_scaling == RopeScaling::kLinear) {
    inv_freq = inv_freq / a.rope_factor;
  } else if (a.rope_scaling == RopeScaling::kLlama3) {
    const double original = a.rope_original_max_positions;
    const double low_wavelen = original / a.rope_low_freq_factor;
    const double high_wavelen = original / a.rope_high_freq_factor;
    at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / a.rope_factor, inv_freq);
    at::Tensor smooth = (original / wavelen - a.rope_low_freq_factor) /
                        (a.rope_high_freq_factor - a.rope_low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / a.rope_factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  at::Tensor freqs = positions.matmul(inv_freq.unsqueeze(0));  // [context, half]
  if (long_inv_freq.defined()) {
    t.long_row = context_length;
    freqs = at::cat({freqs, positions.matmul(long_inv_freq.unsqueeze(0))});
  }
  t.cos = (freqs.cos() * a.rope_attention_factor).contiguous();
  t.sin = (freqs.sin() * a.rope_attention_factor).contiguous();
  TORCH_CHECK(t.cos.size(1) == half);
  return t;
}

}  // namespace sluice::llm::llama
