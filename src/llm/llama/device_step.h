// The decoder's step over ATen operations, for any device ATen has kernels for: the executor the
// same scheduler, block pool, prefix cache and sampling run on a GPU. Its weights are dense
// matrices in the device's compute dtype (a GGUF file's blocks dequantised at load), int8 rows
// with a scale each (DeviceOptions::int8_weights) or int4 groups with a scale and offset each
// (DeviceOptions::int4_weights), its paged KV cache a pair of tensors per layer
// on the device ([blocks x block_size, KV heads, head_dim]), written at each token's cache row
// (step_batch.h) and read through each sequence's block table.
// A step's attention runs in padded, masked batches ([sequences, queries, positions]): its
// decoding sequences together (the shapes a CUDA graph per decode bucket captures), each prompt
// chunk alone.
//
// The code is device-neutral: on CPU tensors it runs here, held to the CPU decoder's logits
// (device_step_test.cc); on CUDA it runs once libtorch_cuda is loaded into the process (the CUDA
// library registers its kernels with ATen's dispatcher), which a GPU model's load does.
//
// Served: the dense families (llama, mistral, qwen2, qwen3, phi3, gemma3) with every RoPE
// scaling, q/k norms, biases, sliding windows, post-norms, GeGLU and final soft-capping, and the
// mixtures of experts (qwen3moe, Mixtral's llama, gpt-oss with its sinks, biases and clamped
// SwiGLU), from HF folders and GGUF files, with LoRA adapters (each adapter's rows of a step one
// pair of products beside each base product, as the CPU decoder applies them). Refused by name: a
// q8_0 KV cache, the prefix cache's disk tier.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llm/llama/rope.h"
#include "llm/llama/step_graphs.h"
#include "llm/llama/weights.h"
#include "llm/step_batch.h"
#include "llm/step_model.h"

namespace sluice::llm::llama {

struct DeviceOptions {
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;  // Of the weights, activations' products and the KV cache.
  // Weight-only int8: each weight matrix's rows as int8 with an fp32 scale per row (max |w| /
  // 127, as the CPU decoder's int8), half of bf16's bytes; dtype stays the KV cache's and the
  // embedding's. A product of at most `int8_packed_rows` rows of x (a decode step's) reads the
  // int8 rows as they are (ATen's _weight_int8pack_mm, fp32 activations); a longer one (a prompt's)
  // converts them to dtype for the device's matrix units and scales its outputs.
  bool int8_weights = false;
  int64_t int8_packed_rows = 16;
  // Weight-only int4 (asymmetric, as ATen's tinygemm kernels and torchao's int4 weight-only
  // read it): each row's groups of 128 inputs (64 or 32 where the row's length asks; a matrix
  // whose inputs are not a multiple of 32 stays in dtype) as 4-bit q in [0, 15] with a scale
  // (max - min) / 15 and an offset, w = (q - 8) scale + (min + 8 scale): a quarter of bf16's
  // bytes. Every product reads the packed rows as they are: on CUDA ATen's _weight_int4pack_mm
  // (bf16 activations, tensor cores on sm80+), on the CPU its _weight_int4pack_mm_for_cpu (fp32).
  // Outputs are padded to a multiple of 16 rows (the packings' tile), the padding dropped after
  // each product. Devices other than CUDA and the CPU are refused at load.
  bool int4_weights = false;
  // Where set, a step whose chunks all decode one token (no LoRA adapter, no mixture of experts,
  // every row's logits wanted) replays a graph captured for its batch bucket (DecodeBuckets of
  // the slots) and its longest sequence's positions rounded up to kGraphKeys: its tokens,
  // positions and cache rows in static buffers, padded sequences writing a cache row of their
  // own, their keys masked. Every bucket's graphs up to kGraphKeysAtLoad keys are captured at
  // load, the others when first met; at most `max_graphs`; a step past them, or any step after a
  // capture failed, runs op by op.
  std::shared_ptr<StepGraphs> graphs;
  int max_graphs = 64;
  std::string graphs_off;  // Why there are no graphs where they were asked for (kernel_paths).
};

// A weight matrix in DeviceOptions::int4_weights' layout: `packed` the device's packing of its
// rows (one per matrix, stacked for a mixture's experts), `scales` its groups' scales and offsets
// ([in / group, out padded to 16, 2], stacked), `out` its rows before padding. `group` 0: its rows'
// length is not a multiple of 32, and it was not packed.
struct Int4Packed {
  at::Tensor packed, scales;
  int64_t group = 0, out = 0;
};
// `dense` (fp32 [out, in] or stacked [experts, out, in], on the CPU) as int4 for `device`
// (CUDA or the CPU), its scales and offsets in `scale_type` (the kernel's activations' dtype).
Int4Packed PackInt4(const at::Tensor& dense, const at::Device& device, at::ScalarType scale_type);
// x [rows, in] -> [rows, out] fp32 through one (unstacked) int4 matrix on `device`.
at::Tensor Int4Product(const at::Tensor& x, const Int4Packed& w, const at::Device& device);

class DeviceStepModel final : public StepModel {
 public:
  static Result<std::unique_ptr<StepModel>> Load(const ModelLoadOptions& options,
                                                 const DeviceOptions& device);

  const ModelArchitecture& architecture() const override { return arch_; }
  int slots() const override { return serve_.slots; }
  int context_length() const override { return serve_.context_length; }
  int kv_block_size() const override { return serve_.kv_block_size; }
  int kv_blocks() const override { return blocks_; }
  int64_t kv_cache_bytes() const override { return kv_cache_bytes_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  std::string weight_formats() const override;
  // "aten:DEVICE"; a mixture of experts adds how its experts' products run (grouped, or one
  // expert at a time).
  std::string kernel_paths() const override;
  std::string kv_cache_format() const override;
  uint64_t CacheSalt(int prompt_length) const override {
    return rope_.long_row > 0 && prompt_length > arch_.rope_original_max_positions ? 1 : 0;
  }
  Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) override;
  Status CanApplyLora() const override { return Status::Ok(); }
  Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) override;
  // A generating model's greedy and sampled rows (TokenPick) are picked on the device, and only
  // their tokens copied to the host.
  bool picks_tokens() const override { return serve_.pooling == Pooling::kNone; }
  Status RunPicking(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits,
                    std::vector<int32_t>* picked, std::vector<TokenLogprobs>* logprobs) override;
  // Graphs captured, and steps that replayed one (DeviceOptions::graphs).
  int graphs_captured() const { return static_cast<int>(graphs_.size()); }
  int64_t graph_replays() const { return graph_replays_; }
  // A graph's key lengths are multiples of this many positions.
  static constexpr int64_t kGraphKeys = 128;
  // Graphs of every bucket up to this key length are captured at load, the others when a step
  // first meets their shape.
  static constexpr int64_t kGraphKeysAtLoad = 512;

 private:
  // A padded batch of a step's sequences for attention: [sequences, queries] queries over
  // [sequences, keys] cached positions.
  struct AttentionBatch {
    int64_t sequences = 0, queries = 0, keys = 0;
    at::Tensor query_rows;        // [sequences x queries]: each query's token (padding: 0).
    at::Tensor key_rows;          // [sequences x keys]: each key's cache row (padding: 0).
    at::Tensor tokens, slots;     // The batch's tokens, and each one's row of the padded output.
    at::Tensor causal, windowed;  // [sequences, 1, 1, queries, keys]: the keys each query sees.
  };
  AttentionBatch Batch(const StepBatch& step, const std::vector<int64_t>& sequences) const;
  // b's causal and windowed masks: queries at `q_pos` ([sequences, 1, 1, queries, 1]) over keys at
  // positions `keys` (int64 [b.keys]: 0, 1, ...).
  void Mask(const at::Tensor& q_pos, const at::Tensor& keys, AttentionBatch* b) const;
  // The cache row of a sequence's position m under its block `table`.
  static int64_t KeyRow(const std::vector<int32_t>& table, int64_t m, int64_t block) {
    return table[static_cast<size_t>(m / block)] * block + m % block;
  }
  // What the layers read of a step: its tokens' ids, positions, rows of the RoPE tables and
  // of the cache, the rows whose logits are wanted, and its attention batches.
  struct StepTensors {
    at::Tensor tokens, positions, rope_rows, cache_rows, logit_rows;
    std::vector<AttentionBatch> batches;
  };
  // A weight matrix [out, in] on the device (a mixture's experts stacked: [experts, out, in]):
  // dtype, or int8 with `scales` (fp32 [out], [experts, out]), or int4 (group > 0): `weight` in
  // the device's packed layout (one per expert, stacked), `scales` its scales and offsets
  // ([in / group, padded out, 2], stacked), `out` the rows before padding.
  struct Matrix {
    at::Tensor weight, scales;
    int64_t group = 0, out = 0;
    Matrix Select(int64_t expert) const {
      return {weight.select(0, expert), scales.defined() ? scales.select(0, expert) : scales, group,
              out};
    }
  };
  struct DeviceLayer {
    at::Tensor attn_norm, ffn_norm, q_norm, k_norm, post_attn_norm, post_ffn_norm;  // fp32.
    Matrix qkv, out, gate_up, down;
    at::Tensor qkv_bias, out_bias;                       // fp32.
    at::Tensor sinks;                                    // fp32 [heads]: gpt-oss's.
    at::Tensor router, router_bias;                      // fp32 [experts, hidden], [experts].
    Matrix experts_gate_up, experts_down;                // Stacked: [experts, out, in].
    at::Tensor experts_gate_up_bias, experts_down_bias;  // fp32 [experts, out] (gpt-oss's).
  };
  // A step's rows of one LoRA adapter, and its A and B matrices on the device ([layer][product],
  // undefined where the adapter has none).
  struct LoraRows {
    const LoraAdapter* adapter;
    at::Tensor rows;
    const std::vector<std::array<std::pair<at::Tensor, at::Tensor>, kLoraProducts>>* weights;
  };
  // out[rows] += (in[rows] A^T) B^T for each adapter with `product` in `layer`.
  static void ApplyLora(const std::vector<LoraRows>& groups, int layer, LoraProduct product,
                        const at::Tensor& in, at::Tensor& out);
  // The feed-forward's gate (arch_.activation) over gate_up ([rows, 2 inter]: gate, then up).
  at::Tensor Gate(const at::Tensor& gate_up) const;
  // A mixture of experts' feed-forward of `x` ([rows, hidden] fp32): each row's top experts by
  // the router's softmax (renormalised where the model says). The (row, expert) pairs sorted by
  // expert go through one grouped product per matrix (ATen's _grouped_mm: every expert's rows in
  // one kernel, its group bounds computed on the device, nothing read back to the host); int8 or
  // int4 experts, or a device whose grouped product fails, take each expert's rows as one product
  // (their counts read back once a layer).
  at::Tensor Experts(const DeviceLayer& layer, const at::Tensor& x) const;
  // Whether the layer's experts are int8 or int4 (no grouped product reads them).
  static bool Quantised(const DeviceLayer& layer) {
    return layer.experts_gate_up.scales.defined() || layer.experts_down.scales.defined();
  }
  // x [rows, in] fp32 -> [rows, out] fp32 through `w` and `bias`.
  at::Tensor Product(const at::Tensor& x, const Matrix& w, const at::Tensor& bias) const;
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& weight) const;
  // Picks the tokens of the step's `rows` of logits ([rows, vocab] fp32, the chunks' in order)
  // whose chunks' TokenPick says so (device_pick.cc), appending them to `picked` (and their
  // log-probabilities where asked); returns the other rows, whose logits go to the host.
  at::Tensor Pick(const std::vector<SequenceChunk>& chunks, at::Tensor rows,
                  std::vector<int32_t>* picked, std::vector<TokenLogprobs>* logprobs) const;
  // The tokens (int64 [rows]) of `logits`' rows ([rows, vocab] fp32), each drawn as
  // Sampler::Next draws with its pick's parameters and draw (TokenPick::kSample): the logits
  // times 1 / temperature in fp32, sorted (stable: ties by id) where top-k or top-p cuts, the
  // probabilities in fp64, the draw times the kept mass against their running sum.
  at::Tensor Sample(const at::Tensor& logits, const std::vector<const TokenPick*>& picks) const;
  // Appends each row's LogProbabilities: `chosen`'s (int64 [rows]) log-probability under the
  // row's `logits` ([rows, vocab] fp32, raw) and its `tops[i]` most likely tokens', ties by id.
  static void Score(const at::Tensor& logits, const at::Tensor& chosen,
                    const std::vector<int>& tops, std::vector<TokenLogprobs>* out);
  // The layers over a step, then the final norm and the output product (or the pooled rows):
  // [logit rows, vocab] fp32. Launches no host copy and reads nothing back unless the model
  // has experts or `lora` adapters, so a graph can capture it.
  at::Tensor Forward(const StepTensors& in, const std::vector<LoraRows>& lora);
  // A decode-only step through its graph (DeviceOptions::graphs): its rows' logits, or an
  // undefined tensor where the step runs op by op.
  at::Tensor Graphed(const StepBatch& step);
  // The captured body: Forward over the static buffers' first `sequences` sequences and `keys`
  // positions.
  at::Tensor DecodeBody(int64_t sequences, int64_t keys);
  // Captures the graph of (bucket, keys) over whatever the static buffers hold; false (graphs
  // off from then on, graphs_off_ saying why) where the device cannot.
  bool CaptureGraph(int64_t bucket, int64_t keys);
  // Load's part (device_graphs.cc): the static buffers, `scratch_row` the row padded sequences
  // write, and every bucket's graphs at key lengths up to kGraphKeysAtLoad.
  void SetUpGraphs(int64_t scratch_row);
  // `step`'s values (null: padding alone) where the graph of (bucket, keys) reads them.
  void WriteGraphInputs(const StepBatch* step, int64_t bucket, int64_t keys);
  // Rotates [tokens, heads, D] by the rows' cos and sin ([tokens, D / 2]).
  at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  bool IsLocal(int layer) const {
    return !arch_.local_layers.empty() && arch_.local_layers[static_cast<size_t>(layer)];
  }

  ModelArchitecture arch_;
  LlmServeConfig serve_;
  DeviceOptions device_;
  std::string formats_;  // The file's weight formats, dequantised to dtype at load.
  std::vector<DeviceLayer> layers_;
  at::Tensor embedding_, final_norm_;
  Matrix lm_head_;
  RopeTables rope_;                            // On the device.
  std::vector<at::Tensor> cache_k_, cache_v_;  // Per layer: [blocks x block_size, KV, D].
  // Adapters' matrices on the device, by adapter id (ids are never reused): kept while steps
  // name them, dropped once more than a few are held.
  std::map<uint64_t, std::vector<std::array<std::pair<at::Tensor, at::Tensor>, kLoraProducts>>>
      lora_weights_;
  // Cleared when the device refused a grouped product (a dtype or GPU it lacks a kernel for).
  mutable std::atomic<bool> grouped_experts_{true};
  // Decode graphs by (bucket, key length), each with its output (kept from its capture).
  struct DecodeGraph {
    std::unique_ptr<StepGraph> graph;
    at::Tensor out;
  };
  std::map<std::pair<int64_t, int64_t>, DecodeGraph> graphs_;
  std::vector<int> buckets_;  // DecodeBuckets(slots), where graphs are on.
  int64_t graph_keys_ = 0;    // The longest key length: context_length rounded up.
  // int64 [4 x largest bucket + largest bucket x graph_keys_]: tokens, positions, RoPE rows and
  // cache rows (a block of each, padded), then each sequence's key rows; the device's copy the
  // graphs read, the host's (pinned on CUDA) where a step writes them.
  at::Tensor graph_inputs_, graph_host_;
  at::Tensor iota_;          // int64 0, 1, ... on the device: identity rows and key positions.
  int64_t scratch_row_ = 0;  // A cache row no block holds: padded sequences write there.
  std::string graphs_off_;  // Why there are none (a failed capture, a model none holds); empty: on.
  int64_t graph_replays_ = 0;
  int blocks_ = 0;
  int int4_dense_ = 0;  // int4 weights: matrices left in dtype (rows not a multiple of 32).
  int64_t kv_cache_bytes_ = 0, weight_bytes_ = 0;
};

}  // namespace sluice::llm::llama
