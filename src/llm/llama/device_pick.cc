// The device step's picking of tokens where the logits are (StepModel::RunPicking): greedy
// rows' argmax, sampled rows drawn as the host's Sampler draws, a grammar's mask and the
// penalties first, and log-probabilities under the raw logits; only tokens and the asked-for
// values are copied to the host.
#include <algorithm>
#include <limits>
#include <vector>

#include "llm/llama/device_step.h"

namespace sluice::llm::llama {

at::Tensor DeviceStepModel::Pick(const std::vector<SequenceChunk>& chunks, at::Tensor rows,
                                 std::vector<int32_t>* picked,
                                 std::vector<TokenLogprobs>* logprobs) const {
  const ModelArchitecture& a = arch_;
  const auto on = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).to(rows.device());
  };
  // Picked rows' tokens made here, the host's rows' logits copied out.
  std::vector<int64_t> greedy, sampled, keep, order;  // order: each picked row's kind.
  std::vector<const TokenPick*> picks;
  // The penalties' edits: (row x vocab + token) of the repeated tokens with their factors,
  // then of the counted ones with their amounts.
  std::vector<int64_t> repeated, counted, masked;  // masked: rows with a grammar's bits.
  std::vector<float> factors, amounts;
  std::vector<int64_t> words;  // Their bits, (vocab + 31) / 32 words a row.
  // Rows whose log-probabilities are asked for, how many top tokens each, and each one's
  // place among the picked rows.
  std::vector<int64_t> scored, scored_at;
  std::vector<int> tops;
  int64_t row = 0;
  for (const SequenceChunk& chunk : chunks) {
    const auto n = static_cast<int64_t>(chunk.all_logits ? chunk.tokens.size() : 1);
    for (int64_t j = 0; j < n; ++j, ++row) {
      const TokenPick& p = chunk.pick;
      if (p.kind != TokenPick::kHost) {
        if (p.logprobs >= 0 && logprobs != nullptr) {
          scored.push_back(row);
          scored_at.push_back(static_cast<int64_t>(order.size()));
          tops.push_back(p.logprobs);
        }
        if (!p.allowed.empty()) {
          masked.push_back(row);
          words.insert(words.end(), p.allowed.begin(), p.allowed.end());
        }
        for (const int32_t t : p.repeated) {
          if (t >= a.vocab_size) continue;  // As Sampler::Next skips them.
          repeated.push_back(row * a.vocab_size + t);
          factors.push_back(p.repetition);
        }
        for (size_t i = 0; i < p.counted.size(); ++i) {
          if (p.counted[i] >= a.vocab_size) continue;
          counted.push_back(row * a.vocab_size + p.counted[i]);
          amounts.push_back(p.amounts[i]);
        }
      }
      switch (p.kind) {
        case TokenPick::kHost:
          keep.push_back(row);
          break;
        case TokenPick::kGreedy:
          order.push_back(0);
          greedy.push_back(row);
          break;
        case TokenPick::kSample:
          order.push_back(1);
          sampled.push_back(row);
          picks.push_back(&p);
          break;
      }
    }
  }
  // Log-probabilities are of the raw logits, before a mask or a penalty.
  const at::Tensor raw = scored.empty() ? at::Tensor() : rows.index_select(0, on(scored));
  if (!masked.empty()) {  // A grammar's mask first, as the host masks before sampling.
    const auto n = static_cast<int64_t>(masked.size());
    const at::Tensor bits =
        on(words)
            .view({n, -1, 1})
            .bitwise_right_shift(at::arange(32, rows.options().dtype(at::kLong)))
            .bitwise_and(1)
            .view({n, -1})
            .narrow(1, 0, a.vocab_size);
    const at::Tensor where = on(masked);
    rows = rows.index_copy(0, where,
                           rows.index_select(0, where).masked_fill(
                               bits.eq(0), -std::numeric_limits<float>::infinity()));
  }
  if (!repeated.empty() || !counted.empty()) {
    rows = rows.contiguous();
    at::Tensor flat = rows.view({-1});
    if (!repeated.empty()) {
      const at::Tensor where = on(repeated), v = flat.index_select(0, where);
      const at::Tensor f = at::tensor(factors).to(rows.device());
      flat.index_copy_(0, where, at::where(v > 0, v / f, v * f));
    }
    if (!counted.empty()) {
      const at::Tensor where = on(counted);
      flat.index_copy_(0, where,
                       flat.index_select(0, where) - at::tensor(amounts).to(rows.device()));
    }
  }
  if (!order.empty()) {
    at::Tensor tokens = at::empty({static_cast<int64_t>(order.size())},
                                  at::TensorOptions().dtype(at::kLong).device(rows.device()));
    const at::Tensor kinds = on(order);
    if (!greedy.empty()) {
      tokens.masked_scatter_(kinds == 0, rows.index_select(0, on(greedy)).argmax(-1));
    }
    if (!sampled.empty()) {
      tokens.masked_scatter_(kinds == 1, Sample(rows.index_select(0, on(sampled)), picks));
    }
    const at::Tensor host = tokens.to(at::kInt).to(at::kCPU).contiguous();
    const int32_t* t = host.data_ptr<int32_t>();
    picked->insert(picked->end(), t, t + host.numel());
    if (!scored.empty()) Score(raw, tokens.index_select(0, on(scored_at)), tops, logprobs);
    rows = rows.index_select(0, on(keep));
  }
  return rows;
}

at::Tensor DeviceStepModel::Sample(const at::Tensor& logits,
                                   const std::vector<const TokenPick*>& picks) const {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  std::vector<float> inverse;
  std::vector<int64_t> top_k, sorts;
  std::vector<double> top_p, draw;
  for (const TokenPick* p : picks) {
    inverse.push_back(static_cast<float>(1.0 / p->temperature));
    const int64_t k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
    top_k.push_back(k);
    sorts.push_back(k < vocab || p->top_p < 1.0);
    top_p.push_back(p->top_p);
    draw.push_back(p->draw);
  }
  const at::Device dev = logits.device();
  const auto column = [&](const at::Tensor& t) { return t.to(dev).unsqueeze(1); };
  const at::Tensor scaled = logits * column(at::tensor(inverse));
  // Each row's candidates: by logit, highest first, where top-k or top-p cuts; else in id order.
  const auto [sorted_values, sorted_ids] = scaled.sort(/*stable=*/true, -1, /*descending=*/true);
  const at::Tensor sorted = column(at::tensor(sorts)).to(at::kBool);
  const at::Tensor positions = at::arange(vocab, logits.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor order = at::where(sorted, sorted_ids, positions.expand({rows, vocab}));
  const at::Tensor values = at::where(sorted, sorted_values, scaled);
  at::Tensor probs = (values - scaled.amax(-1, /*keepdim=*/true)).to(at::kDouble).exp() *
                     (positions < column(at::tensor(top_k)));
  // Top-p: up to the first candidate at which the running share reaches it.
  const at::Tensor p = column(at::tensor(top_p));
  const at::Tensor reached =
      ((probs / probs.sum(-1, /*keepdim=*/true)).cumsum(-1) >= p).logical_and(p < 1.0);
  const at::Tensor cut = at::where(reached.any(-1, /*keepdim=*/true),
                                   reached.to(at::kInt).argmax(-1, /*keepdim=*/true) + 1,
                                   at::full({rows, 1}, vocab, positions.options()));
  probs = probs * (positions < cut);
  const at::Tensor running = probs.cumsum(-1);
  const at::Tensor target = column(at::tensor(draw)) * running.narrow(-1, vocab - 1, 1);
  // The first candidate whose running sum passes the target (the last kept one at worst).
  const at::Tensor index = at::minimum((running <= target).sum(-1, /*keepdim=*/true), cut - 1);
  return order.gather(1, index).squeeze(1);
}

void DeviceStepModel::Score(const at::Tensor& logits, const at::Tensor& chosen,
                            const std::vector<int>& tops, std::vector<TokenLogprobs>* out) {
  // As LogProbabilities: log_z = max + log(sum(exp(l - max))) in fp64, l - log_z to fp32.
  const at::Tensor max = logits.amax(-1, /*keepdim=*/true);
  const at::Tensor log_z =
      max.to(at::kDouble) + (logits - max).to(at::kDouble).exp().sum(-1, true).log();
  const int top = *std::max_element(tops.begin(), tops.end());
  const int64_t keep = std::min<int64_t>(top, logits.size(1));
  const auto [values, ids] = logits.sort(/*stable=*/true, -1, /*descending=*/true);
  const auto logprob = [&](const at::Tensor& l) {
    return (l.to(at::kDouble) - log_z).to(at::kFloat).to(at::kCPU).contiguous();
  };
  const at::Tensor chosen_lp = logprob(logits.gather(1, chosen.unsqueeze(1)));
  const at::Tensor top_lp = logprob(values.narrow(1, 0, keep));
  const at::Tensor top_ids = ids.narrow(1, 0, keep).to(at::kCPU).contiguous();
  const at::Tensor chosen_ids = chosen.to(at::kCPU).contiguous();
  const int64_t* id = top_ids.data_ptr<int64_t>();
  const float* lp = top_lp.data_ptr<float>();
  for (size_t r = 0; r < tops.size(); ++r) {
    const auto i = static_cast<int64_t>(r);
    TokenLogprobs p;
    p.chosen = {static_cast<int32_t>(chosen_ids.data_ptr<int64_t>()[i]),
                chosen_lp.data_ptr<float>()[i]};
    for (int64_t k = 0; k < std::min<int64_t>(tops[r], keep); ++k) {
      p.top.push_back({static_cast<int32_t>(id[i * keep + k]), lp[i * keep + k]});
    }
    out->push_back(std::move(p));
  }
}

}  // namespace sluice::llm::llama
