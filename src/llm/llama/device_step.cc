#include "llm/llama/device_step.h"

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "backends/vector_math.h"
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"
#include "llm/step_batch.h"

namespace sluice::llm::llama {
namespace {

// A linear layer's weights as one fp32 matrix [out, in] (into `w` where given: a stacked
// expert's slice): float parts as they are, GGUF blocks dequantised row by row (from the repacked
// layout where they were repacked).
at::Tensor DenseWeight(const Linear& linear, at::Tensor w = {}) {
  if (!w.defined()) w = at::empty({linear.out, linear.in}, at::kFloat);
  for (const Linear::Part& part : linear.parts) {
    at::Tensor rows = w.narrow(0, part.first, part.rows);
    if (part.blocks == nullptr) {
      rows.copy_(part.weight.to(at::kFloat));
      continue;
    }
    float* out = rows.data_ptr<float>();
    const int64_t row_bytes = QuantRowBytes(part.type, linear.in);
    for (int64_t r = 0; r < part.rows; ++r) {
      if (part.repacked) {
        DequantizeRepackedRow(part.type, part.blocks, linear.in, r, out + r * linear.in);
      } else {
        DequantizeRow(part.type, static_cast<const uint8_t*>(part.blocks) + r * row_bytes,
                      linear.in, out + r * linear.in);
      }
    }
  }
  return w;
}

// Why `arch` and `serve` cannot run on this executor; empty when they can.
std::string Unsupported(const ModelArchitecture& arch, const LlmServeConfig& serve) {
  if (!serve.kv_cache_disk.empty()) {
    return "llm.kv_cache_disk (the prefix cache's disk tier) is the CPU decoder's; not on a device "
           "yet";
  }
  if (serve.kv_cache_dtype == KvCacheDtype::kQ8_0) {
    return "kv_cache_dtype q8_0 is a CPU cache; on a device the cache holds the weights' dtype";
  }
  return "";
}

}  // namespace

Int4Packed PackInt4(const at::Tensor& dense, const at::Device& device, at::ScalarType scale_type) {
  Int4Packed result;
  const int64_t in = dense.size(-1), out = dense.size(-2);
  result.out = out;
  result.group = in % 128 == 0 ? 128 : in % 64 == 0 ? 64 : in % 32 == 0 ? 32 : 0;
  if (result.group == 0) return result;
  const int64_t padded = (out + 15) / 16 * 16;
  const at::Tensor matrices = dense.reshape({-1, out, in});
  std::vector<at::Tensor> packs, scales;
  for (int64_t m = 0; m < matrices.size(0); ++m) {
    // Zero rows pad the outputs to the packings' tile of 16 (their products are dropped).
    at::Tensor w = at::zeros({padded, in}, at::kFloat);
    w.narrow(0, 0, out).copy_(matrices.select(0, m));
    w = w.view({padded, in / result.group, result.group});
    const at::Tensor low = w.amin(-1), scale = ((w.amax(-1) - low) / 15.0).clamp_min(1e-10);
    // q = round((w - min) / scale) in [0, 15]; (q - 8) scale + (min + 8 scale) is w to scale / 2.
    const at::Tensor q = w.sub_(low.unsqueeze(-1))
                             .div_(scale.unsqueeze(-1))
                             .round_()
                             .clamp_(0, 15)
                             .to(at::kInt)
                             .view({padded, in});
    scales.push_back(
        at::stack({scale, low + 8.0 * scale}, -1).transpose(0, 1).to(device, scale_type));
    if (device.is_cuda()) {
      // The CUDA packing takes two inputs a byte, the even one in the high half, and tiles
      // inputs by 16 x (2, 4 or 8): a group's worth.
      const at::Tensor pairs = q.view({padded, in / 2, 2});
      const at::Tensor bytes = (pairs.select(-1, 0) * 16 + pairs.select(-1, 1)).to(at::kByte);
      packs.push_back(at::_convert_weight_to_int4pack(bytes.to(device), result.group / 16));
    } else {
      packs.push_back(at::_convert_weight_to_int4pack_for_cpu(q, 1).to(device));
    }
  }
  result.packed = dense.dim() == 2 ? packs[0] : at::stack(packs);
  result.scales = dense.dim() == 2 ? scales[0].contiguous() : at::stack(scales);
  return result;
}

at::Tensor Int4Product(const at::Tensor& x, const Int4Packed& w, const at::Device& device) {
  const at::Tensor y =
      device.is_cuda()
          ? at::_weight_int4pack_mm(x.to(at::kBFloat16).contiguous(), w.packed, w.group, w.scales)
          : at::_weight_int4pack_mm_for_cpu(x.to(at::kFloat).contiguous(), w.packed, w.group,
                                            w.scales);
  return y.narrow(1, 0, w.out).to(at::kFloat);
}

DeviceStepModel::AttentionBatch DeviceStepModel::Batch(
    const StepBatch& step, const std::vector<int64_t>& sequences) const {
  // Sequence c's query j at [c, j], its key m (its position m) at [c, m]; a padded query is token
  // 0 at position 0 (its answer dropped), a padded key cache row 0, masked out.
  AttentionBatch b;
  b.sequences = static_cast<int64_t>(sequences.size());
  for (int64_t c : sequences) {
    b.queries = std::max<int64_t>(b.queries, step.qo_indptr[c + 1] - step.qo_indptr[c]);
    b.keys = std::max(b.keys, step.kv_lengths[static_cast<size_t>(c)]);
  }
  const int64_t block = serve_.kv_block_size;
  std::vector<int64_t> query_rows(b.sequences * b.queries, 0), positions(query_rows.size(), 0);
  std::vector<int64_t> key_rows(b.sequences * b.keys, 0), tokens, slots;
  for (int64_t i = 0; i < b.sequences; ++i) {
    const auto c = static_cast<size_t>(sequences[static_cast<size_t>(i)]);
    const int64_t first = step.qo_indptr[c], n = step.qo_indptr[c + 1] - first;
    for (int64_t j = 0; j < n; ++j) {
      query_rows[i * b.queries + j] = first + j;
      positions[i * b.queries + j] = step.positions[static_cast<size_t>(first + j)];
      tokens.push_back(first + j);
      slots.push_back(i * b.queries + j);
    }
    const std::vector<int32_t>& table = step.tables[c];
    for (int64_t m = 0; m < step.kv_lengths[c]; ++m) {
      key_rows[i * b.keys + m] = KeyRow(table, m, block);
    }
  }
  const at::Device dev = device_.device;
  const auto on = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(dev); };
  b.query_rows = on(query_rows);
  b.key_rows = on(key_rows);
  b.tokens = on(tokens);
  b.slots = on(slots);
  Mask(on(positions).view({b.sequences, 1, 1, b.queries, 1}),
       at::arange(b.keys, at::TensorOptions().dtype(at::kLong).device(dev)), &b);
  return b;
}

void DeviceStepModel::Mask(const at::Tensor& q_pos, const at::Tensor& keys,
                           AttentionBatch* b) const {
  // Which keys each query sees: its own position and those before; on sliding-window layers,
  // the last `sliding_window` of them.
  const at::Tensor k_pos = keys.view({1, 1, 1, 1, -1});
  b->causal = k_pos <= q_pos;
  b->windowed = arch_.sliding_window > 0
                    ? b->causal.logical_and(k_pos > q_pos - arch_.sliding_window)
                    : b->causal;
}

Result<std::unique_ptr<StepModel>> DeviceStepModel::Load(const ModelLoadOptions& options,
                                                         const DeviceOptions& device) {
  ResolveVectorMath();
  std::unique_ptr<DeviceStepModel> model(new DeviceStepModel());
  Decoder decoder;
  auto arch = ReadArchitecture(options.dir, &decoder.gguf);
  if (!arch.ok()) return arch.status();
  decoder.arch = *arch;
  const ModelArchitecture& a = decoder.arch;
  if (std::string why = Unsupported(a, options.serve); !why.empty()) {
    return Status::InvalidArgument(fmt::format("{}: {}", options.dir, why));
  }
  if (options.serve.context_length > a.max_position_embeddings) {
    return Status::InvalidArgument(
        fmt::format("{}: context_length {} exceeds the model's max_position_embeddings {}",
                    options.dir, options.serve.context_length, a.max_position_embeddings));
  }
  if (device.int4_weights &&
      (device.int8_weights || (!device.device.is_cuda() && !device.device.is_cpu()))) {
    return Status::InvalidArgument(
        fmt::format("{}: int4 weights are packed for CUDA or the CPU, alone (asked: {}{})",
                    options.dir, device.device.str(), device.int8_weights ? " with int8" : ""));
  }
  model->arch_ = a;
  model->serve_ = options.serve;
  model->device_ = device;
  model->graphs_off_ = device.graphs_off;
  try {
    // fp32 parts (and the file's blocks), made dense below: what the device multiplies.
    SLUICE_RETURN_IF_ERROR(LoadDecoderWeights(options.dir, LlmPrecision::kFp32, "", &decoder));
    c10::InferenceMode guard;
    const Weights& w = decoder.weights;
    std::set<std::string> formats;
    const auto on_device = [&](const at::Tensor& t, at::ScalarType type) {
      return t.defined() ? t.to(device.device, type).contiguous() : at::Tensor();
    };
    // `dense` ([out, in] or stacked experts' [experts, out, in], fp32) on the device.
    const auto to_matrix = [&](const at::Tensor& dense) {
      Matrix m;
      if (device.int4_weights) {
        // The CUDA kernel multiplies bf16 activations by bf16 scales; the CPU's, fp32 by fp32.
        const Int4Packed packed =
            PackInt4(dense, device.device, device.device.is_cuda() ? at::kBFloat16 : at::kFloat);
        if (packed.group > 0) {
          m.weight = packed.packed;
          m.scales = packed.scales;
          m.group = packed.group;
          m.out = dense.size(-2);
          model->weight_bytes_ += static_cast<int64_t>(m.weight.nbytes() + m.scales.nbytes());
          return m;
        }
        ++model->int4_dense_;  // Its rows' length is not a multiple of 32: it stays in dtype.
        m.weight = on_device(dense, device.dtype);
      } else if (device.int8_weights) {
        // Per row: scale = max |w| / 127, q = round(w / scale) (the CPU decoder's int8).
        const at::Tensor scales = dense.abs().amax(-1).clamp_min(1e-8) / 127.0;
        // One fp32 temporary (a layer's stacked experts can be gigabytes).
        at::Tensor q = dense / scales.unsqueeze(-1);
        m.weight = on_device(q.round_().clamp_(-127, 127).to(at::kChar), at::kChar);
        m.scales = on_device(scales, at::kFloat);
        model->weight_bytes_ += static_cast<int64_t>(m.scales.nbytes());
      } else {
        m.weight = on_device(dense, device.dtype);
      }
      model->weight_bytes_ += static_cast<int64_t>(m.weight.nbytes());
      return m;
    };
    const auto dense = [&](const Linear& linear, at::Tensor into = {}) {
      for (const Linear::Part& part : linear.parts) {
        formats.insert(part.blocks != nullptr
                           ? std::string(GgmlTypeName(part.type))
                           : std::string(c10::toString(part.weight.scalar_type())));
      }
      return DenseWeight(linear, std::move(into));
    };
    const auto matrix = [&](const Linear& linear) { return to_matrix(dense(linear)); };
    for (const Layer& layer : w.layers) {
      DeviceLayer d;
      d.attn_norm = on_device(layer.attn_norm, at::kFloat);
      d.ffn_norm = on_device(layer.ffn_norm, at::kFloat);
      d.q_norm = on_device(layer.q_norm, at::kFloat);
      d.k_norm = on_device(layer.k_norm, at::kFloat);
      d.post_attn_norm = on_device(layer.post_attn_norm, at::kFloat);
      d.post_ffn_norm = on_device(layer.post_ffn_norm, at::kFloat);
      d.qkv = matrix(layer.qkv);
      d.qkv_bias = on_device(layer.qkv.bias, at::kFloat);
      d.out = matrix(layer.out);
      d.out_bias = on_device(layer.out.bias, at::kFloat);
      d.sinks = on_device(layer.sinks, at::kFloat);
      if (a.experts > 0) {
        d.router = on_device(layer.router, at::kFloat);
        d.router_bias = on_device(layer.router_bias, at::kFloat);
        // Each matrix's experts dequantised straight into their slice of one stack.
        const auto stacked = [&](const Linear Layer::Expert::*matrix) {
          const Linear& first = layer.experts.front().*matrix;
          at::Tensor stack =
              at::empty({static_cast<int64_t>(layer.experts.size()), first.out, first.in});
          for (size_t e = 0; e < layer.experts.size(); ++e) {
            dense(layer.experts[e].*matrix, stack.select(0, static_cast<int64_t>(e)));
          }
          return to_matrix(stack);
        };
        d.experts_gate_up = stacked(&Layer::Expert::gate_up);
        d.experts_down = stacked(&Layer::Expert::down);
        std::vector<at::Tensor> gate_up_bias, down_bias;
        for (const Layer::Expert& expert : layer.experts) {
          if (expert.gate_up.bias.defined()) gate_up_bias.push_back(expert.gate_up.bias);
          if (expert.down.bias.defined()) down_bias.push_back(expert.down.bias);
        }
        if (!gate_up_bias.empty()) {
          d.experts_gate_up_bias = on_device(at::stack(gate_up_bias), at::kFloat);
        }
        if (!down_bias.empty()) d.experts_down_bias = on_device(at::stack(down_bias), at::kFloat);
      } else {
        d.gate_up = matrix(layer.gate_up);
        d.down = matrix(layer.down);
      }
      model->layers_.push_back(std::move(d));
    }
    at::Tensor embedding = w.embedding;
    if (w.embedding_blocks != nullptr) {
      embedding = at::empty({a.vocab_size, a.hidden_size}, at::kFloat);
      float* rows = embedding.data_ptr<float>();
      const int64_t row_bytes = QuantRowBytes(w.embedding_type, a.hidden_size);
      for (int64_t t = 0; t < a.vocab_size; ++t) {
        if (w.embedding_repacked) {
          DequantizeRepackedRow(w.embedding_type, w.embedding_blocks, a.hidden_size, t,
                                rows + t * a.hidden_size);
        } else {
          DequantizeRow(w.embedding_type,
                        static_cast<const uint8_t*>(w.embedding_blocks) + t * row_bytes,
                        a.hidden_size, rows + t * a.hidden_size);
        }
      }
    }
    model->embedding_ = on_device(embedding, device.dtype);
    model->weight_bytes_ += static_cast<int64_t>(model->embedding_.nbytes());
    model->final_norm_ = on_device(w.final_norm, at::kFloat);
    model->lm_head_ = matrix(w.lm_head);
    for (const std::string& f : formats) {
      model->formats_ += (model->formats_.empty() ? "" : "+") + f;
    }
    RopeTables rope = BuildRopeTables(a, options.serve.context_length);
    model->rope_ = RopeTables{on_device(rope.cos, at::kFloat), on_device(rope.sin, at::kFloat),
                              on_device(rope.local_cos, at::kFloat),
                              on_device(rope.local_sin, at::kFloat), rope.long_row};
    const LlmServeConfig& serve = options.serve;
    const int64_t block = serve.kv_block_size;
    const int64_t per_slot = (serve.context_length + block - 1) / block;
    const int64_t block_bytes = int64_t{2} * a.layers * block * a.kv_heads * a.head_dim *
                                static_cast<int64_t>(c10::elementSize(device.dtype));
    const int64_t blocks =
        serve.kv_cache_bytes > 0 ? serve.kv_cache_bytes / block_bytes : serve.slots * per_slot;
    if (blocks < per_slot) {
      return Status::InvalidArgument(fmt::format(
          "{}: llm.kv_cache_bytes {} holds {} blocks of {} tokens ({} bytes each); one sequence of "
          "context_length {} needs {}",
          options.dir, serve.kv_cache_bytes, blocks, block, block_bytes, serve.context_length,
          per_slot));
    }
    model->blocks_ = static_cast<int>(blocks);
    model->kv_cache_bytes_ = blocks * block_bytes;
    const auto cache_options = at::TensorOptions().device(device.device).dtype(device.dtype);
    if (device.graphs != nullptr && (a.experts > 0 || serve.pooling != Pooling::kNone)) {
      // Their steps read counts back (experts) or want no logits: no graph can hold them.
      model->device_.graphs = nullptr;
      model->graphs_off_ = a.experts > 0 ? "a mixture of experts' steps run op by op"
                                         : "an embedding model's steps run op by op";
    }
    const bool graphed = model->device_.graphs != nullptr;
    // With graphs, one block more than the pool's: the rows padded sequences write.
    const int64_t rows = (blocks + (graphed ? 1 : 0)) * block;
    for (int l = 0; l < a.layers; ++l) {
      // Zeroed: a padded read of a row never written must not bring NaN into a masked product.
      model->cache_k_.push_back(at::zeros({rows, a.kv_heads, a.head_dim}, cache_options));
      model->cache_v_.push_back(at::zeros({rows, a.kv_heads, a.head_dim}, cache_options));
    }
    if (graphed) model->SetUpGraphs(blocks * block);
  } catch (const c10::Error& e) {
    return Status::Internal(fmt::format("{}: loading the model on {} failed: {}", options.dir,
                                        device.device.str(), e.what_without_backtrace()));
  }
  return std::unique_ptr<StepModel>(std::move(model));
}

std::string DeviceStepModel::weight_formats() const {
  if (device_.int4_weights) {
    return fmt::format(
        "{} as int4 (groups of up to 128, a scale and offset each{})", formats_,
        int4_dense_ > 0 ? fmt::format("; {} matrices {}", int4_dense_, c10::toString(device_.dtype))
                        : "");
  }
  return fmt::format(
      "{} as {}", formats_,
      device_.int8_weights ? "int8 (a scale per row)" : c10::toString(device_.dtype));
}

std::string DeviceStepModel::kernel_paths() const {
  std::string paths = "aten:" + device_.device.str();
  if (device_.graphs != nullptr || !graphs_off_.empty()) {
    paths += graphs_off_.empty() ? ", decode graphs" : ", decode graphs off (" + graphs_off_ + ")";
  }
  if (arch_.experts == 0) return paths;
  const bool grouped = !Quantised(layers_.front()) && grouped_experts_.load();
  return paths + (grouped ? ", experts grouped" : ", experts one at a time");
}

std::string DeviceStepModel::kv_cache_format() const {
  return std::string(c10::toString(device_.dtype));
}

at::Tensor DeviceStepModel::Product(const at::Tensor& x, const Matrix& w,
                                    const at::Tensor& bias) const {
  at::Tensor y;
  if (w.group > 0) {
    // The packed rows as they are, for any number of rows of x; the padding rows' outputs
    // dropped.
    y = Int4Product(x, {w.weight, w.scales, w.group, w.out}, device_.device);
  } else if (!w.scales.defined()) {
    y = at::matmul(x.to(device_.dtype), w.weight.t()).to(at::kFloat);
  } else if (x.size(0) <= device_.int8_packed_rows) {
    y = at::_weight_int8pack_mm(x.to(at::kFloat).contiguous(), w.weight, w.scales);
  } else {
    // int8 values are exact in bf16 and fp16: the rows' product in dtype, then each column's
    // scale.
    y = at::matmul(x.to(device_.dtype), w.weight.to(device_.dtype).t()).to(at::kFloat) * w.scales;
  }
  return bias.defined() ? y.add_(bias) : y;
}

// weight * x / sqrt(mean(x^2) + eps) over the last dimension, in fp32.
at::Tensor DeviceStepModel::Norm(const at::Tensor& x, const at::Tensor& weight) const {
  at::Tensor inverse = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + arch_.rms_norm_eps);
  return x * inverse * weight;
}

at::Tensor DeviceStepModel::Experts(const DeviceLayer& layer, const at::Tensor& x) const {
  const int64_t rows = x.size(0), used = arch_.experts_used;
  at::Tensor logits = at::matmul(x, layer.router.t());
  if (layer.router_bias.defined()) logits = logits + layer.router_bias;
  const at::Tensor probabilities = at::softmax(logits, -1);
  auto [weights, chosen] = probabilities.topk(used, -1);
  if (arch_.expert_weights_norm) weights = weights / weights.sum(-1, /*keepdim=*/true);
  // The (row, expert) pairs ordered by expert.
  const at::Tensor order = chosen.flatten().argsort(/*stable=*/true);
  const at::Tensor pair_rows =
      at::arange(rows, chosen.options()).repeat_interleave(used).index_select(0, order);
  const at::Tensor pair_experts = chosen.flatten().index_select(0, order);
  const at::Tensor pair_weights = weights.flatten().index_select(0, order).unsqueeze(1);
  const at::Tensor counts = at::bincount(chosen.flatten(), {}, arch_.experts);
  const at::Tensor in = x.index_select(0, pair_rows);
  // Each pair's expert's bias row added to y ([pairs, out]).
  const auto bias = [&](at::Tensor y, const at::Tensor& b) {
    return b.defined() ? y.add_(b.index_select(0, pair_experts)) : y;
  };
  at::Tensor down;
  if (!Quantised(layer) && grouped_experts_.load()) {
    try {
      const at::Tensor ends = counts.cumsum(0).to(at::kInt);
      const auto grouped = [&](const at::Tensor& a, const Matrix& w) {
        return at::_grouped_mm(a.to(device_.dtype), w.weight.transpose(1, 2), ends).to(at::kFloat);
      };
      const at::Tensor act =
          Gate(bias(grouped(in, layer.experts_gate_up), layer.experts_gate_up_bias));
      down = bias(grouped(act, layer.experts_down), layer.experts_down_bias);
    } catch (const c10::Error&) {
      grouped_experts_.store(false);  // Each expert's rows as one product from now on.
    }
  }
  if (!down.defined()) {
    const at::Tensor host_counts = counts.to(at::kCPU).contiguous();
    const int64_t* count = host_counts.data_ptr<int64_t>();
    down = at::empty({in.size(0), x.size(1)}, x.options());
    for (int64_t e = 0, first = 0; e < arch_.experts; first += count[e], ++e) {
      if (count[e] == 0) continue;
      const auto select = [&](const at::Tensor& b) { return b.defined() ? b.select(0, e) : b; };
      const at::Tensor act =
          Gate(Product(in.narrow(0, first, count[e]), layer.experts_gate_up.Select(e),
                       select(layer.experts_gate_up_bias)));
      down.narrow(0, first, count[e])
          .copy_(Product(act, layer.experts_down.Select(e), select(layer.experts_down_bias)));
    }
  }
  return at::zeros_like(x).index_add_(0, pair_rows, down * pair_weights);
}

void DeviceStepModel::ApplyLora(const std::vector<LoraRows>& groups, int layer, LoraProduct product,
                                const at::Tensor& in, at::Tensor& out) {
  for (const LoraRows& group : groups) {
    const auto& [a, b] = (*group.weights)[static_cast<size_t>(layer)][static_cast<size_t>(product)];
    if (!a.defined()) continue;
    out.index_add_(0, group.rows,
                   at::matmul(at::matmul(in.index_select(0, group.rows), a.t()), b.t()));
  }
}

at::Tensor DeviceStepModel::Gate(const at::Tensor& gate_up) const {
  const int64_t inter = gate_up.size(1) / 2;
  const at::Tensor gate = gate_up.narrow(1, 0, inter), up = gate_up.narrow(1, inter, inter);
  switch (arch_.activation) {
    case GateActivation::kGeluTanh:
      return at::gelu(gate, "tanh") * up;
    case GateActivation::kSwigluClamped: {
      // gpt-oss's: g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) g sigmoid(alpha g).
      const at::Tensor g = gate.clamp_max(arch_.swiglu_limit);
      const at::Tensor u = up.clamp(-arch_.swiglu_limit, arch_.swiglu_limit);
      return (u + 1) * g * at::sigmoid(g * arch_.swiglu_alpha);
    }
    case GateActivation::kSilu:
      break;
  }
  return at::silu(gate) * up;
}

at::Tensor DeviceStepModel::Rotate(const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin) const {
  const int64_t half = arch_.head_dim / 2;
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // Over the heads.
  if (arch_.rope_interleaved) {                                 // Pairs (2i, 2i + 1).
    at::Tensor pairs = x.unflatten(-1, {half, 2});
    at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    return at::stack({x1 * c - x2 * s, x2 * c + x1 * s}, -1).flatten(-2);
  }
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);  // Pairs (i, i + D/2).
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

Status DeviceStepModel::CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  if (copies.empty()) return Status::Ok();
  const int64_t block = serve_.kv_block_size;
  std::vector<int64_t> from, to;
  for (const auto& [source, target] : copies) {
    if (source < 0 || source >= blocks_ || target < 0 || target >= blocks_) {
      return Status::Internal(
          fmt::format("block copy {} -> {} outside [0, {})", source, target, blocks_));
    }
    for (int64_t r = 0; r < block; ++r) {
      from.push_back(source * block + r);
      to.push_back(target * block + r);
    }
  }
  try {
    c10::InferenceMode guard;
    const at::Tensor from_rows = at::tensor(from, at::kLong).to(device_.device);
    const at::Tensor to_rows = at::tensor(to, at::kLong).to(device_.device);
    for (size_t l = 0; l < cache_k_.size(); ++l) {
      cache_k_[l].index_copy_(0, to_rows, cache_k_[l].index_select(0, from_rows));
      cache_v_[l].index_copy_(0, to_rows, cache_v_[l].index_select(0, from_rows));
    }
  } catch (const c10::Error& e) {
    return Status::Internal(fmt::format("copying blocks failed: {}", e.what_without_backtrace()));
  }
  return Status::Ok();
}

at::Tensor DeviceStepModel::Forward(const StepTensors& in, const std::vector<LoraRows>& lora) {
  const ModelArchitecture& a = arch_;
  const int64_t t_count = in.tokens.size(0), hidden = a.hidden_size, d = a.head_dim,
                kv = a.kv_heads, groups = a.heads / a.kv_heads;
  const at::Tensor cos = rope_.cos.index_select(0, in.rope_rows);
  const at::Tensor sin = rope_.sin.index_select(0, in.rope_rows);
  at::Tensor local_cos, local_sin;
  if (rope_.local_cos.defined()) {
    local_cos = rope_.local_cos.index_select(0, in.positions);
    local_sin = rope_.local_sin.index_select(0, in.positions);
  }
  const double scale = a.attention_scale > 0 ? a.attention_scale : 1.0 / std::sqrt(double(d));
  at::Tensor x = embedding_.index_select(0, in.tokens).to(at::kFloat);
  if (a.scale_embedding) x = x * std::sqrt(static_cast<float>(hidden));
  for (int l = 0; l < a.layers; ++l) {
    const DeviceLayer& layer = layers_[static_cast<size_t>(l)];
    const at::Tensor normed = Norm(x, layer.attn_norm);
    at::Tensor qkv = Product(normed, layer.qkv, layer.qkv_bias);
    ApplyLora(lora, l, LoraProduct::kQkv, normed, qkv);
    at::Tensor q = qkv.narrow(1, 0, a.heads * d).view({t_count, a.heads, d});
    at::Tensor k = qkv.narrow(1, a.heads * d, kv * d).view({t_count, kv, d});
    const at::Tensor v = qkv.narrow(1, (a.heads + kv) * d, kv * d).view({t_count, kv, d});
    if (a.qk_norm) {
      q = Norm(q, layer.q_norm);
      k = Norm(k, layer.k_norm);
    }
    const bool local = IsLocal(l);
    const bool local_tables = local && local_cos.defined();
    q = Rotate(q, local_tables ? local_cos : cos, local_tables ? local_sin : sin);
    k = Rotate(k, local_tables ? local_cos : cos, local_tables ? local_sin : sin);
    at::Tensor& keys = cache_k_[static_cast<size_t>(l)];
    at::Tensor& values = cache_v_[static_cast<size_t>(l)];
    keys.index_copy_(0, in.cache_rows, k.to(device_.dtype));
    values.index_copy_(0, in.cache_rows, v.to(device_.dtype));
    at::Tensor heads = at::empty({t_count, a.heads * d}, x.options());
    for (const AttentionBatch& b : in.batches) {
      const at::Tensor kk =
          keys.index_select(0, b.key_rows).view({b.sequences, b.keys, kv, d}).to(at::kFloat);
      const at::Tensor vv =
          values.index_select(0, b.key_rows).view({b.sequences, b.keys, kv, d}).to(at::kFloat);
      const at::Tensor qq =
          q.index_select(0, b.query_rows).view({b.sequences, b.queries, kv, groups, d});
      at::Tensor scores = at::einsum("cnkgd,cmkd->ckgnm", {qq, kk}) * scale;
      scores.masked_fill_((local ? b.windowed : b.causal).logical_not(),
                          -std::numeric_limits<float>::infinity());
      at::Tensor probs;
      if (layer.sinks.defined()) {
        // gpt-oss's sinks: each head's learned logit joins its softmax's denominator and adds no
        // value.
        const at::Tensor sink =
            layer.sinks.view({1, kv, groups, 1, 1}).expand({b.sequences, kv, groups, b.queries, 1});
        probs = at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, b.keys);
      } else {
        probs = at::softmax(scores, -1);
      }
      heads.index_copy_(0, b.tokens,
                        at::einsum("ckgnm,cmkd->cnkgd", {probs, vv})
                            .reshape({b.sequences * b.queries, a.heads * d})
                            .index_select(0, b.slots));
    }
    at::Tensor attn = Product(heads, layer.out, layer.out_bias);
    ApplyLora(lora, l, LoraProduct::kO, heads, attn);
    if (a.post_norms) attn = Norm(attn, layer.post_attn_norm);
    x = x + attn;
    if (a.experts > 0) {
      at::Tensor experts = Experts(layer, Norm(x, layer.ffn_norm));
      if (a.post_norms) experts = Norm(experts, layer.post_ffn_norm);
      x = x + experts;
      continue;
    }
    const at::Tensor ffn_in = Norm(x, layer.ffn_norm);
    at::Tensor gate_up = Product(ffn_in, layer.gate_up, at::Tensor());
    ApplyLora(lora, l, LoraProduct::kGateUp, ffn_in, gate_up);
    const at::Tensor act = Gate(gate_up);
    at::Tensor down = Product(act, layer.down, at::Tensor());
    ApplyLora(lora, l, LoraProduct::kDown, act, down);
    if (a.post_norms) down = Norm(down, layer.post_ffn_norm);
    x = x + down;
  }
  const at::Tensor last = Norm(x.index_select(0, in.logit_rows), final_norm_);
  at::Tensor rows = serve_.pooling != Pooling::kNone ? last : Product(last, lm_head_, {});
  if (serve_.pooling == Pooling::kNone && a.final_logit_softcap > 0) {
    rows = at::tanh(rows / a.final_logit_softcap) * a.final_logit_softcap;
  }
  return rows;
}

Status DeviceStepModel::Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) {
  return RunPicking(chunks, logits, nullptr, nullptr);
}

Status DeviceStepModel::RunPicking(const std::vector<SequenceChunk>& chunks,
                                   std::vector<float>* logits, std::vector<int32_t>* picked,
                                   std::vector<TokenLogprobs>* logprobs) {
  if (chunks.empty()) return Status::Ok();
  const ModelArchitecture& a = arch_;
  auto assembled =
      AssembleStep(chunks, StepGeometry{.block_size = serve_.kv_block_size,
                                        .context_length = serve_.context_length,
                                        .blocks = blocks_,
                                        .vocab_size = a.vocab_size,
                                        .long_rope_row = rope_.long_row,
                                        .rope_original_context = a.rope_original_max_positions});
  if (!assembled.ok()) return assembled.status();
  const StepBatch& step = *assembled;
  try {
    c10::InferenceMode guard;
    const at::Device dev = device_.device;
    const auto on = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(dev); };
    // The step's attention in padded batches: its decoding sequences (one query each) together,
    // each prompt chunk alone (padding a decode to a prompt's length would multiply its work).
    std::vector<int64_t> decodes, prompts;
    for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
      (step.qo_indptr[c + 1] - step.qo_indptr[c] == 1 ? decodes : prompts).push_back(c);
    }
    // Each adapter the step's chunks name: its tokens, and its matrices on the device.
    std::vector<LoraRows> lora;
    {
      std::vector<std::pair<const LoraAdapter*, std::vector<int64_t>>> rows;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const LoraAdapter* adapter = chunks[i].lora;
        if (adapter == nullptr) continue;
        auto it = std::find_if(rows.begin(), rows.end(),
                               [adapter](const auto& entry) { return entry.first == adapter; });
        if (it == rows.end()) it = rows.insert(rows.end(), {adapter, {}});
        for (int64_t t = step.qo_indptr[i]; t < step.qo_indptr[i + 1]; ++t) it->second.push_back(t);
      }
      if (lora_weights_.size() + rows.size() > 16) lora_weights_.clear();
      for (auto& [adapter, indices] : rows) {
        auto& weights = lora_weights_[adapter->id];
        if (weights.empty()) {
          for (const auto& products : adapter->layers) {
            auto& mine = weights.emplace_back();
            for (int p = 0; p < kLoraProducts; ++p) {
              const LoraWeights& w = products[static_cast<size_t>(p)];
              if (w.empty()) continue;
              const auto in = static_cast<int64_t>(w.a.size()) / w.rank;
              const auto out = static_cast<int64_t>(w.b.size()) / w.rank;
              mine[static_cast<size_t>(p)] = {
                  at::tensor(w.a, at::kFloat).view({w.rank, in}).to(dev),
                  at::tensor(w.b, at::kFloat).view({out, w.rank}).to(dev)};
            }
          }
        }
        lora.push_back({adapter, on(indices), &weights});
      }
    }
    at::Tensor rows;
    if (lora.empty() && prompts.empty()) rows = Graphed(step);
    if (!rows.defined()) {
      StepTensors in;
      in.tokens = on(step.tokens);
      in.positions = on(step.positions);
      in.rope_rows = on(step.rope_rows);
      in.cache_rows = on(step.cache_rows);
      in.logit_rows = on(step.logit_rows);
      if (!decodes.empty()) in.batches.push_back(Batch(step, decodes));
      for (int64_t c : prompts) in.batches.push_back(Batch(step, {c}));
      rows = Forward(in, lora);
    }
    if (picked != nullptr && serve_.pooling == Pooling::kNone) {
      rows = Pick(chunks, rows, picked, logprobs);
    }
    rows = rows.to(at::kCPU).contiguous();
    const float* p = rows.data_ptr<float>();
    logits->insert(logits->end(), p, p + rows.numel());
  } catch (const c10::Error& e) {
    return Status::Internal(fmt::format("model step on {} failed: {}", device_.device.str(),
                                        e.what_without_backtrace()));
  }
  return Status::Ok();
}

}  // namespace sluice::llm::llama
