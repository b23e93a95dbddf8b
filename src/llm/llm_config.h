// A language model's configuration: its architecture (the Hugging Face config.json beside the
// weights) and how Sluice serves it (the `llm:` section of the model's config.yaml).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

// How the rotary frequencies are stretched for contexts longer than the model was trained at:
// linear (all divided by a factor), llama3 (the low frequencies divided, the high kept, a blend
// between), LongRoPE (Phi-3/3.5: a divisor per frequency, short factors up to the original context
// and long ones beyond, and an attention factor), YaRN (Qwen2.5, DeepSeek: the low frequencies
// interpolated, the high extrapolated, a linear ramp between, and an attention factor).
enum class RopeScaling { kNone, kLinear, kLlama3, kLongRope, kYarn };
// The feed-forward's gate: silu(gate) * up (SwiGLU), gelu(gate) * up with GELU's tanh form
// (GeGLU, gemma's), or gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit,
// limit), out = (u + 1) g sigmoid(alpha g) (swiglu_alpha, swiglu_limit).
enum class GateActivation { kSilu, kGeluTanh, kSwigluClamped };

// A Llama-family decoder, as config.json or a GGUF file's metadata describes it. The families
// differ in small ways, each a field here: one decoder serves them all.
struct ModelArchitecture {
  // llama (Llama 2/3, SmolLM, TinyLlama, and Mistral, which llama.cpp stores as llama), qwen2,
  // qwen3, qwen3moe, phi3, gemma3, gpt-oss.
  std::string name = "llama";
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;  // Grouped-query attention: heads % kv_heads == 0.
  int head_dim = 0;  // hidden_size / heads unless config.json says otherwise.
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;             // kLinear, kLlama3, kYarn.
  double rope_low_freq_factor = 1.0;    // kLlama3.
  double rope_high_freq_factor = 4.0;   // kLlama3.
  int rope_original_max_positions = 0;  // kLlama3, kLongRope, kYarn: the context trained at.
  // kLongRope: the divisor of each rotary frequency (head_dim / 2 each) for contexts up to the
  // original (short) and beyond it (long). Which one a model uses is chosen by the context it is
  // served with (its context_length above the original: long), as llama.cpp chooses, so that a
  // sequence's cached keys and its new queries are rotated alike.
  std::vector<float> rope_short_factors, rope_long_factors;
  // kYarn: the rotations per original context at which the ramp from extrapolated (fast) to
  // interpolated (slow) frequencies starts and ends, rounded out to whole dimension pairs
  // (truncate: llama.cpp always, transformers unless rope_parameters.truncate is false, as
  // gpt-oss's is).
  double rope_yarn_beta_fast = 32.0;
  double rope_yarn_beta_slow = 1.0;
  bool rope_yarn_truncate = true;
  // kLongRope, kYarn: cos and sin are scaled by this (both queries and keys).
  double rope_attention_factor = 1.0;
  // Rotary pairs: (i, i + D/2) as transformers rotates (false), or (2i, 2i + 1) as llama.cpp
  // rotates the q/k rows of a GGUF 'llama' file, which its converter permuted to match.
  bool rope_interleaved = false;
  // Per-frequency divisors of the rotary frequencies (GGUF's rope_freqs tensor: llama3's scaling
  // as llama.cpp stores it); empty: none.
  std::vector<float> rope_freq_factors;
  bool attention_bias = false;  // qwen2: biases on the q, k and v projections.
  // gpt-oss: a bias on the attention's output projection, and each query head's sink: a learned
  // logit that joins the head's softmax denominator and adds no value.
  bool attention_out_bias = false;
  bool attention_sinks = false;
  bool qk_norm = false;  // qwen3: RMSNorm of each query and key head before the rotation.
  // gemma3: the embedding times sqrt(hidden_size); the attention's and the feed-forward's outputs
  // RMS-normed (post_attention_norm, post_ffw_norm) before each residual add; GeGLU.
  bool scale_embedding = false;
  bool post_norms = false;
  GateActivation activation = GateActivation::kSilu;
  // Sliding-window attention: on the layers marked local, a token attends over the last
  // sliding_window positions (its own included) only, rotated with rope_theta_local and no
  // scaling (rope_theta_local 0: as the other layers, Mistral's and Phi-3's windows). Empty:
  // every layer global.
  std::vector<bool> local_layers;
  int sliding_window = 0;
  double rope_theta_local = 10000.0;
  double attention_scale = 0;      // Queries' scale before the softmax; 0: 1 / sqrt(head_dim).
  double final_logit_softcap = 0;  // > 0: logits = cap * tanh(logits / cap).
  bool tie_word_embeddings = false;
  // A mixture of experts (qwen3moe): every layer's feed-forward is `experts` SwiGLU experts of
  // expert_intermediate_size, and a router (a linear layer to one logit per expert) that picks
  // experts_used of them per token: the softmax of the logits, its top experts_used, their
  // probabilities renormalised to sum to 1 (expert_weights_norm) as the weights of the experts'
  // outputs. 0 experts: a dense feed-forward of intermediate_size.
  int experts = 0;
  int experts_used = 0;
  int expert_intermediate_size = 0;
  bool expert_weights_norm = true;
  // gpt-oss: biases on the router's logits and on each expert's gate, up and down projections.
  bool expert_biases = false;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;  // GateActivation::kSwigluClamped.
  int bos_token_id = -1;                            // -1: none.
  std::vector<int> eos_token_ids;
};

// int4: weight-only, groups of 128 inputs with a scale and offset each; the device executor's
// (on a GPU), refused on the CPU decoder.
enum class LlmPrecision { kFp32, kBf16, kInt8, kInt4 };
std::string_view LlmPrecisionName(LlmPrecision precision);

// What the KV cache holds: auto (bf16, or fp32 with fp32 weights), fp32, bf16, or q8_0 (each 32
// values of a row as int8 with an fp32 scale: 53% of bf16's bytes, attention reading it as is).
enum class KvCacheDtype { kAuto, kFp32, kBf16, kQ8_0 };
std::string_view KvCacheDtypeName(KvCacheDtype dtype);
// "auto", "fp32", "bf16" or "q8_0"; false for anything else.
bool ParseKvCacheDtype(std::string_view name, KvCacheDtype* dtype);

// An embedding model's pooling of its tokens' final hidden states into one vector: none (a
// generating model), the last token's (Qwen3-Embedding and other decoder embedders), their mean,
// or the first token's (cls).
enum class Pooling { kNone, kLast, kMean, kCls };
std::string_view PoolingName(Pooling pooling);  // "none", "last", "mean", "cls".

// How a model is served. Every field has a default, so config.yaml may be absent.
struct LlmServeConfig {
  LlmPrecision precision = LlmPrecision::kBf16;  // int8: weight-only, per output channel.
  int slots = 8;                                 // Sequences decoded together, at most.
  int context_length =
      2048;  // Tokens per sequence, prompt + generated; <= max_position_embeddings.
  // The paged KV cache: blocks of kv_block_size tokens from one pool of kv_cache_bytes (0: room
  // for `slots` sequences of context_length tokens). A request is admitted once blocks for its
  // prompt and max_tokens are free, so more short sequences than slots x context fit.
  int kv_block_size = 16;
  int64_t kv_cache_bytes = 0;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // The token budget of a step (vLLM's chunked prefill): prompt tokens run beside decoding
  // sequences. A newcomer's prompt is spread over steps, so a decoding stream waits out at most
  // this much prompt work per token: larger budgets prefill sooner and stall streams longer.
  // config.yaml's value is >= 1; left out (0), the model's (StepModel::default_step_tokens: 128
  // where its products take the int8 tiles, else 32).
  int max_step_tokens = 0;
  // Prompt tokens per step while no sequence decodes (nobody waits on the step); >= 1. 512 (as
  // llama.cpp's micro-batch): a mixture of experts' experts then get 32 of a chunk's rows on
  // average where 256 gave them 16, enough for some to take the int8 tiles (a 512-token prompt
  // on a Qwen3-30B-A3B-shaped file 0.90 x the time of 256's; a dense 1B's 0.99 x).
  int prefill_chunk = 512;
  // Prompt-lookup speculative decoding: drafts per decoding sequence and step, copied from the
  // earlier text that followed its latest n-gram, verified in the step; outputs are those of
  // plain decoding. 0: off. Pays off where the output repeats the input (summaries, edits, code).
  int speculative_tokens = 0;
  // Full blocks stay cached under a hash of their tokens and all before them once their sequence
  // ends; a newcomer whose prompt starts with them (a system prompt, the conversation so far)
  // takes them and runs only the rest. Least recently used blocks go first when the pool runs
  // short.
  bool prefix_caching = true;
  int speculative_ngram = 3;     // The longest n-gram looked up; 1-8.
  int threads = 0;               // Intra-op threads; 0: every core.
  int max_waiting = 256;         // Requests waiting for a slot; beyond it: kUnavailable.
  int default_max_tokens = 256;  // When a request gives no max_tokens (capped by the context).
  // A GGUF model's file in the directory (when it holds more than one).
  std::string model_file;
  // A folder for a GGUF file's repacked weights (llama/weights_cache.h): later loads, and every
  // process serving the same file, map them instead of repacking. Empty: each load repacks into
  // memory of its own.
  std::string weights_cache;
  // A folder for the prefix cache's disk tier (kv_disk_store.h): every full block is also kept
  // there, at most kv_cache_disk_bytes (least recently used out first), and a prompt whose prefix
  // memory no longer holds (evicted, or the server restarted) reads it back instead of computing
  // it. Empty: no disk tier.
  std::string kv_cache_disk;
  int64_t kv_cache_disk_bytes = int64_t{16} << 30;
  // How long the model stays loaded when idle, over the server's --keep-alive (and for a model
  // loaded at start too): a duration ("10m") or seconds; 0 unloads it once idle, negative keeps
  // it. Unset: the server's. A request's keep_alive overrides it until the model unloads.
  std::optional<std::chrono::milliseconds> keep_alive;
  // `embedding: {pooling, normalize}`: an embedding model, served at /v1/embeddings only. Its
  // steps give each token's final hidden state (after the last norm) instead of logits.
  Pooling pooling = Pooling::kNone;
  bool normalize = true;  // Embeddings scaled to unit L2 norm.
  // `lora: {max_loras, max_lora_rank, runtime_loading, adapters: {name: folder}}`: LoRA adapters
  // (lora.h) a request names as its model. max_loras bounds those loaded at once (0: none);
  // folders are relative to the model's directory; runtime_loading opens POST
  // /v1/load_lora_adapter and /v1/unload_lora_adapter.
  int max_loras = 0;
  int max_lora_rank = 16;
  bool lora_runtime_loading = false;
  std::map<std::string, std::string> lora_adapters;
  // Where the decoder runs: "cpu" (the CPU decoder, llama/llama_model.h), or "cuda:N" (the device
  // executor, llama/device_step.h, on GPU N), from config.yaml's Triton-style
  // `instance_group: [{kind: KIND_GPU, gpus: [N]}]` (N 0 where it names none).
  std::string device = "cpu";
  std::string device_key = "instance_group[0].kind";  // What asked for it, for errors.
  // `cuda_graphs`: on a GPU, each decode step of up to `slots` sequences replays a CUDA graph
  // captured for its batch bucket and key length (llama/step_graphs.h) instead of launching its
  // operations one by one. Default on; true on the CPU decoder is refused.
  bool cuda_graphs = true;
};

// Parses config.json. Errors name the file and key.
// The KV cache's element type as `serve` has it, auto resolved (bf16, or fp32 with fp32
// weights); and one block's bytes in it: every layer's keys and values of kv_block_size
// positions, with a q8_0 cache's scales (one fp32 per 32 values).
KvCacheDtype ResolvedKvCacheDtype(const LlmServeConfig& serve);
int64_t KvBlockBytes(const ModelArchitecture& arch, const LlmServeConfig& serve);

Result<ModelArchitecture> ParseArchitecture(const std::string& config_json_path);
// Parses the `llm:` section of config.yaml; a missing file gives the defaults. The context
// length is checked against `architecture`.
Result<LlmServeConfig> ParseServeConfig(const std::string& config_yaml_path,
                                        const ModelArchitecture& architecture);

// True when `dir` holds a language model: config.json and model.safetensors (or a sharded
// checkpoint's model.safetensors.index.json), or a .gguf file; or when `dir` is a GGUF file.
bool IsLanguageModelDir(const std::string& dir);

// The GGUF file a language-model directory is served from: config.yaml's `llm.model_file`, else
// the one .gguf file in it (a split model's first part); "" when it has none (the Hugging Face
// layout); `dir` itself when it is a file. An error when several are there and none is named, or
// the named one is absent.
Result<std::string> FindGgufFile(const std::string& dir);

class GgufFile;
// The architecture from a GGUF file's metadata (general.architecture and its keys). Errors name
// the file and the key; an architecture Sluice does not serve is refused by name.
Result<ModelArchitecture> ArchitectureFromGguf(const GgufFile& file);

}  // namespace sluice::llm
