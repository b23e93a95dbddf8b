#include "llm/llama/weights.h"

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"
#include "llm/models/family.h"

namespace sluice::llm::llama {

Result<ModelArchitecture> ReadArchitecture(const std::string& dir,
                                           std::unique_ptr<GgufFile>* gguf) {
  auto gguf_path = FindGgufFile(dir);
  if (!gguf_path.ok()) return gguf_path.status();
  if (gguf_path->empty()) {
    return ParseArchitecture((std::filesystem::path(dir) / "config.json").string());
  }
  auto opened = GgufFile::Open(*gguf_path);
  if (!opened.ok()) return opened.status();
  *gguf = std::move(*opened);
  return ArchitectureFromGguf(**gguf);
}

Status LoadDecoderWeights(const std::string& dir, LlmPrecision precision,
                          const std::string& weights_cache, Decoder* decoder) {
  decoder->weights.dtype = precision == LlmPrecision::kFp32 ? at::kFloat : at::kBFloat16;
  const OneOmpThread one_thread;
  c10::InferenceMode guard;
  if (decoder->gguf == nullptr) {
    auto file = SafetensorsFile::OpenCheckpoint(dir);
    if (!file.ok()) return file.status();
    return LoadSafetensorsWeights(**file, decoder->arch, precision, &decoder->weights);
  }
  std::unique_ptr<WeightsCache> cache;
  // With SLUICE_QUANT_REPACK=0 (the file's layout, to compare the two) there is nothing to cache.
  if (!weights_cache.empty() && Linear::RepacksBlocks()) {
    auto opened = WeightsCache::Open(weights_cache, *decoder->gguf);
    if (!opened.ok()) return opened.status();
    cache = std::move(*opened);
  }
  return LoadGgufWeights(*decoder->gguf, decoder->arch, precision, cache.get(), &decoder->weights);
}

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
    for (Linear* linear : layer.Linears()) visit(*linear);
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

// One part of `rows` MXFP4 rows of `columns` from OCP MX blocks and scales (Mxfp4FromOcpBlocks),
// rows `step` apart from `first` of the tensors' rows: in ggml's layout, repacked, or (where the
// products read the file's layout) kept in the part's own buffer.
void AddMxfp4Rows(const uint8_t* codes, const uint8_t* scales, int64_t first, int64_t step,
                  int64_t rows, int64_t columns, Linear* result) {
  constexpr auto kType = static_cast<uint32_t>(GgmlType::kMXFP4);
  const int64_t blocks = columns / 32;
  at::Tensor ggml = at::empty({rows * QuantRowBytes(kType, columns)}, at::kByte);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = first + r * step;
    Mxfp4FromOcpBlocks(codes + row * blocks * 16, scales + row * blocks, blocks,
                       ggml.data_ptr<uint8_t>() + r * blocks * 17);
  }
  result->AddBlocks(ggml.data_ptr<uint8_t>(), kType, rows, columns);
  Linear::Part& part = result->parts.back();
  if (!part.repacked) part.weight = std::move(ggml);
}

// The released gpt-oss checkpoints' experts (quantization_config mxfp4): `gate_up`_blocks and
// _scales and `down`'s, OCP MX blocks along each row's inputs, as MXFP4 parts of each expert's
// Linears (gate's rows, then up's, as the GGUF files hold them).
Status Mxfp4Experts(const SafetensorsFile& file, const std::string& gate_up,
                    const std::string& down, const ModelArchitecture& a, Layer* layer) {
  const int64_t experts = a.experts, width = a.expert_intermediate_size, hidden = a.hidden_size;
  if (hidden % 32 != 0 || width % 32 != 0) {
    return Status::InvalidArgument(fmt::format(
        "{}: MXFP4 experts need hidden_size ({}) and intermediate_size ({}) in blocks of 32",
        file.path(), hidden, width));
  }
  // gate_up: [experts, 2 I rows (gate's and up's interleaved), hidden / 32 blocks]; down:
  // [experts, hidden rows, I / 32 blocks].
  const uint8_t* data[2][2];  // [gate_up, down][codes, scales]
  for (int t = 0; t < 2; ++t) {
    const int64_t rows = t == 0 ? 2 * width : hidden, columns = t == 0 ? hidden : width;
    for (int s = 0; s < 2; ++s) {
      const std::string name = (t == 0 ? gate_up : down) + (s == 0 ? "_blocks" : "_scales");
      std::vector<int64_t> shape = {experts, rows, columns / 32};
      if (s == 0) shape.push_back(16);
      const SafetensorsEntry* entry = file.Find(name);
      if (entry == nullptr) {
        return Status::InvalidArgument(
            fmt::format("{}: tensor '{}' is missing", file.path(), name));
      }
      if (entry->dtype != "U8" || entry->shape != shape) {
        return Status::InvalidArgument(fmt::format(
            "{}: tensor '{}' is {} [{}]; MXFP4 {} are U8 [{}]", file.path(), name, entry->dtype,
            fmt::join(entry->shape, ", "), s == 0 ? "blocks" : "scales", fmt::join(shape, ", ")));
      }
      data[t][s] = static_cast<const uint8_t*>(entry->data);
    }
  }
  layer->experts.resize(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    Layer::Expert& expert = layer->experts[static_cast<size_t>(e)];
    const int64_t gate_up_rows = e * 2 * width, down_rows = e * hidden;
    expert.gate_up = Linear();
    AddMxfp4Rows(data[0][0], data[0][1], gate_up_rows, 2, width, hidden, &expert.gate_up);
    AddMxfp4Rows(data[0][0], data[0][1], gate_up_rows + 1, 2, width, hidden, &expert.gate_up);
    expert.down = Linear();
    AddMxfp4Rows(data[1][0], data[1][1], down_rows, 1, hidden, width, &expert.down);
  }
  return Status::Ok();
}

template <class L, class Self>
std::vector<L*> LinearsOf(Self& layer) {
  std::vector<L*> all = {&layer.qkv, &layer.out};
  if (layer.experts.empty()) all.insert(all.end(), {&layer.gate_up, &layer.down});
  for (auto& expert : layer.experts) all.insert(all.end(), {&expert.gate_up, &expert.down});
  return all;
}

}  // namespace

std::vector<Linear*> Layer::Linears() { return LinearsOf<Linear>(*this); }
std::vector<const Linear*> Layer::Linears() const { return LinearsOf<const Linear>(*this); }

Status LoadSafetensorsWeights(const SafetensorsFile& file, const ModelArchitecture& arch,
                              LlmPrecision precision, Weights* out) {
  const ModelArchitecture& a = arch;
  const Family* family = FamilyByName(a.name);
  if (family == nullptr) {
    return Status::InvalidArgument(fmt::format("no model family '{}'", a.name));
  }
  const TensorNames& names = family->hf;
  // A multimodal checkpoint keeps its decoder under another prefix than "model.".
  std::string prefix = "model.", head_prefix;
  for (const auto& [decoder, head] : {std::pair<std::string, std::string>{"model.", ""},
                                      {"model.language_model.", ""},
                                      {"language_model.model.", "language_model."}}) {
    if (file.Find(decoder + names.embedding.substr(6)) != nullptr) {
      prefix = decoder;
      head_prefix = head;
      break;
    }
  }
  auto name_of = [&](const std::string& pattern, int layer) {
    std::string name = layer < 0 ? pattern : fmt::format(fmt::runtime(pattern), layer);
    if (name.starts_with("model.")) return prefix + name.substr(6);
    return head_prefix + name;
  };
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
  // Norms in fp32; Gemma's stored w of (1 + w), as GGUF stores them.
  auto norm = [&](const std::string& pattern, int layer, int64_t size) -> Result<at::Tensor> {
    auto w = get(name_of(pattern, layer), {size});
    if (!w.ok()) return w.status();
    out->bytes += w->numel() * at::elementSize(at::kFloat);
    return (family->hf_norms_offset ? *w + 1 : *w).contiguous();
  };
  const int64_t hidden = a.hidden_size, inter = a.intermediate_size, d = a.head_dim,
                q_rows = int64_t{a.heads} * d, kv_rows = int64_t{a.kv_heads} * d;
  auto embedding = get(name_of(names.embedding, -1), {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  out->embedding = embedding->to(out->dtype).contiguous();
  for (int i = 0; i < a.layers; ++i) {
    std::vector<Result<at::Tensor>> qkv, gate_up;
    if (!names.qkv.empty()) {
      qkv.push_back(get(name_of(names.qkv, i), {q_rows + 2 * kv_rows, hidden}));
    } else {
      qkv.push_back(get(name_of(names.q, i), {q_rows, hidden}));
      qkv.push_back(get(name_of(names.k, i), {kv_rows, hidden}));
      qkv.push_back(get(name_of(names.v, i), {kv_rows, hidden}));
    }
    // gate_up and down: the dense feed-forward's (a mixture of experts has its own, below).
    std::vector<Result<at::Tensor>> down;
    const bool moe = a.experts > 0;
    if (moe) {
      // One tensor an expert: below.
    } else if (!names.gate_up.empty()) {
      gate_up.push_back(get(name_of(names.gate_up, i), {2 * inter, hidden}));
    } else {
      gate_up.push_back(get(name_of(names.gate, i), {inter, hidden}));
      gate_up.push_back(get(name_of(names.up, i), {inter, hidden}));
    }
    if (!moe) down.push_back(get(name_of(names.down, i), {hidden, inter}));
    auto o = get(name_of(names.o, i), {hidden, q_rows});
    auto attn_norm = norm(names.attn_norm, i, hidden);
    auto ffn_norm = norm(names.ffn_norm, i, hidden);
    std::vector<at::Tensor> qkv_parts, gate_up_parts, down_parts;
    for (auto [list, parts] : {std::pair{&qkv, &qkv_parts}, std::pair{&gate_up, &gate_up_parts},
                               std::pair{&down, &down_parts}}) {
      for (auto& t : *list) {
        if (!t.ok()) return t.status();
        parts->push_back(*t);
      }
    }
    for (const auto* t : {&o, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear(qkv_parts);
    layer.out = linear({*o});
    if (moe) {
      // The router in fp32; each expert's gate and up stacked, and its down.
      const int64_t width = a.expert_intermediate_size;
      auto router = get(name_of(names.router, i), {a.experts, hidden});
      if (!router.ok()) return router.status();
      layer.router = router->to(at::kFloat).contiguous();
      out->bytes += layer.router.nbytes();
      layer.experts.resize(static_cast<size_t>(a.experts));
      if (a.expert_biases) {
        auto bias = get(name_of(names.router_bias, i), {a.experts});
        if (!bias.ok()) return bias.status();
        layer.router_bias = bias->contiguous();
        out->bytes += layer.router_bias.nbytes();
      }
      if (!names.expert_gate_up.empty()) {
        // All experts in two tensors as x W multiplies them (gpt-oss's): [experts, hidden, 2 I]
        // with the gate's and up's columns interleaved, and [experts, I, hidden]. Rows [2 I, ...]
        // as gate then up:
        auto split_gate_up = [&](const at::Tensor& rows) {
          return std::vector<at::Tensor>{rows.slice(0, 0, 2 * width, 2),
                                         rows.slice(0, 1, 2 * width, 2)};
        };
        // The released checkpoints' experts are MXFP4 (quantization_config mxfp4): blocks and
        // scales, read as MXFP4 parts (Mxfp4Experts).
        const bool mxfp4 = file.Find(name_of(names.expert_gate_up, i) + "_blocks") != nullptr;
        Result<at::Tensor> gate_up_all = at::Tensor(), down_all = at::Tensor();
        if (!mxfp4) {
          gate_up_all = get(name_of(names.expert_gate_up, i), {a.experts, hidden, 2 * width});
          down_all = get(name_of(names.expert_down, i), {a.experts, width, hidden});
        }
        if (!gate_up_all.ok()) return gate_up_all.status();
        if (!down_all.ok()) return down_all.status();
        Result<at::Tensor> gate_up_bias = at::Tensor(), down_bias = at::Tensor();
        if (a.expert_biases) {
          gate_up_bias = get(name_of(names.expert_gate_up_bias, i), {a.experts, 2 * width});
          down_bias = get(name_of(names.expert_down_bias, i), {a.experts, hidden});
          if (!gate_up_bias.ok()) return gate_up_bias.status();
          if (!down_bias.ok()) return down_bias.status();
        }
        if (mxfp4) {
          SLUICE_RETURN_IF_ERROR(Mxfp4Experts(file, name_of(names.expert_gate_up, i),
                                              name_of(names.expert_down, i), a, &layer));
          for (const Layer::Expert& expert : layer.experts) {
            out->bytes += expert.gate_up.bytes() + expert.down.bytes();
          }
        }
        for (int e = 0; e < a.experts; ++e) {
          Layer::Expert& expert = layer.experts[static_cast<size_t>(e)];
          if (!mxfp4) {
            expert.gate_up = linear(split_gate_up((*gate_up_all)[e].t()));
            expert.down = linear({(*down_all)[e].t().contiguous()});
          }
          if (a.expert_biases) {
            expert.gate_up.bias = at::cat(split_gate_up((*gate_up_bias)[e]));
            expert.down.bias = (*down_bias)[e].contiguous();
            out->bytes += expert.gate_up.bias.nbytes() + expert.down.bias.nbytes();
          }
        }
      } else {
        for (int e = 0; e < a.experts; ++e) {
          auto expert_name = [&](const std::string& pattern) {
            return fmt::format(fmt::runtime(pattern), i, e);
          };
          auto gate = get(expert_name(names.expert_gate), {width, hidden});
          auto up = get(expert_name(names.expert_up), {width, hidden});
          auto expert_down = get(expert_name(names.expert_down), {hidden, width});
          for (const auto* t : {&gate, &up, &expert_down}) {
            if (!t->ok()) return t->status();
          }
          Layer::Expert& expert = layer.experts[static_cast<size_t>(e)];
          expert.gate_up = linear({*gate, *up});
          expert.down = linear({*expert_down});
        }
      }
    } else {
      layer.gate_up = linear(gate_up_parts);
      layer.down = linear(down_parts);
    }
    layer.attn_norm = *attn_norm;
    layer.ffn_norm = *ffn_norm;
    if (a.attention_bias) {
      auto qb = get(name_of(names.q_bias, i), {q_rows});
      auto kb = get(name_of(names.k_bias, i), {kv_rows});
      auto vb = get(name_of(names.v_bias, i), {kv_rows});
      for (const auto* t : {&qb, &kb, &vb}) {
        if (!t->ok()) return t->status();
      }
      layer.qkv.bias = at::cat({*qb, *kb, *vb}, 0);
      out->bytes += layer.qkv.bias.nbytes();
    }
    if (a.attention_out_bias) {
      auto ob = get(name_of(names.o_bias, i), {hidden});
      if (!ob.ok()) return ob.status();
      layer.out.bias = ob->contiguous();
      out->bytes += layer.out.bias.nbytes();
    }
    if (a.attention_sinks) {
      auto sinks = get(name_of(names.sinks, i), {a.heads});
      if (!sinks.ok()) return sinks.status();
      layer.sinks = sinks->contiguous();
      out->bytes += layer.sinks.nbytes();
    }
    if (a.qk_norm) {
      auto qn = norm(names.q_norm, i, d);
      auto kn = norm(names.k_norm, i, d);
      if (!qn.ok()) return qn.status();
      if (!kn.ok()) return kn.status();
      layer.q_norm = *qn;
      layer.k_norm = *kn;
    }
    if (a.post_norms) {
      auto post_attn = norm(names.post_attn_norm, i, hidden);
      auto post_ffn = norm(names.post_ffn_norm, i, hidden);
      if (!post_attn.ok()) return post_attn.status();
      if (!post_ffn.ok()) return post_ffn.status();
      layer.post_attn_norm = *post_attn;
      layer.post_ffn_norm = *post_ffn;
    }
    out->layers.push_back(std::move(layer));
  }
  auto final_norm = norm(names.final_norm, -1, hidden);
  if (!final_norm.ok()) return final_norm.status();
  out->final_norm = *final_norm;
  const std::string head_name = name_of(names.output, -1);
  if (a.tie_word_embeddings && file.Find(head_name) == nullptr) {
    out->lm_head = linear({*embedding});
  } else {
    auto head = get(head_name, {a.vocab_size, hidden});
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
  // A part of quantised blocks, `source` its name in the weights cache: the cache's repacked copy
  // where it has one, else the file's blocks (repacked unless RepacksBlocks() is off).
  auto add_blocks = [&](Linear* result, const void* data, uint32_t type, int64_t rows,
                        int64_t columns, const std::string& source) {
    const uint8_t* cached =
        cache == nullptr ? nullptr
                         : cache->Find(source, type, rows, rows * QuantRowBytes(type, columns));
    if (cached != nullptr) {
      result->AddBlocks(nullptr, type, rows, columns, /*repack=*/false);
      Linear::UseRepacked(&result->parts.back(), cached, cache->owner(), columns);
    } else {
      result->AddBlocks(data, type, rows, columns);
    }
    result->parts.back().source = source;
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
        add_blocks(&result, tensor->data, tensor->type, tensor->shape[0], tensor->shape[1],
                   tensor->name);
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
  const Family* family = FamilyByName(a.name);
  if (family == nullptr) {
    return Status::InvalidArgument(fmt::format("no model family '{}'", a.name));
  }
  const TensorNames& names = family->gguf;
  auto name_of = [](const std::string& pattern, int layer) {
    return fmt::format(fmt::runtime(pattern), layer);
  };
  // A mixture of experts' layer: the router in fp32, and each expert a Linear of its slices of
  // the 3-D tensors (gate and up as two parts), quantised slices read where the file is mapped
  // or repacked (and cached under "<tensor>/<expert>"), float ones converted.
  auto experts = [&](int layer_index, Layer* layer) -> Status {
    const int64_t count = a.experts, width = a.expert_intermediate_size;
    auto router = find(name_of(names.router, layer_index), {count, hidden});
    auto gate = find(name_of(names.expert_gate, layer_index), {count, width, hidden});
    auto up = find(name_of(names.expert_up, layer_index), {count, width, hidden});
    auto down = find(name_of(names.expert_down, layer_index), {count, hidden, width});
    for (const auto* t : {&router, &gate, &up, &down}) {
      if (!t->ok()) return t->status();
    }
    layer->router = floats(**router).contiguous();
    out->bytes += layer->router.nbytes();
    // gpt-oss's biases: the router's, and each expert's rows of [experts, rows] tensors.
    std::vector<at::Tensor> biases;
    if (a.expert_biases) {
      auto router_bias = find(name_of(names.router_bias, layer_index), {count});
      if (!router_bias.ok()) return router_bias.status();
      layer->router_bias = floats(**router_bias);
      out->bytes += layer->router_bias.nbytes();
      for (auto [pattern, rows] :
           {std::pair{&names.expert_gate_bias, width}, std::pair{&names.expert_up_bias, width},
            std::pair{&names.expert_down_bias, hidden}}) {
        auto bias = find(name_of(*pattern, layer_index), {count, rows});
        if (!bias.ok()) return bias.status();
        biases.push_back(floats(**bias));
      }
    }
    auto add = [&](Linear* result, const GgufTensor& tensor, int64_t e) {
      const int64_t rows = tensor.shape[1], columns = tensor.shape[2];
      const size_t stride = tensor.bytes / static_cast<size_t>(count);
      const auto* data = static_cast<const uint8_t*>(tensor.data) + stride * e;
      if (!IsQuantType(tensor.type)) {
        at::Tensor values = at::empty({rows, columns}, at::kFloat);
        DequantizeRow(tensor.type, data, rows * columns, values.data_ptr<float>());
        result->Add(values, precision);
        return;
      }
      add_blocks(result, data, tensor.type, rows, columns, fmt::format("{}/{}", tensor.name, e));
    };
    layer->experts.resize(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e) {
      Layer::Expert& expert = layer->experts[static_cast<size_t>(e)];
      add(&expert.gate_up, **gate, e);
      add(&expert.gate_up, **up, e);
      add(&expert.down, **down, e);
      if (!biases.empty()) {
        expert.gate_up.bias = at::cat({biases[0][e], biases[1][e]});
        expert.down.bias = biases[2][e].contiguous();
      }
      out->bytes += expert.gate_up.bytes() + expert.down.bytes();
    }
    return Status::Ok();
  };
  auto embedding = find(names.embedding, {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  if (IsQuantType((*embedding)->type)) {
    out->embedding_blocks = (*embedding)->data;
    out->embedding_type = (*embedding)->type;
  } else {
    out->embedding = floats(**embedding).to(out->dtype).contiguous();
  }
  for (int i = 0; i < a.layers; ++i) {
    // gate_up and down: the dense feed-forward's (a mixture of experts has its own, below).
    std::vector<Result<const GgufTensor*>> qkv, gate_up, down;
    if (!names.qkv.empty()) {
      qkv.push_back(find(name_of(names.qkv, i), {q_rows + 2 * kv_rows, hidden}));
    } else {
      qkv.push_back(find(name_of(names.q, i), {q_rows, hidden}));
      qkv.push_back(find(name_of(names.k, i), {kv_rows, hidden}));
      qkv.push_back(find(name_of(names.v, i), {kv_rows, hidden}));
    }
    const bool moe = a.experts > 0;
    if (moe) {
      // The experts' 3-D tensors, [experts, rows, columns]: one Linear an expert (below).
    } else if (!names.gate_up.empty()) {
      gate_up.push_back(find(name_of(names.gate_up, i), {2 * inter, hidden}));
    } else {
      gate_up.push_back(find(name_of(names.gate, i), {inter, hidden}));
      gate_up.push_back(find(name_of(names.up, i), {inter, hidden}));
    }
    if (!moe) down.push_back(find(name_of(names.down, i), {hidden, inter}));
    auto o = find(name_of(names.o, i), {hidden, q_rows});
    auto attn_norm = find(name_of(names.attn_norm, i), {hidden});
    auto ffn_norm = find(name_of(names.ffn_norm, i), {hidden});
    std::vector<const GgufTensor*> qkv_tensors, gate_up_tensors, down_tensors;
    for (auto [list, tensors] :
         {std::pair{&qkv, &qkv_tensors}, std::pair{&gate_up, &gate_up_tensors},
          std::pair{&down, &down_tensors}}) {
      for (const auto& t : *list) {
        if (!t.ok()) return t.status();
        tensors->push_back(*t);
      }
    }
    for (const auto* t : {&o, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear(qkv_tensors);
    layer.out = linear({*o});
    if (moe) {
      if (Status status = experts(i, &layer); !status.ok()) return status;
    } else {
      layer.gate_up = linear(gate_up_tensors);
      layer.down = linear(down_tensors);
    }
    layer.attn_norm = norm(**attn_norm);
    layer.ffn_norm = norm(**ffn_norm);
    if (a.attention_bias) {
      auto qb = find(name_of(names.q_bias, i), {q_rows});
      auto kb = find(name_of(names.k_bias, i), {kv_rows});
      auto vb = find(name_of(names.v_bias, i), {kv_rows});
      for (const auto* t : {&qb, &kb, &vb}) {
        if (!t->ok()) return t->status();
      }
      layer.qkv.bias = at::cat({floats(**qb), floats(**kb), floats(**vb)}, 0);
      out->bytes += layer.qkv.bias.nbytes();
    }
    if (a.attention_out_bias) {
      auto ob = find(name_of(names.o_bias, i), {hidden});
      if (!ob.ok()) return ob.status();
      layer.out.bias = floats(**ob);
      out->bytes += layer.out.bias.nbytes();
    }
    if (a.attention_sinks) {
      auto sinks = find(name_of(names.sinks, i), {a.heads});
      if (!sinks.ok()) return sinks.status();
      layer.sinks = norm(**sinks);
    }
    if (a.qk_norm) {
      auto qn = find(name_of(names.q_norm, i), {d});
      auto kn = find(name_of(names.k_norm, i), {d});
      if (!qn.ok()) return qn.status();
      if (!kn.ok()) return kn.status();
      layer.q_norm = norm(**qn);
      layer.k_norm = norm(**kn);
    }
    if (a.post_norms) {
      auto post_attn = find(name_of(names.post_attn_norm, i), {hidden});
      auto post_ffn = find(name_of(names.post_ffn_norm, i), {hidden});
      if (!post_attn.ok()) return post_attn.status();
      if (!post_ffn.ok()) return post_ffn.status();
      layer.post_attn_norm = norm(**post_attn);
      layer.post_ffn_norm = norm(**post_ffn);
    }
    out->layers.push_back(std::move(layer));
  }
  auto final_norm = find(names.final_norm, {hidden});
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
    auto head = find(names.output, {a.vocab_size, hidden});
    if (!head.ok()) return head.status();
    out->lm_head = linear({*head});
  }
  if (cache != nullptr) UseWeightsCache(file.path(), cache, out);
  return Status::Ok();
}

}  // namespace sluice::llm::llama
