#include "llm/encoder/bert_model.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <thread>

#include "backends/vector_math.h"
#include "llm/files/gguf.h"
#include "llm/files/safetensors.h"
#include "llm/kernels/kernels.h"

namespace sluice::llm::encoder {

namespace {

// A tensor by name, as fp32, of the expected shape; errors name the file and the tensor.
using TensorSource =
    std::function<Result<at::Tensor>(const std::string& name, std::vector<int64_t> shape)>;

// A BERT name in another format's: "encoder.layer.N." becomes `layers` + "N.", and the first of
// `names` the rest starts with is replaced.
using Renames = std::vector<std::pair<std::string, std::string>>;
std::string Renamed(const std::string& bert, const std::string& layers, const Renames& names) {
  std::string name = bert, layer;
  if (name.starts_with("encoder.layer.")) {
    const size_t dot = name.find('.', 14);
    layer = layers + name.substr(14, dot - 14) + ".";
    name = name.substr(dot + 1);
  }
  for (const auto& [from, to] : names) {
    if (name.starts_with(from)) return layer + to + name.substr(from.size());
  }
  return layer + name;
}

// The error for a tensor of another shape than the model's.
Status WrongShape(const std::string& path, const std::string& name, const std::vector<int64_t>& got,
                  const std::vector<int64_t>& want) {
  return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", path,
                                             name, fmt::join(got, ", "), fmt::join(want, ", ")));
}

// nomic's names (as its repositories and transformers 5 write them) for the BERT names asked for.
std::string NomicName(const std::string& bert) {
  static const Renames kNames = {
      {"embeddings.LayerNorm.", "emb_ln."},
      {"attention.self.qkv.", "attn.Wqkv."},
      {"attention.output.dense.", "attn.out_proj."},
      {"attention.output.LayerNorm.", "norm1."},
      {"intermediate.dense.", "mlp.fc11."},
      {"intermediate.gate.", "mlp.fc12."},
      {"output.dense.", "mlp.fc2."},
      {"output.LayerNorm.", "norm2."},
  };
  return Renamed(bert, "encoder.layers.", kNames);
}

// DistilBERT's names (transformers' DistilBertModel) for the BERT names asked for.
std::string DistilBertName(const std::string& bert) {
  static const Renames kNames = {
      {"attention.self.query.", "attention.q_lin."},
      {"attention.self.key.", "attention.k_lin."},
      {"attention.self.value.", "attention.v_lin."},
      {"attention.output.dense.", "attention.out_lin."},
      {"attention.output.LayerNorm.", "sa_layer_norm."},
      {"intermediate.dense.", "ffn.lin1."},
      {"output.dense.", "ffn.lin2."},
      {"output.LayerNorm.", "output_layer_norm."},
  };
  return Renamed(bert, "transformer.layer.", kNames);
}

// The heads' tensors, which ...ForSequenceClassification keeps outside the base model's prefix.
bool IsHeadTensor(const std::string& name) {
  return name.starts_with("classifier.") || name.starts_with("pre_classifier.");
}

// BertModel saves "embeddings...."; BertForSequenceClassification "bert.embeddings....",
// (XLM)RobertaForSequenceClassification "roberta.embeddings....", DistilBERT's
// "distilbert.embeddings....".
constexpr const char* kBasePrefixes[] = {"bert.", "roberta.", "distilbert."};

TensorSource FromSafetensors(const SafetensorsFile& file, const EncoderConfig& config) {
  std::string prefix;
  for (const char* candidate : kBasePrefixes) {
    if (file.Find(std::string(candidate) + "embeddings.word_embeddings.weight") != nullptr) {
      prefix = candidate;
    }
  }
  const bool nomic = config.nomic, distilbert = config.distilbert;
  return [&file, prefix, nomic, distilbert](const std::string& name,
                                            std::vector<int64_t> shape) -> Result<at::Tensor> {
    const std::string full = nomic                ? NomicName(name)
                             : IsHeadTensor(name) ? name
                             : distilbert         ? prefix + DistilBertName(name)
                                                  : prefix + name;
    const SafetensorsEntry* entry = file.Find(full);
    if (entry == nullptr && full.ends_with("LayerNorm.weight")) {  // Older checkpoints.
      entry = file.Find(full.substr(0, full.size() - 6) + "gamma");
    } else if (entry == nullptr && full.ends_with("LayerNorm.bias")) {
      entry = file.Find(full.substr(0, full.size() - 4) + "beta");
    }
    if (entry == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is missing", file.path(), full));
    }
    if (entry->shape != shape) return WrongShape(file.path(), full, entry->shape, shape);
    at::ScalarType type = at::kFloat;
    if (entry->dtype == "BF16") {
      type = at::kBFloat16;
    } else if (entry->dtype == "F16") {
      type = at::kHalf;
    } else if (entry->dtype != "F32") {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' has dtype {}; F32, BF16 or F16 expected", file.path(), full,
                      entry->dtype));
    }
    at::Tensor view =
        at::from_blob(const_cast<void*>(entry->data), shape, at::TensorOptions().dtype(type));
    return view.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  };
}

// llama.cpp's converter's names for the Hugging Face ones this file asks for.
std::string GgufName(const std::string& hf) {
  static const Renames kNames = {
      {"embeddings.word_embeddings.weight", "token_embd.weight"},
      {"embeddings.position_embeddings.weight", "position_embd.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"},
      {"embeddings.LayerNorm.weight", "token_embd_norm.weight"},
      {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
      {"attention.self.qkv.", "attn_qkv."},
      {"intermediate.gate.", "ffn_gate."},
      {"attention.self.query.", "attn_q."},
      {"attention.self.key.", "attn_k."},
      {"attention.self.value.", "attn_v."},
      {"attention.output.dense.", "attn_output."},
      {"attention.output.LayerNorm.", "attn_output_norm."},
      {"intermediate.dense.", "ffn_up."},
      {"output.dense.", "ffn_down."},
      {"output.LayerNorm.", "layer_output_norm."},
      {"pooler.dense.", "cls."},
      {"classifier.", "cls.output."},
  };
  return Renamed(hf, "blk.", kNames);
}

TensorSource FromGguf(const GgufFile& file) {
  return [&file](const std::string& name, std::vector<int64_t> shape) -> Result<at::Tensor> {
    const std::string gguf = GgufName(name);
    const GgufTensor* tensor = file.FindTensor(gguf);
    if (tensor == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is missing", file.path(), gguf));
    }
    if (tensor->shape != shape) return WrongShape(file.path(), gguf, tensor->shape, shape);
    at::Tensor values = at::empty(shape, at::kFloat);
    DequantizeRow(tensor->type, tensor->data, tensor->elements(), values.data_ptr<float>());
    return values;
  };
}

bool Has(const SafetensorsFile* safetensors, const GgufFile* gguf, const std::string& name) {
  if (gguf != nullptr) return gguf->FindTensor(GgufName(name)) != nullptr;
  if (safetensors->Find(name) != nullptr) return true;
  for (const char* prefix : kBasePrefixes) {
    if (safetensors->Find(prefix + name) != nullptr) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<StepModel>> BertModel::Load(const ModelLoadOptions& options,
                                                   const EncoderConfig& config) {
  ResolveVectorMath();
  auto model = std::make_unique<BertModel>();
  model->config_ = config;
  model->serve_ = options.serve;
  model->precision_ = options.serve.precision;
  const ModelArchitecture& a = config.arch;
  if (model->serve_.context_length > a.max_position_embeddings) {
    return Status::InvalidArgument(
        fmt::format("{}: context_length {} exceeds the model's max_position_embeddings {}",
                    options.dir, model->serve_.context_length, a.max_position_embeddings));
  }
  auto gguf_path = FindGgufFile(options.dir);
  if (!gguf_path.ok()) return gguf_path.status();
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<SafetensorsFile> safetensors;
  if (!gguf_path->empty()) {
    auto opened = GgufFile::Open(*gguf_path);
    if (!opened.ok()) return opened.status();
    gguf = std::move(*opened);
  } else {
    auto opened = SafetensorsFile::OpenCheckpoint(options.dir);
    if (!opened.ok()) return opened.status();
    safetensors = std::move(*opened);
  }
  const TensorSource get =
      gguf != nullptr ? FromGguf(*gguf) : FromSafetensors(*safetensors, config);
  const bool biases = !config.nomic;
  const int64_t h = a.hidden_size, inter = a.intermediate_size;
  const llama::OneOmpThread one_thread;  // Loading runs on one thread (linear.h says why).
  try {
    c10::InferenceMode guard;
    auto tensor = [&](const std::string& name, std::vector<int64_t> shape,
                      at::Tensor* out) -> Status {
      auto value = get(name, std::move(shape));
      if (!value.ok()) return value.status();
      *out = std::move(*value);
      model->bytes_ += static_cast<int64_t>(out->nbytes());
      return Status::Ok();
    };
    auto linear = [&](const std::vector<std::string>& names, int64_t out, int64_t in,
                      llama::Linear* result) -> Status {
      std::vector<at::Tensor> weights, bias;
      for (const std::string& name : names) {
        auto w = get(name + ".weight", {out, in});
        if (!w.ok()) return w.status();
        weights.push_back(std::move(*w));
        if (!biases) continue;
        auto b = get(name + ".bias", {out});
        if (!b.ok()) return b.status();
        bias.push_back(std::move(*b));
      }
      result->Add(weights.size() == 1 ? weights[0] : at::cat(weights, 0), model->precision_);
      if (!bias.empty()) result->bias = bias.size() == 1 ? bias[0] : at::cat(bias, 0);
      model->bytes_ += result->bytes();
      return Status::Ok();
    };
    SLUICE_RETURN_IF_ERROR(
        tensor("embeddings.word_embeddings.weight", {a.vocab_size, h}, &model->word_));
    if (config.nomic) {
      model->BuildRotary();
    } else {
      SLUICE_RETURN_IF_ERROR(tensor("embeddings.position_embeddings.weight",
                                    {a.max_position_embeddings + config.position_offset, h},
                                    &model->position_));
    }
    if (config.type_vocab_size > 0) {
      SLUICE_RETURN_IF_ERROR(tensor("embeddings.token_type_embeddings.weight",
                                    {config.type_vocab_size, h}, &model->token_type_));
    }
    SLUICE_RETURN_IF_ERROR(tensor("embeddings.LayerNorm.weight", {h}, &model->embed_norm_w_));
    SLUICE_RETURN_IF_ERROR(tensor("embeddings.LayerNorm.bias", {h}, &model->embed_norm_b_));
    model->layers_.resize(static_cast<size_t>(a.layers));
    for (int i = 0; i < a.layers; ++i) {
      Layer& layer = model->layers_[static_cast<size_t>(i)];
      const std::string p = fmt::format("encoder.layer.{}.", i);
      if (config.nomic) {
        SLUICE_RETURN_IF_ERROR(linear({p + "attention.self.qkv"}, 3 * h, h, &layer.qkv));
        SLUICE_RETURN_IF_ERROR(linear({p + "intermediate.gate"}, inter, h, &layer.gate));
      } else {
        SLUICE_RETURN_IF_ERROR(linear(
            {p + "attention.self.query", p + "attention.self.key", p + "attention.self.value"}, h,
            h, &layer.qkv));
      }
      SLUICE_RETURN_IF_ERROR(linear({p + "attention.output.dense"}, h, h, &layer.out));
      SLUICE_RETURN_IF_ERROR(linear({p + "intermediate.dense"}, inter, h, &layer.up));
      SLUICE_RETURN_IF_ERROR(linear({p + "output.dense"}, h, inter, &layer.down));
      SLUICE_RETURN_IF_ERROR(
          tensor(p + "attention.output.LayerNorm.weight", {h}, &layer.attn_norm_w));
      SLUICE_RETURN_IF_ERROR(
          tensor(p + "attention.output.LayerNorm.bias", {h}, &layer.attn_norm_b));
      SLUICE_RETURN_IF_ERROR(tensor(p + "output.LayerNorm.weight", {h}, &layer.out_norm_w));
      SLUICE_RETURN_IF_ERROR(tensor(p + "output.LayerNorm.bias", {h}, &layer.out_norm_b));
    }
    if (config.num_labels > 0) {
      // BERT's head: its pooler (dense + tanh), then the classifier; RoBERTa's: classifier.dense
      // + tanh, then classifier.out_proj; DistilBERT's: pre_classifier + ReLU, then classifier.
      // llama.cpp's converter writes RoBERTa's and DistilBERT's dense layer as cls and leaves
      // BERT's pooler out of its files: the classifier then reads the first token's state
      // directly, as llama.cpp runs it.
      std::string dense = "pooler.dense", output = "classifier";
      if (safetensors != nullptr && safetensors->Find("classifier.out_proj.weight") != nullptr) {
        dense = "classifier.dense";
        output = "classifier.out_proj";
      } else if (safetensors != nullptr && config.distilbert) {
        dense = "pre_classifier";
      }
      if (Has(safetensors.get(), gguf.get(), dense + ".weight")) {
        SLUICE_RETURN_IF_ERROR(linear({dense}, h, h, &model->pooler_));
      }
      SLUICE_RETURN_IF_ERROR(linear({output}, config.num_labels, h, &model->classifier_));
    }
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: loading the encoder: {}", options.dir, e.what()));
  }
  return std::unique_ptr<StepModel>(std::move(model));
}

std::string BertModel::weight_formats() const { return std::string(LlmPrecisionName(precision_)); }

void BertModel::BuildRotary() {
  const ModelArchitecture& a = config_.arch;
  const int64_t half = a.head_dim / 2;
  at::Tensor inverse = at::empty({half}, at::kDouble);
  for (int64_t i = 0; i < half; ++i) {
    inverse[i] = std::pow(config_.rope_theta,
                          -2.0 * static_cast<double>(i) / static_cast<double>(a.head_dim));
  }
  const at::Tensor positions = at::arange(a.max_position_embeddings, at::kDouble).unsqueeze(1);
  const at::Tensor angles = positions * inverse.unsqueeze(0);
  rotary_cos_ = at::cos(angles).to(at::kFloat).contiguous();
  rotary_sin_ = at::sin(angles).to(at::kFloat).contiguous();
}

std::string BertModel::kernel_paths() const {
  bool blocks = false, vectors = false, fp32 = false;
  for (const Layer& layer : layers_) {
    for (const llama::Linear* linear :
         {&layer.qkv, &layer.out, &layer.up, &layer.down, &layer.gate}) {
      for (const llama::Linear::Part& part : linear->parts) {
        blocks = blocks || part.blocks != nullptr;
        vectors = vectors || (part.blocks == nullptr && !part.fp32());
        fp32 = fp32 || part.fp32();
      }
    }
  }
  std::vector<std::string> paths;
  if (blocks) paths.emplace_back(QuantKernelIsa());
  if (vectors) paths.emplace_back(CpuKernelIsa());
  if (fp32) paths.emplace_back("aten");
  return fmt::format("{}", fmt::join(paths, "+"));
}

void BertModel::LayerNorm(at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  x = at::layer_norm(x, {config_.arch.hidden_size}, w, b, config_.arch.rms_norm_eps);
}

Status BertModel::Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* rows) {
  const ModelArchitecture& a = config_.arch;
  std::vector<int64_t> ids, positions, types, offsets{0};
  for (const SequenceChunk& chunk : chunks) {
    if (chunk.start != 0) {
      return Status::Internal("an encoder's chunk must hold its whole sequence");
    }
    if (static_cast<int64_t>(chunk.tokens.size()) > a.max_position_embeddings) {
      return Status::InvalidArgument(fmt::format("a sequence of {} tokens exceeds the model's {}",
                                                 chunk.tokens.size(), a.max_position_embeddings));
    }
    int64_t type = 0;
    for (size_t p = 0; p < chunk.tokens.size(); ++p) {
      ids.push_back(chunk.tokens[p]);
      positions.push_back(static_cast<int64_t>(p) + config_.position_offset);
      types.push_back(type);
      // A pair's second text (type 1) follows the first separator, which is type 0 itself.
      if (chunk.tokens[p] == config_.separator_id && config_.type_vocab_size > 1) type = 1;
    }
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  llama::UseIntraOpThreads(serve_.threads);
  try {
    c10::InferenceMode guard;
    const int64_t total = static_cast<int64_t>(ids.size()), h = a.hidden_size;
    const int64_t heads = a.heads, d = a.head_dim;
    auto index = [](const std::vector<int64_t>& values) {
      return at::from_blob(const_cast<int64_t*>(values.data()),
                           {static_cast<int64_t>(values.size())}, at::kLong);
    };
    at::Tensor x = word_.index_select(0, index(ids));
    if (position_.defined()) x += position_.index_select(0, index(positions));
    if (token_type_.defined()) x += token_type_.index_select(0, index(types));
    at::Tensor cos, sin;  // nomic-bert's rotation of each row: [total, 1, d / 2].
    if (rotary_cos_.defined()) {
      cos = rotary_cos_.index_select(0, index(positions)).unsqueeze(1);
      sin = rotary_sin_.index_select(0, index(positions)).unsqueeze(1);
    }
    LayerNorm(x, embed_norm_w_, embed_norm_b_);
    at::Tensor qkv = at::empty({total, 3 * h}, at::kFloat);
    at::Tensor attended = at::empty({total, h}, at::kFloat);
    at::Tensor projected = at::empty({total, h}, at::kFloat);
    at::Tensor up = at::empty({total, a.intermediate_size}, at::kFloat);
    at::Tensor gate =
        config_.nomic ? at::empty({total, a.intermediate_size}, at::kFloat) : at::Tensor();
    for (const Layer& layer : layers_) {
      layer.qkv.Into(x, qkv.data_ptr<float>());
      if (cos.defined()) {
        // Queries and keys rotated (NeoX's halves): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
        at::Tensor heads_view = qkv.view({total, 3, heads, d}).narrow(1, 0, 2);
        at::Tensor x1 = heads_view.narrow(3, 0, d / 2), x2 = heads_view.narrow(3, d / 2, d / 2);
        const at::Tensor c = cos.unsqueeze(1), sn = sin.unsqueeze(1);  // [total, 1, 1, d / 2]
        at::Tensor r1 = x1 * c - x2 * sn, r2 = x2 * c + x1 * sn;
        x1.copy_(r1);
        x2.copy_(r2);
      }
      for (size_t s = 0; s + 1 < offsets.size(); ++s) {
        const int64_t begin = offsets[s], n = offsets[s + 1] - begin;
        // [n, 3, heads, d] -> q, k, v as [1, heads, n, d].
        at::Tensor part = qkv.narrow(0, begin, n).view({n, 3, heads, d});
        at::Tensor q = part.select(1, 0).transpose(0, 1).unsqueeze(0);
        at::Tensor k = part.select(1, 1).transpose(0, 1).unsqueeze(0);
        at::Tensor v = part.select(1, 2).transpose(0, 1).unsqueeze(0);
        at::Tensor out = at::scaled_dot_product_attention(q, k, v);  // [1, heads, n, d]
        attended.narrow(0, begin, n).copy_(out.squeeze(0).transpose(0, 1).reshape({n, h}));
      }
      layer.out.Into(attended, projected.data_ptr<float>());
      x = x + projected;
      LayerNorm(x, layer.attn_norm_w, layer.attn_norm_b);
      layer.up.Into(x, up.data_ptr<float>());
      at::Tensor activated;
      if (!layer.gate.parts.empty()) {  // SwiGLU: silu(gate) * up.
        layer.gate.Into(x, gate.data_ptr<float>());
        activated = at::silu(gate) * up;
      } else {
        activated = at::gelu(up, config_.gelu_tanh ? "tanh" : "none");
      }
      layer.down.Into(activated.contiguous(), projected.data_ptr<float>());
      x = x + projected;
      LayerNorm(x, layer.out_norm_w, layer.out_norm_b);
    }
    x = x.contiguous();
    if (config_.num_labels > 0) {
      // Every token's scores (the engine keeps the first token's: BERT's [CLS]).
      if (!pooler_.parts.empty()) {
        pooler_.Into(x, projected.data_ptr<float>());
        x = config_.distilbert ? at::relu(projected) : at::tanh(projected);
      }
      at::Tensor scores = at::empty({total, config_.num_labels}, at::kFloat);
      classifier_.Into(x.contiguous(), scores.data_ptr<float>());
      x = scores;
    }
    const float* data = x.data_ptr<float>();
    rows->insert(rows->end(), data, data + x.numel());
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("the encoder's step failed: {}", e.what()));
  }
  return Status::Ok();
}

}  // namespace sluice::llm::encoder
