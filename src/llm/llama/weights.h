// A decoder's weights and their loading, from a Hugging Face model's safetensors or a GGUF file:
// the linear layers (linear.h) in the serving precision or, from GGUF, in the file's blocks
// (repacked at load where the kernels can), norms in fp32, the embedding in the serving dtype or
// its quantised rows read where the file is mapped. Shapes are checked against the architecture;
// errors name the file and the tensor.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/files/gguf.h"
#include "llm/files/safetensors.h"
#include "llm/llama/linear.h"
#include "llm/llama/weights_cache.h"
#include "llm/llm_config.h"
#include "sluice/status.h"

namespace sluice::llm::llama {

struct Layer {
  at::Tensor attn_norm, ffn_norm;            // [hidden], compute dtype.
  at::Tensor q_norm, k_norm;                 // [D], fp32: qwen3 and gemma3.
  at::Tensor post_attn_norm, post_ffn_norm;  // [hidden], fp32: gemma3 (post_norms).
  Linear qkv;                                // q, k, v projections stacked: [(H + 2 KV) D, hidden].
  Linear out;                                // [hidden, H D] (+ gpt-oss's bias).
  at::Tensor sinks;                          // [H], fp32: gpt-oss's attention sinks.
  Linear gate_up;                            // gate and up stacked: [2 I, hidden].
  Linear down;                               // [hidden, I].
  // A mixture of experts (arch.experts > 0) in place of gate_up and down: the router's fp32
  // [experts, hidden] (and gpt-oss's bias, [experts]), and each expert's gate and up stacked
  // ([2 I_e, hidden]) and down, with their biases (gpt-oss's) as the Linears' own.
  at::Tensor router, router_bias;
  struct Expert {
    Linear gate_up, down;
  };
  std::vector<Expert> experts;
  // Every linear layer of the block, experts' included.
  std::vector<Linear*> Linears();
  std::vector<const Linear*> Linears() const;
};

struct Weights {
  at::ScalarType dtype =
      at::kFloat;        // Of the embedding and unquantised layers (set before loading).
  at::Tensor embedding;  // [vocab, hidden]; or, from a GGUF file, ...
  const void* embedding_blocks = nullptr;  // ... its quantised rows, of ...
  uint32_t embedding_type = 0;             // ... this GgmlType, ...
  // ... or, tied to the output head and repacked for it, that copy (as RepackQuant lays it out),
  // so that the file's pages of it are not mapped again by lookups.
  bool embedding_repacked = false;
  std::vector<Layer> layers;
  at::Tensor final_norm;
  Linear lm_head;
  int64_t bytes = 0;  // Of everything above as held in memory.
  // Where a weights cache served the repacked parts: "repacked weights mapped from <file>" or
  // "... written to <file>"; empty without one.
  std::string weights_cache;
};

// Hugging Face names (model.layers.N.self_attn.q_proj.weight, ...), F32, BF16 or F16.
Status LoadSafetensorsWeights(const SafetensorsFile& file, const ModelArchitecture& arch,
                              LlmPrecision precision, Weights* out);
// llama.cpp's tensor names (blk.N.attn_q.weight, ...), each tensor kept in its type: quantised
// ones as parts of their layers, read where the file is mapped (or repacked), float ones
// converted to the serving precision. With a `cache` (may be null), the repacked parts come from
// its file, or are written to it and then read from it (weights_cache.h).
Status LoadGgufWeights(const GgufFile& file, const ModelArchitecture& arch, LlmPrecision precision,
                       WeightsCache* cache, Weights* out);

// A decoder as a model directory holds it: its architecture and weights.
struct Decoder {
  ModelArchitecture arch;
  Weights weights;
  std::unique_ptr<GgufFile> gguf;  // A GGUF file's, mapped while its blocks are read.
};
// The architecture of the decoder in `dir` (its GGUF file, else its config.json).
Result<ModelArchitecture> ReadArchitecture(const std::string& dir, std::unique_ptr<GgufFile>* gguf);
// Its weights in `precision` (weights.dtype set), from `decoder->gguf` where ReadArchitecture
// opened one (through a weights cache at `weights_cache`, if not empty), else from its
// safetensors. On one thread (linear.h's OneOmpThread says why).
Status LoadDecoderWeights(const std::string& dir, LlmPrecision precision,
                          const std::string& weights_cache, Decoder* decoder);

}  // namespace sluice::llm::llama
