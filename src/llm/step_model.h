// What the generation loop needs of a model: run one step over a batch of sequence chunks, each
// with its own blocks of the paged KV cache. No torch here; the Llama decoder (llama_model.h)
// implements it, and the scheduler's tests use a fake.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llm/llm_config.h"
#include "llm/lora.h"
#include "llm/sampler.h"
#include "sluice/status.h"

namespace sluice::llm {

// How a model that picks tokens itself (StepModel::picks_tokens) picks a chunk's rows' tokens:
// on the host from the logits (kHost: the logits are handed back), the first largest logit
// (kGreedy; also a prompt chunk whose logits nobody samples), or drawn as Sampler::Next draws
// (kSample: the logits over `temperature`, the `top_k` largest and the smallest set with `top_p`
// of the probability kept, ties by id, in id order where neither cuts; `draw`, in [0, 1), of the
// kept mass picks the token). Either way a grammar's mask comes first (the tokens whose bit in
// `allowed` is clear set to -infinity, as GrammarMatcher::Mask; empty: none), then the penalties,
// as Sampler::PenaltyEdits gives them: the `repeated` tokens' logits divided by `repetition`
// (multiplied where negative), then the `counted` tokens' less their `amounts`.
struct TokenPick {
  enum Kind { kHost, kGreedy, kSample } kind = kHost;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  double draw = 0.0;
  float repetition = 1.0f;
  std::vector<int32_t> repeated, counted;
  std::vector<float> amounts;
  std::vector<uint32_t> allowed;  // GrammarMatcher::Allowed's bits.
  // >= 0: the picked token's log-probability and this many most likely tokens', under the raw
  // logits (LogProbabilities' definition).
  int logprobs = -1;
};

// A run of tokens of one sequence: a prompt chunk (prefill) or the one token just sampled
// (decode), with drafts to verify. The tokens take cache positions [start, start + tokens.size())
// of the sequence; positions below `start` already hold its keys and values. Position p lives in
// block blocks[p / block_size] of the paged cache, at row p % block_size; without `blocks`, slot
// s owns the blocks [s x n, (s + 1) x n), n = ceil(context / block_size) (a static cache).
struct SequenceChunk {
  int slot = 0;
  int start = 0;
  std::vector<int32_t> tokens;
  bool all_logits = false;      // Logits of every token (tests); otherwise of the last one only.
  std::vector<int32_t> blocks;  // The block table, covering at least start + tokens.size().
  const LoraAdapter* lora = nullptr;  // The adapter its request names; held by the request.
  // The sequence's prompt length, for what a model chooses by it (LongRoPE's factors); 0: the
  // prompt ends with this chunk (start + tokens).
  int prompt_length = 0;
  // Where a model that picks_tokens() picks its rows' tokens (RunPicking).
  TokenPick pick;
};

// Thread-compatible: one step at a time, from one thread (the scheduler's loop).
class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual const ModelArchitecture& architecture() const = 0;
  virtual int slots() const = 0;
  virtual int context_length() const = 0;
  // The paged KV cache: tokens per block, and blocks in the pool.
  virtual int kv_block_size() const { return 16; }
  virtual int kv_blocks() const { return slots() * ((context_length() + 15) / 16); }
  virtual int64_t kv_cache_bytes() const { return 0; }  // The pool's memory (0: not known).
  // Nonzero where a prompt of `prompt_length` tokens gives other keys and values for the same
  // tokens than shorter prompts do (LongRoPE's long factors past the original context): its
  // cached blocks are shared only with prompts of the same salt.
  virtual uint64_t CacheSalt(int prompt_length) const { return 0; }

  // Copies whole blocks (every layer's keys and values): from `copies[i].first` to `.second`.
  virtual Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) = 0;
  // A block's keys and values as bytes, and a block set from such bytes, for the prefix cache's
  // disk tier (llm/kv_disk_store.h); kv_layout() names what the bytes depend on besides the
  // weights (precision, the cache's element type and shape). Empty kv_layout(): no disk tier.
  virtual std::string kv_layout() const { return ""; }
  virtual Status ReadKvBlock(int32_t block, std::string* out) const {
    return Status::Internal("this model's KV cache cannot be read");
  }
  virtual Status WriteKvBlock(int32_t block, const std::string& data) {
    return Status::Internal("this model's KV cache cannot be written");
  }
  // Runs `chunks` (no block written by two) as one step and appends rows of vocab_size floats to
  // `logits`: for each chunk in order, its last token's (or every token's, with all_logits). An
  // embedding model (LlmServeConfig::pooling set) appends rows of hidden_size floats instead:
  // the hidden states after the final norm.
  virtual Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) = 0;
  // Whether RunPicking picks tokens itself (a GPU's step: a row's token crosses to the host, not
  // its vocab_size logits).
  virtual bool picks_tokens() const { return false; }
  // Run, except that where picks_tokens() a chunk whose `pick` is not kHost appends no logits:
  // its rows' tokens are appended to `picked` instead, in order, and for each such row whose
  // pick asks for log-probabilities, those to `logprobs`.
  virtual Status RunPicking(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits,
                            std::vector<int32_t>* picked, std::vector<TokenLogprobs>* logprobs) {
    return Run(chunks, logits);
  }

  // Bytes of weights read per decode step (for the bandwidth roofline in reports).
  virtual int64_t weight_bytes() const = 0;
  // The linear layers' weight formats ("bf16"; a GGUF file's "Q4_K+Q6_K") and the kernel paths
  // their products run on ("avx512bf16"; "avx512vnni"), for the startup line and /metrics.
  virtual std::string weight_formats() const { return ""; }
  virtual std::string kernel_paths() const { return ""; }
  // The prompt tokens a step takes beside decoding streams where config.yaml names none
  // (LlmServeConfig::max_step_tokens 0): kTileStepTokens where the products take the int8 tiles
  // (kernels.h), so that a step with a newcomer's chunk is well past kInt8TileRows whatever the
  // streams (the tiles' conversion, made once a step, is spread over twice the rows of 64: at 16
  // streams more output tokens a second, each stream's longest wait between two tokens a step of
  // 128 prompt tokens), else kStepTokens.
  static constexpr int kStepTokens = 32;
  static constexpr int kTileStepTokens = 128;
  virtual int default_step_tokens() const { return kStepTokens; }
  // Where a weights cache served the weights from ("repacked weights mapped from <file>"); empty
  // without one.
  virtual std::string weights_cache() const { return ""; }
  // What the KV cache holds ("bf16", "q8_0", ...), for the startup line.
  virtual std::string kv_cache_format() const { return ""; }
  // An encoder's (bidirectional attention): each chunk must be a whole sequence, from its first
  // token to its last, so prompts are never split across steps.
  virtual bool whole_sequences() const { return false; }
  // An embedding model's rows: floats per token (its hidden size; a cross-encoder's classes).
  virtual int row_width() const { return architecture().hidden_size; }
  // A cross-encoder: its rows are classifier scores (served at /v1/rerank), not embeddings.
  virtual bool classifies() const { return false; }
  // OK where chunks may name LoRA adapters (lora.h); else why not.
  virtual Status CanApplyLora() const {
    return Status::InvalidArgument("this model does not take LoRA adapters");
  }
};

struct ModelLoadOptions {
  std::string dir;  // config.json + model.safetensors.
  LlmServeConfig serve;
};

// Loads the Llama decoder on the CPU (llama/llama_model.cc). Errors name the file and tensor.
Result<std::unique_ptr<StepModel>> LoadLlamaModel(const ModelLoadOptions& options);

// "libtorch 2.11.0": the runtime the model runs on.
std::string LlmRuntimeVersion();

}  // namespace sluice::llm
