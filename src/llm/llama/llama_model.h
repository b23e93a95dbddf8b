// The Llama-family decoder's step (llama_model.cc describes it): the StepModel that
// LoadLlamaModel returns. Its weights are weights.h's, its linear layers linear.h's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llm/files/gguf.h"
#include "llm/llama/weights.h"
#include "llm/llm_config.h"
#include "llm/step_model.h"
#include "sluice/status.h"

namespace sluice::llm::llama {

class LlamaModel final : public StepModel {
 public:
  static Result<std::unique_ptr<StepModel>> Load(const ModelLoadOptions& options);

  const ModelArchitecture& architecture() const override { return arch_; }
  int slots() const override { return serve_.slots; }
  int context_length() const override { return serve_.context_length; }
  int kv_block_size() const override { return serve_.kv_block_size; }
  int kv_blocks() const override { return blocks_; }
  int64_t kv_cache_bytes() const override { return kv_cache_bytes_; }
  int64_t weight_bytes() const override { return weights_.bytes; }
  std::string weight_formats() const override;
  std::string kernel_paths() const override;
  int default_step_tokens() const override;
  std::string weights_cache() const override { return weights_.weights_cache; }
  std::string kv_cache_format() const override {
    return std::string(KvCacheDtypeName(cache_dtype_));
  }
  Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) override;
  Status CanApplyLora() const override;
  Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) override;
  std::string kv_layout() const override;
  Status ReadKvBlock(int32_t block, std::string* out) const override;
  Status WriteKvBlock(int32_t block, const std::string& data) override;
  uint64_t CacheSalt(int prompt_length) const override {
    return long_rope_row_ > 0 && prompt_length > arch_.rope_original_max_positions ? 1 : 0;
  }

 private:
  // Which kernels the linear layers' products take: blocks (GGUF), vectors (bf16, int8), and among
  // the repacked blocks a grid read by VBMI's permutes and the int8 tiles' K-quants.
  struct KernelUse {
    bool blocks = false, vectors = false, grid = false, tiles = false;
  };
  KernelUse Kernels() const;
  void BuildRope();
  void Attention(int layer, const at::Tensor& qkv, const std::vector<SequenceChunk>& chunks,
                 const std::vector<int64_t>& offsets, at::Tensor& out);
  // Where chunk i's keys (or values) of KV head h lie for `layer`: position p at element
  // offset + p x D of `base` (the cache itself where its blocks for the span it reads are
  // consecutive; else a copy of them gathered into gathered_). Fills kv_base_.
  void LocateKeysAndValues(int layer, const std::vector<SequenceChunk>& chunks);
  // A step's activations live in buffers kept from step to step (allocated afresh each step, the
  // larger ones came from new pages the kernel zeroed, every prompt step): buffer i as [rows,
  // columns] fp32, grown to the largest step seen.
  at::Tensor Buffer(size_t i, int64_t rows, int64_t columns);
  // Rows [begin, end) of qkv: query and key heads rotated in place by their positions, then keys
  // and values copied into their slots' cache rows.
  // `rope_rows`: each token's row of rope_cos_ / rope_sin_ (its position, or past
  // long_rope_row_ for LongRoPE's long factors).
  void RotateAndCache(int layer, at::Tensor& qkv, const std::vector<int64_t>& positions,
                      const std::vector<int64_t>& rope_rows, const std::vector<int32_t>& chunk_of,
                      int64_t begin, int64_t end);
  void RmsNorm(at::Tensor& x, const at::Tensor& weight, at::Tensor& out,
               const float* residual = nullptr) const;
  // A mixture of experts' feed-forward (arch_.experts > 0) of `normed` into `out` (both [rows,
  // hidden]): each row's experts picked by the router, then each expert's rows gathered into one
  // product of its gate/up and down, its outputs added into their rows times their weights.
  void MixtureOfExperts(const Layer& layer, const at::Tensor& normed, at::Tensor& out);
  // A step's rows of each LoRA adapter its chunks name: [begin, begin + count) where they are
  // consecutive (the engine orders a step's chunks by adapter), else `rows`.
  struct LoraGroup {
    const LoraAdapter* adapter;
    int64_t begin = 0, count = 0;
    at::Tensor rows;  // int64 row indices, where not consecutive.
  };
  // out[rows] += (in[rows] A^T) B^T for each group whose adapter has `product` in `layer`: the
  // low-rank update beside the base product, one pair of products per adapter for all its rows
  // (Punica's grouping).
  static void ApplyLora(const std::vector<LoraGroup>& groups, int layer, LoraProduct product,
                        const at::Tensor& in, at::Tensor& out);
  bool IsLocal(int layer) const {
    return !arch_.local_layers.empty() && arch_.local_layers[static_cast<size_t>(layer)];
  }

  ModelArchitecture arch_;
  LlmServeConfig serve_;
  Weights weights_;
  std::unique_ptr<GgufFile> gguf_;  // Mapped while its blocks are read.
  bool from_gguf_ = false;
  at::Tensor rope_cos_, rope_sin_;  // [context, D/2], fp32 (LongRoPE: see below).
  // LongRoPE served past its original context: rope_cos_ / rope_sin_ hold the short factors' rows,
  // then from this row the long factors'; a token takes the long ones where its sequence's prompt,
  // or the token's own position, passes the original context (as transformers chooses by the
  // sequence's length). 0: one table.
  int64_t long_rope_row_ = 0;
  at::Tensor rope_local_cos_, rope_local_sin_;  // The same for sliding-window layers, where any.
  // Per layer: [KV, blocks, block_size, D]: a head's consecutive blocks are contiguous. A q8_0
  // cache holds int8 there and each 32 values' fp32 scale in cache_*_scales_ at the same element
  // offset / 32 ([KV, blocks, block_size, D / 32]).
  std::vector<at::Tensor> cache_k_, cache_v_, cache_k_scales_, cache_v_scales_;
  int blocks_ = 0;
  int64_t kv_cache_bytes_ = 0;  // blocks_ x the bytes of a block over every layer.
  // This step's block table of each chunk (its own, or its slot's static one).
  std::vector<std::vector<int32_t>> tables_;
  struct KvSpan {
    const char* k = nullptr;
    const char* v = nullptr;
    const float* k_scales = nullptr;  // q8_0: element e's scale at k_scales[e / 32].
    const float* v_scales = nullptr;
    int64_t offset = 0;  // Elements: position p's row starts at offset + p x D.
  };
  std::vector<KvSpan> kv_base_;                // [chunk x KV + h], for the layer at hand.
  std::vector<char> gathered_k_, gathered_v_;  // Rows of tables that are not consecutive ...
  std::vector<float> gathered_k_scales_, gathered_v_scales_;  // ... and their q8_0 scales.
  // By default the cache holds bf16 when the weights are bf16 or int8 (half the bytes decode
  // attention reads; transformers' bf16 model keeps a bf16 cache too), fp32 with fp32 weights;
  // llm.kv_cache_dtype chooses (never kAuto here).
  KvCacheDtype cache_dtype_ = KvCacheDtype::kFp32;
  // The cache's tensors and the bytes of one head's block in each (CopyBlocks' and the disk
  // tier's view of a block: those bytes at each head, in each tensor).
  std::vector<std::pair<const at::Tensor*, int64_t>> BlockSlices() const;
  int64_t CacheElementBytes() const {
    return cache_dtype_ == KvCacheDtype::kFp32 ? 4 : cache_dtype_ == KvCacheDtype::kBf16 ? 2 : 1;
  }
  std::vector<at::Tensor> buffers_;
};

}  // namespace sluice::llm::llama
