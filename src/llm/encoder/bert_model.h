// BERT's encoder (and XLM-RoBERTa's, nomic-bert's variations of it) as a StepModel
// (encoder_config.h says which files): each chunk a whole sequence,
// run with bidirectional attention and no KV cache; the rows it gives are every token's final
// hidden state (an embedding model, pooled by the engine) or, for a cross-encoder, every token's
// classifier scores (the engine keeps the first token's). Weights as the decoder's linear layers
// (llama/linear.h) in the serving precision; embeddings and LayerNorms in fp32.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "llm/encoder/encoder_config.h"
#include "llm/llama/linear.h"
#include "llm/step_model.h"

namespace sluice::llm::encoder {

class BertModel final : public StepModel {
 public:
  // `config` from ParseEncoderConfig / EncoderConfigFromGguf; the weights from options.dir.
  static Result<std::unique_ptr<StepModel>> Load(const ModelLoadOptions& options,
                                                 const EncoderConfig& config);

  const ModelArchitecture& architecture() const override { return config_.arch; }
  int slots() const override { return serve_.slots; }
  int context_length() const override { return serve_.context_length; }
  int64_t weight_bytes() const override { return bytes_; }
  std::string weight_formats() const override;
  std::string kernel_paths() const override;
  std::string kv_cache_format() const override { return "none (encoder)"; }
  bool whole_sequences() const override { return true; }
  int row_width() const override {
    return config_.num_labels > 0 ? config_.num_labels : config_.arch.hidden_size;
  }
  bool classifies() const override { return config_.num_labels > 0; }
  Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>&) override {
    return Status::Ok();  // No KV cache: nothing is kept between steps.
  }
  Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* rows) override;

 private:
  struct Layer {
    llama::Linear qkv, out, up, down;
    llama::Linear gate;  // nomic-bert's SwiGLU gate; empty for BERT's GELU.
    at::Tensor attn_norm_w, attn_norm_b, out_norm_w, out_norm_b;  // After each residual add.
  };
  void LayerNorm(at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  // nomic-bert's rotary tables: cos and sin of each position's angle per frequency.
  void BuildRotary();

  EncoderConfig config_;
  LlmServeConfig serve_;
  at::Tensor word_, position_, token_type_;  // [vocab | positions | types, hidden], fp32.
  at::Tensor rotary_cos_, rotary_sin_;       // [positions, head_dim / 2]: nomic-bert's.
  at::Tensor embed_norm_w_, embed_norm_b_;
  std::vector<Layer> layers_;
  llama::Linear pooler_;      // A cross-encoder's dense + tanh before the classifier (optional).
  llama::Linear classifier_;  // [num_labels, hidden].
  int64_t bytes_ = 0;
  LlmPrecision precision_ = LlmPrecision::kFp32;
};

}  // namespace sluice::llm::encoder
