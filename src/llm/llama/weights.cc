#include "llm/llama/weights.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "llm/kernels/kernels.h"

namespace sluice::llm::llama {
namespace {

at::ScalarType TorchDtype(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  return at::kByte;  // Rejected by the caller.
}

// Every repacked part of a GGUF file's weights, in one order.
template <class Fn>
void ForEachRepackedPart(Weights* weights, const Fn& fn) {
  auto visit = [&](Linear& linear) {
    for (Linear::Part& part : linear.parts) {
      if (part.repacked && !part.source.empty()) fn(linear, part);
    }
  };
  for (Layer& layer : weights->layers) {
    for (Linear* linear : {&layer.qkv, &layer.out, &layer.gate_up, &layer.down}) visit(*linear);
  }
  visit(weights->lm_head);
}

// After loading through `cache`: where any part was repacked here (no cache file yet, or one
// that lacked it), the cache file is written and every repacked part then reads the mapped file,
// its private copy freed, so that other processes share these pages. A cache that cannot be
// written leaves the private copies, with a warning.
void UseWeightsCache(const std::string& file_path, WeightsCache* cache, Weights* out) {
  std::vector<WeightsCache::Tensor> tensors;
  bool repacked_here = false;
  ForEachRepackedPart(out, [&](const Linear& linear, const Linear::Part& part) {
    tensors.push_back({part.source, part.type, part.rows, part.blocks,
                       part.rows * QuantRowBytes(part.type, linear.in)});
    repacked_here |=
        cache->Find(part.source, part.type, part.rows, tensors.back().bytes) != part.blocks;
  });
  if (tensors.empty()) return;
  if (!repacked_here) {
    out->weights_cache = fmt::format("repacked weights mapped from {}", cache->path());
    return;
  }
  if (Status status = cache->Write(tensors); !status.ok()) {
    spdlog::warn("{}: weights cache not written (this process keeps its own copy): {}", file_path,
                 status.message());
    return;
  }
  bool all = true;
  ForEachRepackedPart(out, [&](const Linear& linear, Linear::Part& part) {
    const int64_t bytes = part.rows * QuantRowBytes(part.type, linear.in);
    const uint8_t* mapped = cache->Find(part.source, part.type, part.rows, bytes);
    if (mapped == nullptr) {
      all = false;
      return;
    }
    Linear::UseRepacked(&part, mapped, cache->owner(), linear.in);
  });
  if (out->embedding_repacked) out->embedding_blocks = out->lm_head.parts.front().blocks;
  out->weights_cache = fmt::format("repacked weights written to {}{}", cache->path(),
                                   all ? "" : " (some kept in memory)");
}

}  // namespace

Status LoadSafetensorsWeights(const SafetensorsFile& file, const ModelArchitecture& arch,
                              LlmPrecision precision, Weights* out) {
  const ModelArchitecture& a = arch;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> Result<at::Tensor> {
    const SafetensorsEntry* entry = file.Find(name);
    if (entry == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is missing", file.path(), name));
    }
    if (entry->shape != shape) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]",
                                                 file.path(), name, fmt::join(entry->shape, ", "),
                                                 fmt::join(shape, ", ")));
    }
    const at::ScalarType type = TorchDtype(entry->dtype);
    if (type == at::kByte) {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' has dtype {}; F32, BF16 or "
                      "F16 expected",
                      file.path(), name, entry->dtype));
    }
    // The mapping is read-only; from_blob never writes, and to() copies out of it.
    at::Tensor view =
        at::from_blob(const_cast<void*>(entry->data), shape, at::TensorOptions().dtype(type));
    return view.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  };
  auto linear = [&](std::vector<at::Tensor> parts) {
    at::Tensor w = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    Linear result;
    result.Add(w, precision);
    out->bytes += result.bytes();
    return result;
  };
  auto norm = [&](const at::Tensor& w) {
    out->bytes += w.numel() * at::elementSize(at::kFloat);
    return w.contiguous();
  };
  const int64_t hidden = a.hidden_size, q_rows = int64_t{a.heads} * a.head_dim,
                kv_rows = int64_t{a.kv_heads} * a.head_dim;
  auto embedding = get("model.embed_tokens.weight", {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  out->embedding = embedding->to(out->dtype).contiguous();
  for (int i = 0; i < a.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    auto q = get(p + "self_attn.q_proj.weight", {q_rows, hidden});
    auto k = get(p + "self_attn.k_proj.weight", {kv_rows, hidden});
    auto v = get(p + "self_attn.v_proj.weight", {kv_rows, hidden});
    auto o = get(p + "self_attn.o_proj.weight", {hidden, q_rows});
    auto gate = get(p + "mlp.gate_proj.weight", {a.intermediate_size, hidden});
    auto up = get(p + "mlp.up_proj.weight", {a.intermediate_size, hidden});
    auto down = get(p + "mlp.down_proj.weight", {hidden, a.intermediate_size});
    auto attn_norm = get(p + "input_layernorm.weight", {hidden});
    auto ffn_norm = get(p + "post_attention_layernorm.weight", {hidden});
    for (const auto* t : {&q, &k, &v, &o, &gate, &up, &down, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear({*q, *k, *v});
    layer.out = linear({*o});
    layer.gate_up = linear({*gate, *up});
    layer.down = linear({*down});
    layer.attn_norm = norm(*attn_norm);
    layer.ffn_norm = norm(*ffn_norm);
    out->layers.push_back(std::move(layer));
  }
  auto final_norm = get("model.norm.weight", {hidden});
  if (!final_norm.ok()) return final_norm.status();
  out->final_norm = norm(*final_norm);
  if (a.tie_word_embeddings && file.Find("lm_head.weight") == nullptr) {
    out->lm_head = linear({*embedding});
  } else {
    auto head = get("lm_head.weight", {a.vocab_size, hidden});
    if (!head.ok()) return head.status();
    out->lm_head = linear({*head});
  }
  return Status::Ok();
}

// llama.cpp's tensor names (blk.N.attn_q.weight, ...), each tensor kept in its type: quantised
// ones as parts of their layers read where the file is mapped, float ones converted to the
// serving precision. Shapes are checked against the architecture.
Status LoadGgufWeights(const GgufFile& file, const ModelArchitecture& arch, LlmPrecision precision,
                       WeightsCache* cache, Weights* out) {
  const ModelArchitecture& a = arch;
  auto find = [&](const std::string& name,
                  const std::vector<int64_t>& shape) -> Result<const GgufTensor*> {
    const GgufTensor* tensor = file.FindTensor(name);
    if (tensor == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is missing", file.path(), name));
    }
    if (tensor->shape != shape) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]",
                                                 file.path(), name, fmt::join(tensor->shape, ", "),
                                                 fmt::join(shape, ", ")));
    }
    return tensor;
  };
  auto floats = [](const GgufTensor& tensor) {
    at::Tensor values = at::empty(tensor.shape, at::kFloat);
    DequantizeRow(tensor.type, tensor.data, tensor.elements(), values.data_ptr<float>());
    return values;
  };
  // Consecutive float tensors become one part (stacked); each quantised tensor a part of its own.
  auto linear = [&](const std::vector<const GgufTensor*>& tensors) {
    Linear result;
    std::vector<at::Tensor> pending;
    auto flush = [&] {
      if (pending.empty()) return;
      result.Add(pending.size() == 1 ? pending[0] : at::cat(pending, 0), precision);
      pending.clear();
    };
    for (const GgufTensor* tensor : tensors) {
      if (IsQuantType(tensor->type)) {
        flush();
        const int64_t rows = tensor->shape[0], columns = tensor->shape[1];
        const uint8_t* cached = cache == nullptr
                                    ? nullptr
                                    : cache->Find(tensor->name, tensor->type, rows,
                                                  rows * QuantRowBytes(tensor->type, columns));
        if (cached != nullptr) {
          result.AddBlocks(nullptr, tensor->type, rows, columns, /*repack=*/false);
          Linear::UseRepacked(&result.parts.back(), cached, cache->owner(), columns);
        } else {
          result.AddBlocks(tensor->data, tensor->type, rows, columns);
        }
        result.parts.back().source = tensor->name;
      } else {
        pending.push_back(floats(*tensor));
      }
    }
    flush();
    out->bytes += result.bytes();
    return result;
  };
  auto norm = [&](const GgufTensor& tensor) {
    out->bytes += tensor.elements() * at::elementSize(at::kFloat);
    return floats(tensor);
  };
  const int64_t hidden = a.hidden_size, inter = a.intermediate_size, d = a.head_dim,
                q_rows = int64_t{a.heads} * d, kv_rows = int64_t{a.kv_heads} * d;
  const bool phi3 = a.name == "phi3";
  auto embedding = find("token_embd.weight", {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  if (IsQuantType((*embedding)->type)) {
    out->embedding_blocks = (*embedding)->data;
    out->embedding_type = (*embedding)->type;
  } else {
    out->embedding = floats(**embedding).to(out->dtype).contiguous();
  }
  for (int i = 0; i < a.layers; ++i) {
    const std::string p = fmt::format("blk.{}.", i);
    std::vector<Result<const GgufTensor*>> qkv, gate_up;
    if (phi3) {
      qkv.push_back(find(p + "attn_qkv.weight", {q_rows + 2 * kv_rows, hidden}));
      gate_up.push_back(find(p + "ffn_up.weight", {2 * inter, hidden}));
    } else {
      qkv.push_back(find(p + "attn_q.weight", {q_rows, hidden}));
      qkv.push_back(find(p + "attn_k.weight", {kv_rows, hidden}));
      qkv.push_back(find(p + "attn_v.weight", {kv_rows, hidden}));
      gate_up.push_back(find(p + "ffn_gate.weight", {inter, hidden}));
      gate_up.push_back(find(p + "ffn_up.weight", {inter, hidden}));
    }
    auto o = find(p + "attn_output.weight", {hidden, q_rows});
    auto down = find(p + "ffn_down.weight", {hidden, inter});
    auto attn_norm = find(p + "attn_norm.weight", {hidden});
    auto ffn_norm = find(p + "ffn_norm.weight", {hidden});
    std::vector<const GgufTensor*> qkv_tensors, gate_up_tensors;
    for (auto* list : {&qkv, &gate_up}) {
      for (const auto& t : *list) {
        if (!t.ok()) return t.status();
        (list == &qkv ? qkv_tensors : gate_up_tensors).push_back(*t);
      }
    }
    for (const auto* t : {&o, &down, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear(qkv_tensors);
    layer.out = linear({*o});
    layer.gate_up = linear(gate_up_tensors);
    layer.down = linear({*down});
    layer.attn_norm = norm(**attn_norm);
    layer.ffn_norm = norm(**ffn_norm);
    if (a.attention_bias) {
      auto qb = find(p + "attn_q.bias", {q_rows});
      auto kb = find(p + "attn_k.bias", {kv_rows});
      auto vb = find(p + "attn_v.bias", {kv_rows});
      for (const auto* t : {&qb, &kb, &vb}) {
        if (!t->ok()) return t->status();
      }
      layer.qkv.bias = at::cat({floats(**qb), floats(**kb), floats(**vb)}, 0);
      out->bytes += layer.qkv.bias.nbytes();
    }
    if (a.qk_norm) {
      auto qn = find(p + "attn_q_norm.weight", {d});
      auto kn = find(p + "attn_k_norm.weight", {d});
      if (!qn.ok()) return qn.status();
      if (!kn.ok()) return kn.status();
      layer.q_norm = norm(**qn);
      layer.k_norm = norm(**kn);
    }
    if (a.post_norms) {
      auto post_attn = find(p + "post_attention_norm.weight", {hidden});
      auto post_ffn = find(p + "post_ffw_norm.weight", {hidden});
      if (!post_attn.ok()) return post_attn.status();
      if (!post_ffn.ok()) return post_ffn.status();
      layer.post_attn_norm = norm(**post_attn);
      layer.post_ffn_norm = norm(**post_ffn);
    }
    out->layers.push_back(std::move(layer));
  }
  auto final_norm = find("output_norm.weight", {hidden});
  if (!final_norm.ok()) return final_norm.status();
  out->final_norm = norm(**final_norm);
  if (a.tie_word_embeddings) {
    out->lm_head = linear({*embedding});
    const Linear::Part& head = out->lm_head.parts.front();
    if (out->embedding_blocks != nullptr && out->lm_head.parts.size() == 1 && head.repacked) {
      // The repacked copy replaced the file's pages (released at repacking); lookups read it.
      out->embedding_blocks = head.blocks;
      out->embedding_repacked = true;
    }
  } else {
    auto head = find("output.weight", {a.vocab_size, hidden});
    if (!head.ok()) return head.status();
    out->lm_head = linear({*head});
  }
  if (cache != nullptr) UseWeightsCache(file.path(), cache, out);
  return Status::Ok();
}

}  // namespace sluice::llm::llama
