// The Llama decoder on ATen ops: RMSNorm, rotary embeddings (the config's theta and scaling),
// grouped-query attention over a paged KV cache (kernels/kernels.h, for prompts and decoding;
// blocks of kv_block_size positions per KV head, found through each chunk's block table), SwiGLU,
// tied or untied output. Activations and norms are fp32, the KV cache fp32 with fp32 weights and
// bf16 otherwise; the weights of the linear layers are fp32 (ATen's matmul), bf16, or int8 with
// per-output-channel scales. bf16 and int8 weights go through kernels/kernels.h, which widens them
// to fp32 in registers: decoding is bound by reading the weights, and ATen's bf16 / int8 paths are
// slow on CPUs without AVX-512 bf16.
//
// One step runs every chunk of the batch through each weight matrix once: the tokens of all
// chunks are stacked into one [T, hidden] activation, so a decode step over 16 slots reads the
// weights once, not 16 times. Attention is the only per-sequence part: one task per token and KV
// head, over that token's blocks of the cache (read in place where they are consecutive, else
// gathered once per step and chunk into one span, so the kernels always see contiguous rows).
#include "llm/llama/llama_model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/mman.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <numeric>
#include <string_view>
#include <thread>

#include "backends/vector_math.h"
#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"
#include "llm/llama/rope.h"
#include "llm/llama/step_rows.h"
#include "llm/step_batch.h"
#include "llm/step_model.h"

namespace sluice::llm::llama {

Result<std::unique_ptr<StepModel>> LlamaModel::Load(const ModelLoadOptions& options) {
  ResolveVectorMath();
  auto model = std::make_unique<LlamaModel>();
  Decoder decoder;
  auto arch = ReadArchitecture(options.dir, &decoder.gguf);
  if (!arch.ok()) return arch.status();
  model->arch_ = decoder.arch = *arch;
  model->serve_ = options.serve;
  if (model->serve_.context_length > model->arch_.max_position_embeddings) {
    return Status::InvalidArgument(fmt::format(
        "{}: context_length {} exceeds the model's max_position_embeddings {}", options.dir,
        model->serve_.context_length, model->arch_.max_position_embeddings));
  }
  model->cache_dtype_ = ResolvedKvCacheDtype(options.serve);
  if (model->cache_dtype_ == KvCacheDtype::kQ8_0 && model->arch_.head_dim % 32 != 0) {
    return Status::InvalidArgument(fmt::format(
        "{}: kv_cache_dtype q8_0 needs a head size that is a multiple of 32; this model's is {}",
        options.dir, model->arch_.head_dim));
  }
  const OneOmpThread one_thread;  // Loading runs on one thread (linear.h says why).
  try {
    c10::InferenceMode guard;
    SLUICE_RETURN_IF_ERROR(LoadDecoderWeights(options.dir, model->serve_.precision,
                                              model->serve_.weights_cache, &decoder));
    model->weights_ = std::move(decoder.weights);
    model->from_gguf_ = decoder.gguf != nullptr;
    model->gguf_ = std::move(decoder.gguf);
    model->BuildRope();
    const auto& a = model->arch_;
    const LlmServeConfig& serve = model->serve_;
    const int64_t block = serve.kv_block_size;
    const int64_t per_slot = (serve.context_length + block - 1) / block;
    const bool q8_0 = model->cache_dtype_ == KvCacheDtype::kQ8_0;
    const int64_t block_bytes = KvBlockBytes(a, serve);
    const int64_t blocks =
        serve.kv_cache_bytes > 0 ? serve.kv_cache_bytes / block_bytes : serve.slots * per_slot;
    if (blocks < per_slot) {
      return Status::InvalidArgument(fmt::format(
          "{}: llm.kv_cache_bytes {} holds {} blocks of {} tokens ({} bytes each); one sequence of "
          "context_length {} needs {} ({} bytes)",
          options.dir, serve.kv_cache_bytes, blocks, block, block_bytes, serve.context_length,
          per_slot, per_slot * block_bytes));
    }
    model->blocks_ = static_cast<int>(blocks);
    model->kv_cache_bytes_ = blocks * block_bytes;
    for (int i = 0; i < a.layers; ++i) {
      auto shape = std::vector<int64_t>{a.kv_heads, blocks, block, a.head_dim};
      // Uninitialised: a position is written before anything reads it, and the pages of the
      // cache (1.5 GB for SmolLM2 at 16 slots x 2048) are committed as blocks are first used,
      // not all at load.
      const at::ScalarType cache_dtype = q8_0 ? at::kChar
                                         : model->cache_dtype_ == KvCacheDtype::kBf16
                                             ? at::kBFloat16
                                             : at::kFloat;
      model->cache_k_.push_back(at::empty(shape, cache_dtype));
      model->cache_v_.push_back(at::empty(shape, cache_dtype));
      if (q8_0) {
        shape.back() = a.head_dim / 32;
        model->cache_k_scales_.push_back(at::empty(shape, at::kFloat));
        model->cache_v_scales_.push_back(at::empty(shape, at::kFloat));
      }
    }
  } catch (const c10::Error& e) {
    return Status::Internal(
        fmt::format("{}: loading the model failed: {}", options.dir, e.what_without_backtrace()));
  }
  return std::unique_ptr<StepModel>(std::move(model));
}

void LlamaModel::BuildRope() {
  RopeTables tables = BuildRopeTables(arch_, serve_.context_length);
  rope_cos_ = std::move(tables.cos);
  rope_sin_ = std::move(tables.sin);
  rope_local_cos_ = std::move(tables.local_cos);
  rope_local_sin_ = std::move(tables.local_sin);
  long_rope_row_ = tables.long_row;
}

// The per-token work between the matrix products (norms, rotary embeddings, cache writes, decode
// attention, SwiGLU, residual adds) runs as plain loops over contiguous fp32 rows: as ATen calls
// it was a few thousand small operations per decode step, costing more than a third of the step.

// out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps), as transformers computes it in fp32; with
// `residual`, x[t] += residual[t] first (the residual connection, in the same pass over the rows).
// out may be x (gemma3's post-norms, in place).
void LlamaModel::RmsNorm(at::Tensor& x, const at::Tensor& weight, at::Tensor& out,
                         const float* residual) const {
  const int64_t width = x.size(1);
  float* in = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const auto eps = static_cast<float>(arch_.rms_norm_eps);
  ForRows(x.size(0), [&](int64_t begin, int64_t end) {
    if (residual != nullptr) {
      for (int64_t i = begin * width; i < end * width; ++i) in[i] += residual[i];
    }
    llm::RmsNorm(in + begin * width, end - begin, width, w, eps, o + begin * width);
  });
}

// Rotation: HF's halves layout (the first half of a head pairs with the second), query heads
// then key heads, adjacent in a row.
void LlamaModel::RotateAndCache(int layer, at::Tensor& qkv, const std::vector<int64_t>& positions,
                                const std::vector<int64_t>& rope_rows,
                                const std::vector<int32_t>& chunk_of, int64_t begin, int64_t end) {
  const ModelArchitecture& a = arch_;
  const int64_t d = a.head_dim, half = d / 2, width = qkv.size(1), heads = a.heads + a.kv_heads,
                q_cols = int64_t{a.heads} * d, kv_cols = int64_t{a.kv_heads} * d,
                block = serve_.kv_block_size;
  float* base = qkv.data_ptr<float>();
  // Local layers with a rotary base of their own (gemma3's) read their own tables.
  const bool local = IsLocal(layer) && rope_local_cos_.defined();
  const float* cos_table = (local ? rope_local_cos_ : rope_cos_).data_ptr<float>();
  const float* sin_table = (local ? rope_local_sin_ : rope_sin_).data_ptr<float>();
  void* keys = cache_k_[static_cast<size_t>(layer)].data_ptr();
  void* values = cache_v_[static_cast<size_t>(layer)].data_ptr();
  const bool q8_0 = cache_dtype_ == KvCacheDtype::kQ8_0;
  float* key_scales =
      q8_0 ? cache_k_scales_[static_cast<size_t>(layer)].data_ptr<float>() : nullptr;
  float* value_scales =
      q8_0 ? cache_v_scales_[static_cast<size_t>(layer)].data_ptr<float>() : nullptr;
  auto put = [&](const float* from, void* cache, float* scales, int64_t at) {
    if (cache_dtype_ == KvCacheDtype::kBf16) {
      ToBf16(from, d, static_cast<uint16_t*>(cache) + at);
    } else if (q8_0) {
      QuantizeKvRow(from, d, static_cast<int8_t*>(cache) + at, scales + at / 32);
    } else {
      std::copy_n(from, d, static_cast<float*>(cache) + at);
    }
  };
  for (int64_t t = begin; t < end; ++t) {
    const int64_t position = positions[static_cast<size_t>(t)];
    const int64_t rope_row = local ? position : rope_rows[static_cast<size_t>(t)];
    const float* cos = cos_table + rope_row * half;
    const float* sin = sin_table + rope_row * half;
    float* row = base + t * width;
    if (a.qk_norm) {  // Each query head by q_norm, each key head by k_norm, in place.
      const Layer& weights = weights_.layers[static_cast<size_t>(layer)];
      const auto eps = static_cast<float>(a.rms_norm_eps);
      llm::RmsNorm(row, a.heads, d, weights.q_norm.data_ptr<float>(), eps, row);
      llm::RmsNorm(row + q_cols, a.kv_heads, d, weights.k_norm.data_ptr<float>(), eps,
                   row + q_cols);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* x = row + h * d;
      if (a.rope_interleaved) {
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[2 * i], x2 = x[2 * i + 1];
          x[2 * i] = x1 * cos[i] - x2 * sin[i];
          x[2 * i + 1] = x2 * cos[i] + x1 * sin[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cos[i] - x2 * sin[i];
          x[i + half] = x2 * cos[i] + x1 * sin[i];
        }
      }
    }
    const std::vector<int32_t>& table =
        tables_[static_cast<size_t>(chunk_of[static_cast<size_t>(t)])];
    const int64_t physical = table[static_cast<size_t>(position / block)];
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      const int64_t at = ((h * blocks_ + physical) * block + position % block) * d;
      put(row + q_cols + h * d, keys, key_scales, at);
      put(row + q_cols + kv_cols + h * d, values, value_scales, at);
    }
  }
}

void LlamaModel::LocateKeysAndValues(int layer, const std::vector<SequenceChunk>& chunks) {
  const ModelArchitecture& a = arch_;
  const int64_t d = a.head_dim, block = serve_.kv_block_size, kv = a.kv_heads;
  const int64_t element = CacheElementBytes();
  const int64_t window = IsLocal(layer) ? a.sliding_window : 0;
  const char* keys = static_cast<const char*>(cache_k_[static_cast<size_t>(layer)].data_ptr());
  const char* values = static_cast<const char*>(cache_v_[static_cast<size_t>(layer)].data_ptr());
  const bool q8_0 = cache_dtype_ == KvCacheDtype::kQ8_0;
  const float* key_scales =
      q8_0 ? cache_k_scales_[static_cast<size_t>(layer)].data_ptr<float>() : nullptr;
  const float* value_scales =
      q8_0 ? cache_v_scales_[static_cast<size_t>(layer)].data_ptr<float>() : nullptr;
  kv_base_.assign(chunks.size() * static_cast<size_t>(kv), KvSpan{});
  struct Gather {
    size_t chunk;
    int64_t lo, hi, at;  // Positions [lo, hi) to bytes [at, ...) of gathered_.
  };
  std::vector<Gather> gathers;
  int64_t gathered_bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& chunk = chunks[i];
    const std::vector<int32_t>& table = tables_[i];
    const int64_t hi = chunk.start + static_cast<int64_t>(chunk.tokens.size());
    const int64_t lo = window > 0 ? std::max<int64_t>(0, chunk.start + 1 - window) : 0;
    bool consecutive = true;
    for (int64_t b = lo / block; b + 1 <= (hi - 1) / block; ++b) {
      consecutive &= table[static_cast<size_t>(b) + 1] == table[static_cast<size_t>(b)] + 1;
    }
    if (consecutive) {
      for (int64_t h = 0; h < kv; ++h) {
        const int64_t first_row = (h * blocks_ + table[static_cast<size_t>(lo / block)]) * block;
        kv_base_[i * kv + h] =
            KvSpan{keys, values, key_scales, value_scales, (first_row - lo / block * block) * d};
      }
    } else {
      gathers.push_back(Gather{i, lo, hi, gathered_bytes});
      gathered_bytes += kv * (hi - lo) * d * element;
    }
  }
  if (gathers.empty()) return;
  if (static_cast<int64_t>(gathered_k_.size()) < gathered_bytes) {
    gathered_k_.resize(static_cast<size_t>(gathered_bytes));
    gathered_v_.resize(static_cast<size_t>(gathered_bytes));
  }
  // q8_0: an element's scale at its offset / 32, bytes and elements being one (int8).
  if (q8_0 && static_cast<int64_t>(gathered_k_scales_.size()) < gathered_bytes / 32) {
    gathered_k_scales_.resize(static_cast<size_t>(gathered_bytes / 32));
    gathered_v_scales_.resize(static_cast<size_t>(gathered_bytes / 32));
  }
  const auto jobs = static_cast<int64_t>(gathers.size()) * kv;
#pragma omp parallel for num_threads( \
    static_cast <int>(std::min <int64_t>(at::get_num_threads(), jobs)))
  for (int64_t job = 0; job < jobs; ++job) {
    const Gather& g = gathers[static_cast<size_t>(job / kv)];
    const int64_t h = job % kv;
    const std::vector<int32_t>& table = tables_[g.chunk];
    const int64_t at = g.at + h * (g.hi - g.lo) * d * element;
    for (int64_t p = g.lo; p < g.hi;) {
      const int64_t n = std::min(block - p % block, g.hi - p);
      const int64_t from =
          ((h * blocks_ + table[static_cast<size_t>(p / block)]) * block + p % block) * d * element;
      const int64_t to = at + (p - g.lo) * d * element;
      std::memcpy(gathered_k_.data() + to, keys + from, static_cast<size_t>(n * d * element));
      std::memcpy(gathered_v_.data() + to, values + from, static_cast<size_t>(n * d * element));
      if (q8_0) {
        std::copy_n(key_scales + from / 32, n * d / 32, gathered_k_scales_.data() + to / 32);
        std::copy_n(value_scales + from / 32, n * d / 32, gathered_v_scales_.data() + to / 32);
      }
      p += n;
    }
  }
  for (const Gather& g : gathers) {
    for (int64_t h = 0; h < kv; ++h) {
      const int64_t at = g.at + h * (g.hi - g.lo) * d * element;
      kv_base_[g.chunk * kv + h] =
          KvSpan{gathered_k_.data() + at, gathered_v_.data() + at,
                 q8_0 ? gathered_k_scales_.data() + at / 32 : nullptr,
                 q8_0 ? gathered_v_scales_.data() + at / 32 : nullptr, -g.lo * d};
    }
  }
}

// Attention for every token, after this step's keys and values were written to the cache.
// qkv: [T, (H + 2 KV) D]; out: [T, H D]. A task is a run of consecutive tokens of one chunk and
// one KV head, shared among the threads: each token's query heads of that group attend over its
// slot's cache up to and including its own position (causal by construction) with
// DecodeAttentionRows, which reads each cached key once for the run's tokens and gives each token
// the bits it gets alone. A prompt's chunk goes the same way as decoding tokens, over cache rows
// that stay in L2 across the chunk's tokens: through at::scaled_dot_product_attention (its
// queries permuted, the cache widened to fp32, an explicit causal mask) a 128-token prompt's
// attention took 11 ms of a 42 ms prefill.
void LlamaModel::Attention(int layer, const at::Tensor& qkv,
                           const std::vector<SequenceChunk>& chunks,
                           const std::vector<int64_t>& offsets, at::Tensor& out) {
  const ModelArchitecture& a = arch_;
  const int64_t groups = a.heads / a.kv_heads, d = a.head_dim, width = qkv.size(1);
  LocateKeysAndValues(layer, chunks);
  const int threads_wanted = at::get_num_threads();
  // A sliding-window layer: each token over the last `window` positions, its own included; its
  // tokens' spans start at different positions, so they go one at a time.
  const int64_t window = IsLocal(layer) ? a.sliding_window : 0;
  // Runs of at most 16 tokens, and at least two tasks a thread where the step's tokens allow (a
  // verifying step's 5 tokens x 3 KV heads: runs of 3 and 2, six tasks, not three of 5): the
  // threads take tasks from a shared counter, the last runs (the longest spans) first.
  struct Task {
    size_t chunk;
    int64_t first, rows, h;  // Tokens [first, first + rows) of the chunk.
  };
  std::vector<Task> tasks;
  int64_t total_rows = 0, scratch_floats = 0;
  for (const SequenceChunk& chunk : chunks) total_rows += static_cast<int64_t>(chunk.tokens.size());
  const int64_t wanted_tasks = 2 * int64_t{threads_wanted};
  const int64_t per_run =
      window > 0 ? 1 : std::clamp<int64_t>(total_rows * a.kv_heads / wanted_tasks, 1, 16);
  for (size_t i = chunks.size(); i-- > 0;) {
    const SequenceChunk& chunk = chunks[i];
    const auto len = static_cast<int64_t>(chunk.tokens.size());
    const int64_t runs = (len + per_run - 1) / per_run;
    for (int64_t run = runs; run-- > 0;) {
      // Runs of equal size, give or take one token.
      const int64_t first = len * run / runs, rows = len * (run + 1) / runs - first;
      scratch_floats = std::max(scratch_floats, rows * groups * (chunk.start + first + rows));
      for (int64_t h = 0; h < a.kv_heads; ++h) tasks.push_back(Task{i, first, rows, h});
    }
  }
  const float scale = a.attention_scale > 0 ? static_cast<float>(a.attention_scale)
                                            : 1.0f / std::sqrt(static_cast<float>(d));
  const float* rows_in = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  // gpt-oss's sinks: each KV head's query heads' logits, beside its queries.
  const at::Tensor& sinks = weights_.layers[static_cast<size_t>(layer)].sinks;
  const float* sink_logits = sinks.defined() ? sinks.data_ptr<float>() : nullptr;
  const auto task_count = static_cast<int64_t>(tasks.size());
  const int threads = static_cast<int>(std::min<int64_t>(threads_wanted, task_count));
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats));
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < task_count;) {
      const Task& task = tasks[static_cast<size_t>(t)];
      const SequenceChunk& chunk = chunks[task.chunk];
      // Positions up to the run's last token's.
      const int64_t end = chunk.start + task.first + task.rows;
      const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
      const int64_t len = end - first;
      const KvSpan& span =
          kv_base_[task.chunk * static_cast<size_t>(a.kv_heads) + static_cast<size_t>(task.h)];
      const int64_t cache_row = span.offset + first * d;
      const int64_t row = offsets[task.chunk] + task.first;
      const float* q = rows_in + row * width + task.h * groups * d;
      float* result = o + row * a.heads * d + task.h * groups * d;
      const int rows = static_cast<int>(task.rows);
      const float* task_sinks = sink_logits == nullptr ? nullptr : sink_logits + task.h * groups;
      if (cache_dtype_ == KvCacheDtype::kQ8_0) {
        // Element e's scale at e / 32 from the span's start; cache_row is a multiple of D.
        DecodeAttentionRows(
            q, width, rows, static_cast<int>(groups),
            reinterpret_cast<const int8_t*>(span.k) + cache_row, span.k_scales + cache_row / 32,
            reinterpret_cast<const int8_t*>(span.v) + cache_row, span.v_scales + cache_row / 32,
            len, d, scale, result, a.heads * d, scratch.data(), task_sinks);
      } else if (cache_dtype_ == KvCacheDtype::kBf16) {
        DecodeAttentionRows(q, width, rows, static_cast<int>(groups),
                            reinterpret_cast<const uint16_t*>(span.k) + cache_row,
                            reinterpret_cast<const uint16_t*>(span.v) + cache_row, len, d, scale,
                            result, a.heads * d, scratch.data(), task_sinks);
      } else {
        DecodeAttentionRows(q, width, rows, static_cast<int>(groups),
                            reinterpret_cast<const float*>(span.k) + cache_row,
                            reinterpret_cast<const float*>(span.v) + cache_row, len, d, scale,
                            result, a.heads * d, scratch.data(), task_sinks);
      }
    }
  }
}

at::Tensor LlamaModel::Buffer(size_t i, int64_t rows, int64_t columns) {
  if (buffers_.size() <= i) buffers_.resize(i + 1);
  at::Tensor& buffer = buffers_[i];
  const int64_t size = rows * columns;
  if (!buffer.defined() || buffer.numel() < size) buffer = at::empty({size}, at::kFloat);
  return buffer.narrow(0, 0, size).view({rows, columns});
}

std::vector<std::pair<const at::Tensor*, int64_t>> LlamaModel::BlockSlices() const {
  // A block of one head: its values' bytes, and a q8_0 cache's scales' bytes.
  const int64_t values = int64_t{serve_.kv_block_size} * arch_.head_dim;
  std::vector<std::pair<const at::Tensor*, int64_t>> caches;
  for (size_t layer = 0; layer < cache_k_.size(); ++layer) {
    caches.emplace_back(&cache_k_[layer], values * CacheElementBytes());
    caches.emplace_back(&cache_v_[layer], values * CacheElementBytes());
    if (cache_dtype_ == KvCacheDtype::kQ8_0) {
      caches.emplace_back(&cache_k_scales_[layer], values / 32 * 4);
      caches.emplace_back(&cache_v_scales_[layer], values / 32 * 4);
    }
  }
  return caches;
}

Status LlamaModel::CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  for (const auto& [from, to] : copies) {
    if (from < 0 || from >= blocks_ || to < 0 || to >= blocks_ || from == to) {
      return Status::Internal(fmt::format("cannot copy block {} to block {}", from, to));
    }
  }
  for (const auto& [cache, bytes] : BlockSlices()) {
    char* base = static_cast<char*>(cache->data_ptr());
    for (int64_t h = 0; h < arch_.kv_heads; ++h) {
      for (const auto& [from, to] : copies) {
        std::memcpy(base + (h * blocks_ + to) * bytes, base + (h * blocks_ + from) * bytes,
                    static_cast<size_t>(bytes));
      }
    }
  }
  return Status::Ok();
}

std::string LlamaModel::kv_layout() const {
  return fmt::format("kv {} block {} layers {} kv_heads {} head_dim {} precision {} arch {}",
                     kv_cache_format(), serve_.kv_block_size, arch_.layers, arch_.kv_heads,
                     arch_.head_dim, static_cast<int>(serve_.precision), arch_.name);
}

Status LlamaModel::ReadKvBlock(int32_t block, std::string* out) const {
  if (block < 0 || block >= blocks_) {
    return Status::Internal(fmt::format("cannot read block {}", block));
  }
  out->clear();
  for (const auto& [cache, bytes] : BlockSlices()) {
    const char* base = static_cast<const char*>(cache->data_ptr());
    for (int64_t h = 0; h < arch_.kv_heads; ++h) {
      out->append(base + (h * blocks_ + block) * bytes, static_cast<size_t>(bytes));
    }
  }
  return Status::Ok();
}

Status LlamaModel::WriteKvBlock(int32_t block, const std::string& data) {
  const auto slices = BlockSlices();
  int64_t total = 0;
  for (const auto& [cache, bytes] : slices) total += bytes * arch_.kv_heads;
  if (block < 0 || block >= blocks_ || static_cast<int64_t>(data.size()) != total) {
    return Status::Internal(fmt::format("cannot write {} bytes into block {} (a block holds {})",
                                        data.size(), block, total));
  }
  size_t at = 0;
  for (const auto& [cache, bytes] : slices) {
    char* base = static_cast<char*>(cache->data_ptr());
    for (int64_t h = 0; h < arch_.kv_heads; ++h) {
      std::memcpy(base + (h * blocks_ + block) * bytes, data.data() + at,
                  static_cast<size_t>(bytes));
      at += static_cast<size_t>(bytes);
    }
  }
  return Status::Ok();
}

Status LlamaModel::Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) {
  if (chunks.empty()) return Status::Ok();
  const ModelArchitecture& a = arch_;
  auto assembled =
      AssembleStep(chunks, StepGeometry{.block_size = serve_.kv_block_size,
                                        .context_length = serve_.context_length,
                                        .blocks = blocks_,
                                        .vocab_size = a.vocab_size,
                                        .long_rope_row = long_rope_row_,
                                        .rope_original_context = a.rope_original_max_positions});
  if (!assembled.ok()) return assembled.status();
  StepBatch& step = *assembled;
  const std::vector<int64_t>& tokens = step.tokens;
  const std::vector<int64_t>& positions = step.positions;
  const std::vector<int64_t>& offsets = step.offsets;
  const std::vector<int64_t>& logit_rows = step.logit_rows;
  const std::vector<int64_t>& rope_rows = step.rope_rows;
  const std::vector<int32_t>& chunk_of = step.chunk_of;
  tables_ = std::move(step.tables);
  std::vector<LoraGroup> lora;
  {
    std::vector<std::pair<const LoraAdapter*, std::vector<int64_t>>> rows;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const LoraAdapter* adapter = chunks[i].lora;
      if (adapter == nullptr) continue;
      auto it = std::find_if(rows.begin(), rows.end(),
                             [adapter](const auto& entry) { return entry.first == adapter; });
      if (it == rows.end()) it = rows.insert(rows.end(), {adapter, {}});
      for (int64_t j = 0; j < static_cast<int64_t>(chunks[i].tokens.size()); ++j) {
        it->second.push_back(offsets[i] + j);
      }
    }
    for (auto& [adapter, indices] : rows) {
      LoraGroup group{adapter, indices.front(), static_cast<int64_t>(indices.size()), {}};
      if (indices.back() - indices.front() + 1 != group.count) {
        group.rows = at::tensor(indices, at::kLong);
      }
      lora.push_back(std::move(group));
    }
  }
  UseIntraOpThreads(serve_.threads);
  try {
    c10::InferenceMode guard;
    const int64_t total = static_cast<int64_t>(tokens.size()), hidden = a.hidden_size,
                  inter = a.intermediate_size;
    at::Tensor x = Buffer(0, total, hidden);
    if (weights_.embedding_blocks != nullptr) {
      const int64_t row_bytes = QuantRowBytes(weights_.embedding_type, hidden);
      float* xp_rows = x.data_ptr<float>();
      for (int64_t t = 0; t < total; ++t) {
        const int64_t token = tokens[static_cast<size_t>(t)];
        if (weights_.embedding_repacked) {
          DequantizeRepackedRow(weights_.embedding_type, weights_.embedding_blocks, hidden, token,
                                xp_rows + t * hidden);
        } else {
          DequantizeRow(weights_.embedding_type,
                        static_cast<const uint8_t*>(weights_.embedding_blocks) + token * row_bytes,
                        hidden, xp_rows + t * hidden);
        }
      }
    } else {
      x.copy_(weights_.embedding.index_select(0, at::tensor(tokens, at::kLong)));
    }
    if (a.scale_embedding) x.mul_(std::sqrt(static_cast<float>(hidden)));
    at::Tensor normed = Buffer(1, total, hidden);
    at::Tensor qkv = Buffer(2, total, weights_.layers.front().qkv.out);
    at::Tensor heads = Buffer(3, total, int64_t{a.heads} * a.head_dim);
    at::Tensor attn = Buffer(4, total, hidden);
    const bool moe = a.experts > 0;  // Then the experts' own buffers (MixtureOfExperts).
    at::Tensor gate_up = Buffer(5, total, moe ? 0 : 2 * inter);
    at::Tensor act = Buffer(6, total, moe ? 0 : inter);
    at::Tensor down = Buffer(7, total, hidden);  // The last layer's MLP output ...
    const float* xp = x.data_ptr<float>();
    const float* pending = nullptr;  // ... once there is one, not yet added to x.
    for (int l = 0; l < a.layers; ++l) {
      const Layer& layer = weights_.layers[static_cast<size_t>(l)];
      RmsNorm(x, layer.attn_norm, normed, pending);
      layer.qkv.Into(normed, qkv.data_ptr<float>());
      if (!lora.empty()) ApplyLora(lora, l, LoraProduct::kQkv, normed, qkv);
      ForRows(total, [&](int64_t begin, int64_t end) {
        RotateAndCache(l, qkv, positions, rope_rows, chunk_of, begin, end);
      });
      Attention(l, qkv, chunks, offsets, heads);
      layer.out.Into(heads, attn.data_ptr<float>());
      if (!lora.empty()) ApplyLora(lora, l, LoraProduct::kO, heads, attn);
      if (a.post_norms) RmsNorm(attn, layer.post_attn_norm, attn);  // In place.
      RmsNorm(x, layer.ffn_norm, normed, attn.data_ptr<float>());
      if (moe) {
        MixtureOfExperts(layer, normed, down);
        if (a.post_norms) RmsNorm(down, layer.post_ffn_norm, down);
        pending = down.data_ptr<float>();
        continue;
      }
      layer.gate_up.Into(normed, gate_up.data_ptr<float>());
      if (!lora.empty()) ApplyLora(lora, l, LoraProduct::kGateUp, normed, gate_up);
      const float* gu = gate_up.data_ptr<float>();
      float* actp = act.data_ptr<float>();
      ForRows(total, [&](int64_t begin, int64_t end) {
        GatedActivation(a, gu + begin * 2 * inter, end - begin, inter, actp + begin * inter);
      });
      layer.down.Into(act, down.data_ptr<float>());
      if (!lora.empty()) ApplyLora(lora, l, LoraProduct::kDown, act, down);
      if (a.post_norms) RmsNorm(down, layer.post_ffn_norm, down);
      pending = down.data_ptr<float>();
    }
    // The last residual, for the rows whose logits are wanted only.
    at::Tensor last = at::empty({static_cast<int64_t>(logit_rows.size()), hidden}, at::kFloat);
    float* lp = last.data_ptr<float>();
    for (size_t r = 0; r < logit_rows.size(); ++r) {
      const int64_t row = logit_rows[r] * hidden;
      for (int64_t c = 0; c < hidden; ++c) {
        lp[static_cast<int64_t>(r) * hidden + c] =
            pending != nullptr ? xp[row + c] + pending[row + c] : xp[row + c];
      }
    }
    at::Tensor last_normed = at::empty_like(last);
    RmsNorm(last, weights_.final_norm, last_normed);
    const size_t before = logits->size();
    if (serve_.pooling != Pooling::kNone) {
      // An embedding model: the rows are the hidden states themselves.
      const float* np = last_normed.data_ptr<float>();
      logits->insert(logits->end(), np, np + last_normed.numel());
      return Status::Ok();
    }
    logits->resize(before + static_cast<size_t>(last.size(0) * weights_.lm_head.out));
    weights_.lm_head.Into(last_normed, logits->data() + before);
    if (a.final_logit_softcap > 0) {
      const auto cap = static_cast<float>(a.final_logit_softcap);
      for (size_t i = before; i < logits->size(); ++i) {
        (*logits)[i] = cap * std::tanh((*logits)[i] / cap);
      }
    }
  } catch (const c10::Error& e) {
    return Status::Internal(fmt::format("model step failed: {}", e.what_without_backtrace()));
  }
  return Status::Ok();
}

Status LlamaModel::CanApplyLora() const { return Status::Ok(); }

void LlamaModel::ApplyLora(const std::vector<LoraGroup>& groups, int layer, LoraProduct product,
                           const at::Tensor& in, at::Tensor& out) {
  // On this thread alone: products this small gain nothing from more threads, and each parallel
  // region would wake the OpenMP team from its sleep (tens of microseconds, a thousand times a
  // step).
  const OneOmpThread one_thread;
  for (const LoraGroup& group : groups) {
    const LoraWeights& w =
        group.adapter->layers[static_cast<size_t>(layer)][static_cast<size_t>(product)];
    if (w.empty()) continue;
    const int64_t rank = w.rank, in_dim = in.size(1), out_dim = out.size(1);
    const at::Tensor a = at::from_blob(const_cast<float*>(w.a.data()), {rank, in_dim}, at::kFloat);
    const at::Tensor b = at::from_blob(const_cast<float*>(w.b.data()), {out_dim, rank}, at::kFloat);
    if (!group.rows.defined()) {
      // Consecutive rows: both products on the row range, the second added in place.
      at::Tensor rows = out.narrow(0, group.begin, group.count);
      rows.addmm_(at::mm(in.narrow(0, group.begin, group.count), a.t()), b.t());
    } else {
      const at::Tensor x = in.index_select(0, group.rows);
      out.index_add_(0, group.rows, at::mm(at::mm(x, a.t()), b.t()));
    }
  }
}

// Each distinct format of the linear layers' parts, in the order first met.
std::string LlamaModel::weight_formats() const {
  std::vector<std::string> formats;
  auto add = [&](const Linear& linear) {
    for (const Linear::Part& part : linear.parts) {
      std::string name = part.blocks != nullptr  ? GgmlTypeName(part.type)
                         : part.fp32()           ? "fp32"
                         : part.scales.defined() ? "int8"
                                                 : "bf16";
      if (std::find(formats.begin(), formats.end(), name) == formats.end()) {
        formats.push_back(std::move(name));
      }
    }
  };
  for (const Layer& layer : weights_.layers) {
    for (const Linear* linear : layer.Linears()) add(*linear);
  }
  add(weights_.lm_head);
  return fmt::format("{}", fmt::join(formats, "+"));
}

LlamaModel::KernelUse LlamaModel::Kernels() const {
  KernelUse use;
  auto& [blocks, vectors, grid, tiles] = use;
  auto repacked = [&](const Linear& linear) {
    for (const Linear::Part& part : linear.parts) {
      if (part.blocks == nullptr || !part.repacked) continue;
      grid = grid || VbmiGridsInUse(part.type);
      tiles = tiles || TakesInt8Tiles(part.type);
    }
  };
  for (const Layer& layer : weights_.layers) {
    for (const Linear* linear : layer.Linears()) {
      for (const Linear::Part& part : linear->parts) {
        blocks = blocks || part.blocks != nullptr;
        vectors = vectors || (part.blocks == nullptr && !part.fp32());
      }
      repacked(*linear);
    }
  }
  repacked(weights_.lm_head);
  return use;
}

int LlamaModel::default_step_tokens() const {
  return Kernels().tiles && Int8TilesInUse() ? kTileStepTokens : kStepTokens;
}

std::string LlamaModel::kernel_paths() const {
  const auto [blocks, vectors, grid, tiles] = Kernels();
  std::vector<std::string> paths;
  // A grid read by AVX-512 VBMI's permutes and the K-quants' prompt products on int8 tiles
  // (kernels.h): "avx512vnni+vbmi", "avx512vnni+tiles".
  if (blocks) {
    paths.emplace_back(std::string(QuantKernelIsa()) + (grid ? "+vbmi" : "") +
                       (tiles && Int8TilesInUse() ? "+tiles" : ""));
  }
  if (vectors || !blocks) paths.emplace_back(CpuKernelIsa());
  return fmt::format("{}", fmt::join(paths, "+"));
}

}  // namespace sluice::llm::llama

namespace sluice::llm {

Result<std::unique_ptr<StepModel>> LoadLlamaModel(const ModelLoadOptions& options) {
  return llama::LlamaModel::Load(options);
}

std::string LlmRuntimeVersion() { return fmt::format("libtorch {}", TORCH_VERSION); }

}  // namespace sluice::llm
