// A mixture of experts' feed-forward (LlamaModel::MixtureOfExperts): the router, each row's
// experts, and each expert's rows as one product; apart from llama_model.cc's step.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "llm/llama/linear.h"
#include "llm/llama/llama_model.h"
#include "llm/llama/step_rows.h"

namespace sluice::llm::llama {
namespace {

// Experts with at most this many rows each go one to a thread (LlamaModel::MixtureOfExperts).
constexpr size_t kExpertsApartRows = 16;

// w . x over n floats in a fixed order: 16 running sums (lane c % 16 takes term c), then added
// in halves. The same bits whatever rows share the step, as the router needs. One running sum
// waited on each addition's latency: a row of Qwen3-30B-A3B's router (128 x 2,048) took 159 us
// a layer that way and takes 24 (one core of an Intel Xeon, family 6 model 207).
float RouterDot(const float* w, const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float part[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) part[j] += w[c + j] * x[c + j];
  }
  for (int j = 0; j < kLanes && c < n; ++j, ++c) part[j] += w[c] * x[c];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) part[j] += part[j + width];
  }
  return part[0];
}

}  // namespace

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
          const float sum = RouterDot(rp + int64_t{e} * hidden, xp + r * hidden, hidden);
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
  // Expert e's rows, gathered, at [first[e], first[e + 1]) of the step's picked rows (rows x
  // used), each expert's product, activation and output in its own rows of the buffers.
  std::vector<int64_t> first(static_cast<size_t>(experts) + 1, 0);
  std::vector<int> active;  // The experts with rows, most rows first.
  for (int e = 0; e < experts; ++e) {
    const auto count = static_cast<int64_t>(routed[static_cast<size_t>(e)].size());
    first[static_cast<size_t>(e) + 1] = first[static_cast<size_t>(e)] + count;
    if (count > 0) active.push_back(e);
  }
  std::stable_sort(active.begin(), active.end(), [&](int i, int j) {
    return routed[static_cast<size_t>(i)].size() > routed[static_cast<size_t>(j)].size();
  });
  const int64_t picked = first.back();
  at::Tensor gathered = Buffer(9, picked, hidden), gate_up = Buffer(10, picked, 2 * width);
  at::Tensor act = Buffer(11, picked, width), y = Buffer(12, picked, hidden);
  const float* np = normed.data_ptr<float>();
  const auto run_expert = [&](int e) {
    const auto& mine = routed[static_cast<size_t>(e)];
    const auto count = static_cast<int64_t>(mine.size());
    const int64_t at = first[static_cast<size_t>(e)];
    const Layer::Expert& expert = layer.experts[static_cast<size_t>(e)];
    float* xp = gathered.data_ptr<float>() + at * hidden;
    for (int64_t i = 0; i < count; ++i) {
      std::copy_n(np + mine[static_cast<size_t>(i)].first * hidden, hidden, xp + i * hidden);
    }
    float* gp = gate_up.data_ptr<float>() + at * 2 * width;
    expert.gate_up.Into(gathered.narrow(0, at, count), gp);
    GatedActivation(a, gp, count, width, act.data_ptr<float>() + at * width);
    expert.down.Into(act.narrow(0, at, count), y.data_ptr<float>() + at * hidden);
  };
  // Where every expert has few rows (decoding), the experts are shared out among the threads,
  // each expert's products on one thread, from a shared counter (most rows first): no barrier
  // between an expert's products, and none between experts. With many rows (a prompt), each
  // expert's products are split among the threads, as every other product is.
  const int threads = static_cast<int>(
      std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(active.size())));
  const bool apart = threads > 1 && !active.empty() &&
                     routed[static_cast<size_t>(active.front())].size() <= kExpertsApartRows;
  if (apart) {
    std::atomic<size_t> next{0};
#pragma omp parallel num_threads(threads)
    {
      OneOmpThread alone;  // This thread's products on this thread only.
      for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < active.size();
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        run_expert(active[i]);
      }
    }
  } else {
    for (int e : active) run_expert(e);
  }
  // Each row's experts' outputs times their weights, added in the experts' order whichever
  // thread made them.
  std::vector<std::pair<int64_t, float>> terms(static_cast<size_t>(rows * used));
  std::vector<int> filled(static_cast<size_t>(rows), 0);
  for (int e = 0; e < experts; ++e) {
    const auto& mine = routed[static_cast<size_t>(e)];
    for (size_t i = 0; i < mine.size(); ++i) {
      const int64_t r = mine[i].first;
      terms[static_cast<size_t>(r * used + filled[static_cast<size_t>(r)]++)] = {
          first[static_cast<size_t>(e)] + static_cast<int64_t>(i), mine[i].second};
    }
  }
  float* op = out.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  ForRows(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* target = op + r * hidden;
      std::fill_n(target, hidden, 0.0f);
      for (int k = 0; k < used; ++k) {
        const auto [index, weight] = terms[static_cast<size_t>(r * used + k)];
        const float* from = yp + index * hidden;
        for (int64_t c = 0; c < hidden; ++c) target[c] += weight * from[c];
      }
    }
  });
}

}  // namespace sluice::llm::llama
