// A mixture of experts' feed-forward (LlamaModel::MixtureOfExperts): the router, each row's
// experts, and each expert's rows as one product; apart from llama_model.cc's step.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "llm/llama/llama_model.h"
#include "llm/llama/step_rows.h"

namespace sluice::llm::llama {

void LlamaModel::MixtureOfExperts(const Layer& layer, const at::Tensor& normed, at::Tensor& out) {
  const ModelArchitecture& a = arch_;
  const int64_t rows = normed.size(0), hidden = a.hidden_size, width = a.expert_intermediate_size;
  const int experts = a.experts, used = a.experts_used;
  // The router's logits row by row (a few dot products a row, against the experts' products),
  // so that a row's routing has the same bits whatever rows share its step: ATen's fp32
  // products differ in the last bits by the number of rows.
  at::Tensor logits = Buffer(8, rows, experts);
  {
    const float* rp = layer.router.data_ptr<float>();
    const float* bias = layer.router_bias.defined() ? layer.router_bias.data_ptr<float>() : nullptr;
    const float* xp = normed.data_ptr<float>();
    float* out_logits = logits.data_ptr<float>();
    ForRows(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int e = 0; e < experts; ++e) {
          const float* w = rp + int64_t{e} * hidden;
          const float* x = xp + r * hidden;
          float sum = 0;
          for (int64_t c = 0; c < hidden; ++c) sum += w[c] * x[c];
          out_logits[r * experts + e] = bias != nullptr ? sum + bias[e] : sum;
        }
      }
    });
  }
  // Each expert's rows and their weights: a row's softmax over the experts, its top `used`
  // (the lower index first among equals), renormalised to sum to 1.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(experts));
  std::vector<float> probability(static_cast<size_t>(experts));
  std::vector<int> order(static_cast<size_t>(experts));
  const float* lp = logits.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = lp + r * experts;
    const float top = *std::max_element(row, row + experts);
    float sum = 0;
    for (int e = 0; e < experts; ++e) sum += probability[e] = std::exp(row[e] - top);
    for (float& p : probability) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + used, order.end(), [&](int i, int j) {
      return probability[i] > probability[j] || (probability[i] == probability[j] && i < j);
    });
    float chosen = 0;
    for (int k = 0; k < used; ++k) chosen += probability[order[k]];
    const float scale = a.expert_weights_norm ? 1.0f / chosen : 1.0f;
    for (int k = 0; k < used; ++k) {
      routed[order[k]].emplace_back(r, probability[order[k]] * scale);
    }
  }
  out.zero_();
  float* op = out.data_ptr<float>();
  const float* np = normed.data_ptr<float>();
  for (int e = 0; e < experts; ++e) {
    const auto& mine = routed[static_cast<size_t>(e)];
    if (mine.empty()) continue;
    const auto count = static_cast<int64_t>(mine.size());
    const Layer::Expert& expert = layer.experts[static_cast<size_t>(e)];
    at::Tensor x = Buffer(9, count, hidden);
    float* xp = x.data_ptr<float>();
    for (int64_t i = 0; i < count; ++i) {
      std::copy_n(np + mine[i].first * hidden, hidden, xp + i * hidden);
    }
    at::Tensor gate_up = Buffer(10, count, 2 * width);
    expert.gate_up.Into(x, gate_up.data_ptr<float>());
    at::Tensor act = Buffer(11, count, width);
    GatedActivation(a, gate_up.data_ptr<float>(), count, width, act.data_ptr<float>());
    at::Tensor y = Buffer(12, count, hidden);
    expert.down.Into(act, y.data_ptr<float>());
    const float* yp = y.data_ptr<float>();
    ForRows(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* target = op + mine[i].first * hidden;
        const float weight = mine[i].second;
        for (int64_t c = 0; c < hidden; ++c) target[c] += weight * yp[i * hidden + c];
      }
    });
  }
}

}  // namespace sluice::llm::llama
