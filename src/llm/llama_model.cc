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

#include "llm/files/gguf.h"
#include "llm/files/safetensors.h"
#include "llm/huge_pages.h"
#include "llm/kernels/kernels.h"
#include "llm/step_model.h"

namespace sluice::llm {
namespace {

// Whether int8 weights take the block products: on CPUs whose vector path is AVX2 (no AVX-512
// BF16), with rows of whole blocks of 32. There, as Q8_0 blocks, 16 streams ran at 221-224 output
// tokens/s against 172-184 with the widening int8 kernels, a 128-token prefill in 198 ms against
// 242-281 (AMD EPYC, AVX2, in-process, interleaved). With AVX-512 BF16 or AMX the int8 path of
// kernels.h stays: on an AMD EPYC with AVX-512 VNNI and BF16 the block products (then row by row)
// ran 16 streams at 160 output tokens/s where that path ran 396.
bool Int8AsBlocks(int64_t columns) {
  return std::string_view(CpuKernelIsa()) == KernelIsaName(KernelIsa::kAvx2) &&
         BestQuantIsa() >= QuantIsa::kAvx2 && columns % 32 == 0;
}

// Whether GGUF blocks (and int8 weights as Q8_0) that kernels.h can repack are repacked at load:
// on unless SLUICE_QUANT_REPACK=0, which keeps the file's layout (to compare the two).
bool RepackBlocks() {
  static const bool repack = [] {
    const char* value = std::getenv("SLUICE_QUANT_REPACK");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return repack;
}

// An uninitialised 1-D tensor of `numel` elements of `dtype` for weights that every step reads
// whole, in huge-page-advised memory (llm/huge_pages.h); at::empty's when the arena has none.
at::Tensor WeightTensor(int64_t numel, at::ScalarType dtype) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  HugePageBlock block = HugePageArena::Shared().Allocate(std::max<int64_t>(bytes, 1));
  if (block.data == nullptr) return at::empty({numel}, dtype);
  return at::from_blob(
      block.data, {numel}, [owner = std::move(block.owner)](void*) mutable { owner.reset(); },
      at::TensorOptions().dtype(dtype));
}

// Gives back the pages of a mapped file range that a repacked copy replaced: they stay in the
// page cache, but no longer count in the process's resident memory (read again on a later touch,
// as the embedding's rows are when the output head is tied to them).
void ReleaseMappedPages(const void* data, int64_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end =
      (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) & ~(page - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// A linear layer y = x W^T (+ b), x fp32, its output columns in parts, each a weight matrix of its
// own kind: fp32 [rows, in] (ATen's matmul); bf16 or int8 packed for kernels/kernels.h (+ per-row
// fp32 scales for int8); or a GGUF file's quantised blocks, read where the file is mapped, or
// (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) repacked at load into the layout kernels.h streams fastest.
// A Hugging Face model's layers are one part each (q, k and v stacked into one matrix); a GGUF
// file's are one part per tensor, as its tensors may differ in type (Q4_K_M keeps v in Q6_K, q
// and k in Q4_K).
struct Linear {
  struct Part {
    int64_t first = 0, rows = 0;   // Output columns [first, first + rows).
    at::Tensor weight;             // fp32 [rows, in]; or bf16 / int8 [PackedSize(rows, in)].
    at::Tensor scales;             // [rows], fp32: int8 only.
    const void* blocks = nullptr;  // GGUF blocks, rows x QuantRowBytes(type, in) bytes ...
    uint32_t type = 0;             // ... of this GgmlType ...
    bool repacked = false;         // ... as RepackQuant lays them out (held in `weight`).
    bool fp32() const { return blocks == nullptr && weight.scalar_type() == at::kFloat; }
    int64_t bytes(int64_t in) const {
      if (blocks != nullptr) return rows * QuantRowBytes(type, in);
      return weight.nbytes() + (scales.defined() ? static_cast<int64_t>(scales.nbytes()) : 0);
    }
  };
  std::vector<Part> parts;
  at::Tensor bias;  // fp32 [out]; undefined when none.
  int64_t out = 0, in = 0;

  // One part from a float matrix [rows, in], in `precision`.
  void Add(const at::Tensor& w, LlmPrecision precision) {
    Part part;
    part.first = out;
    part.rows = w.size(0);
    in = w.size(1);
    const at::Tensor w32 = w.to(at::kFloat).contiguous();
    if (precision == LlmPrecision::kFp32) {
      part.weight = w32;
    } else if (precision == LlmPrecision::kBf16) {
      const at::Tensor bf16 = w32.to(at::kBFloat16).contiguous();
      part.weight = WeightTensor(PackedSize(part.rows, in), at::kBFloat16);
      PackBf16(static_cast<const uint16_t*>(bf16.data_ptr()), part.rows, in,
               static_cast<uint16_t*>(part.weight.data_ptr()));
    } else if (Int8AsBlocks(in)) {
      // Without AMX's int8 tiles, int8 weights go through the block products (AVX-512 VNNI,
      // AVX-VNNI, AVX2): as Q8_0, a scale per 32 weights, x quantised to int8 per 32 as well.
      const int64_t row_bytes = QuantRowBytes(static_cast<uint32_t>(GgmlType::kQ8_0), in);
      part.weight = at::empty({part.rows * row_bytes}, at::kByte);
      QuantizeQ8_0(w32.data_ptr<float>(), part.rows * in, part.weight.data_ptr<uint8_t>());
      part.blocks = part.weight.data_ptr<uint8_t>();
      part.type = static_cast<uint32_t>(GgmlType::kQ8_0);
      Repack(&part, in);
    } else {  // Per row: scale = max |w| / 127, q = round(w / scale).
      part.scales = (w32.abs().amax(1).clamp_min(1e-8) / 127.0).contiguous();
      const at::Tensor q =
          at::round(w32 / part.scales.unsqueeze(1)).clamp(-127, 127).to(at::kChar).contiguous();
      part.weight = WeightTensor(PackedSize(part.rows, in), at::kChar);
      PackInt8(q.data_ptr<int8_t>(), part.rows, in, part.weight.data_ptr<int8_t>());
    }
    out += part.rows;
    parts.push_back(std::move(part));
  }
  // One part of GGUF blocks: `rows` rows of `columns` weights of `type`.
  void AddBlocks(const void* blocks, uint32_t type, int64_t rows, int64_t columns) {
    Part part;
    part.first = out;
    part.rows = rows;
    part.blocks = blocks;
    part.type = type;
    in = columns;
    if (Repack(&part, columns)) ReleaseMappedPages(blocks, rows * QuantRowBytes(type, columns));
    out += rows;
    parts.push_back(std::move(part));
  }
  // A block part's weights repacked into a buffer of its own, where kernels.h can: the products
  // then read eight rows as one stream and transpose nothing (kernels.h), with the same results.
  static bool Repack(Part* part, int64_t columns) {
    if (!RepackBlocks() || !CanRepackQuant(part->type, part->rows)) return false;
    at::Tensor packed = WeightTensor(part->rows * QuantRowBytes(part->type, columns), at::kByte);
    RepackQuant(part->type, part->blocks, part->rows, columns, packed.data_ptr<uint8_t>());
    part->weight = std::move(packed);
    part->blocks = part->weight.data_ptr<uint8_t>();
    part->repacked = true;
    return true;
  }

  // y = x W^T (+ b) into `yp`: [rows of x, out], contiguous.
  void Into(const at::Tensor& x, float* yp) const {
    const int64_t m = x.size(0), n = out;
    at::Tensor y = at::from_blob(yp, {m, n}, x.options());
    bool vector_parts = false, int8_parts = false, block_parts = false;
    for (const Part& part : parts) {
      if (part.fp32()) {
        at::Tensor columns = y.narrow(1, part.first, part.rows);
        if (part.rows == n) {
          at::mm_out(columns, x, part.weight.t());
        } else {
          columns.copy_(at::mm(x, part.weight.t()));
        }
      } else if (part.blocks != nullptr) {
        block_parts = true;
      } else {
        vector_parts = true;
        int8_parts = int8_parts || part.scales.defined();
      }
    }
    if (vector_parts || block_parts) Products(x, yp, vector_parts, int8_parts, block_parts);
    if (bias.defined()) y.add_(bias);
  }

  // The bf16, int8 and block parts' columns, shared among the intra-op threads.
  void Products(const at::Tensor& x, float* yp, bool vector_parts, bool int8_parts,
                bool block_parts) const {
    const int64_t m = x.size(0), k = in, n = out;
    const at::Tensor input = x.contiguous();
    const float* xp = input.data_ptr<float>();
    // Threads take runs of output columns from a shared counter, so a thread that joins the
    // region late takes fewer instead of holding up the others at its end (equal halves left the
    // first thread waiting out every wake-up of the second: several ms per token). A run is a
    // share of what is left (guided scheduling), a multiple of 16 columns (an AMX tile) and at
    // least 16: large runs while much is left, single tiles at the end, so the threads finish
    // within a tile of each other (with fixed runs of 64, a 576-column matrix split 5 : 4).
    constexpr int64_t kTile = 16;
    const int64_t blocks = (n + kTile - 1) / kTile;
    std::atomic<int64_t> next{0};
    const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), blocks));
    // x is rounded and laid out for the kernels once and shared by every run: for a prompt's
    // rows by the threads together, a share of the work each (done by one thread, it held the
    // other idle for a tenth of a prompt step); for up to 16 rows (decoding) by this thread, as
    // the barrier after a shared preparation costs what sharing saves.
    // (The region's threads reach this thread's buffers through `shared_input`: named inside the
    // region, the thread_local would be each thread's own.)
    thread_local MatmulInput prepared;
    thread_local QuantInput quantised;
    MatmulInput& shared_input = prepared;
    const QuantInput& block_input = quantised;
    QuantInput& shared_quantised = quantised;
    int64_t x_units = 0;
    if (vector_parts) {
      shared_input.Reserve(xp, m, k, int8_parts);
      x_units = shared_input.Units();
    }
    if (block_parts) quantised.Reserve(xp, m, k);
    const bool shared_prepare = threads > 1 && m > 16 && (block_parts || x_units > 1);
    if (!shared_prepare) {
      if (vector_parts) shared_input.Fill(0, x_units);
      if (block_parts) quantised.Fill(0, m);
    }
    const MatmulInput& rows = shared_input;
    const int64_t shares = 2 * int64_t{threads};
    auto run = [&](int64_t first, int64_t last) {
      for (const Part& part : parts) {
        const int64_t begin = std::max(first, part.first) - part.first;
        const int64_t end = std::min(last, part.first + part.rows) - part.first;
        if (begin >= end || part.fp32()) continue;
        float* y = yp + part.first;
        if (part.blocks != nullptr) {
          if (part.repacked) {
            MatmulQuantRepacked(block_input, part.type, part.blocks, n, y, begin, end);
          } else {
            MatmulQuant(block_input, part.type, part.blocks, n, y, begin, end);
          }
        } else if (part.scales.defined()) {
          MatmulInt8(rows, part.weight.data_ptr<int8_t>(), part.scales.data_ptr<float>(), n, y,
                     begin, end);
        } else {
          MatmulBf16(rows, static_cast<const uint16_t*>(part.weight.data_ptr()), n, y, begin, end);
        }
      }
    };
#pragma omp parallel num_threads(threads)
    {
      if (shared_prepare) {
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        if (vector_parts) shared_input.Fill(x_units * t / team, x_units * (t + 1) / team);
        if (block_parts) shared_quantised.Fill(m * t / team, m * (t + 1) / team);
#pragma omp barrier
      }
      for (int64_t first = next.load(std::memory_order_relaxed); first < n;) {
        int64_t tiles = (blocks - first / kTile) / shares;
        tiles = tiles >= 4 ? tiles / 4 * 4 : std::max<int64_t>(1, tiles);  // Whole k steps of 4.
        const int64_t last = std::min(n, first + tiles * kTile);
        // On failure `first` becomes the counter's current value: another thread took the run.
        if (!next.compare_exchange_weak(first, last, std::memory_order_relaxed)) continue;
        run(first, last);
        first = next.load(std::memory_order_relaxed);
      }
    }
  }
  int64_t bytes() const {
    int64_t total = bias.defined() ? static_cast<int64_t>(bias.nbytes()) : 0;
    for (const Part& part : parts) total += part.bytes(in);
    return total;
  }
};

struct Layer {
  at::Tensor attn_norm, ffn_norm;            // [hidden], compute dtype.
  at::Tensor q_norm, k_norm;                 // [D], fp32: qwen3 and gemma3.
  at::Tensor post_attn_norm, post_ffn_norm;  // [hidden], fp32: gemma3 (post_norms).
  Linear qkv;                                // q, k, v projections stacked: [(H + 2 KV) D, hidden].
  Linear out;                                // [hidden, H D].
  Linear gate_up;                            // gate and up stacked: [2 I, hidden].
  Linear down;                               // [hidden, I].
};

at::ScalarType TorchDtype(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  return at::kByte;  // Rejected by the caller.
}

// fn(begin, end) over the rows [0, rows), split evenly among the intra-op threads; inline for a
// single row. For the per-row work between the matrix products (norms, rotary embeddings and
// cache writes, SwiGLU): one thread doing it for 16 decoding sequences took a tenth of the step.
template <class Fn>
void ForRows(int64_t rows, const Fn& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), rows));
  if (threads <= 1) return fn(int64_t{0}, rows);
#pragma omp parallel num_threads(threads)
  {
    const int64_t per = (rows + threads - 1) / threads;
    const int64_t begin = std::min(rows, omp_get_thread_num() * per);
    const int64_t end = std::min(rows, begin + per);
    if (begin < end) fn(begin, end);
  }
}

class LlamaModel final : public StepModel {
 public:
  static Result<std::unique_ptr<StepModel>> Load(const ModelLoadOptions& options);

  const ModelArchitecture& architecture() const override { return arch_; }
  int slots() const override { return serve_.slots; }
  int context_length() const override { return serve_.context_length; }
  int kv_block_size() const override { return serve_.kv_block_size; }
  int kv_blocks() const override { return blocks_; }
  int64_t kv_cache_bytes() const override { return kv_cache_bytes_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  std::string weight_formats() const override;
  std::string kernel_paths() const override;
  Status Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) override;
  Status CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) override;

 private:
  Status LoadWeights(const SafetensorsFile& file);
  Status LoadGgufWeights(const GgufFile& file);
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
  void RotateAndCache(int layer, at::Tensor& qkv, const std::vector<int64_t>& positions,
                      const std::vector<int32_t>& chunk_of, int64_t begin, int64_t end);
  void RmsNorm(at::Tensor& x, const at::Tensor& weight, at::Tensor& out,
               const float* residual = nullptr) const;
  bool IsLocal(int layer) const {
    return !arch_.local_layers.empty() && arch_.local_layers[static_cast<size_t>(layer)];
  }

  ModelArchitecture arch_;
  LlmServeConfig serve_;
  at::ScalarType weight_dtype_ = at::kFloat;  // Of the embedding and unquantised linear layers.
  at::Tensor embedding_;                      // [vocab, hidden]; or, from a GGUF file, ...
  const void* embedding_blocks_ = nullptr;    // ... its quantised rows, of ...
  uint32_t embedding_type_ = 0;               // ... this GgmlType.
  std::unique_ptr<GgufFile> gguf_;            // Mapped while its blocks are read.
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  Linear lm_head_;
  at::Tensor rope_cos_, rope_sin_;              // [context, D/2], fp32.
  at::Tensor rope_local_cos_, rope_local_sin_;  // The same for sliding-window layers, where any.
  // Per layer: [KV, blocks, block_size, D]: a head's consecutive blocks are contiguous.
  std::vector<at::Tensor> cache_k_, cache_v_;
  int blocks_ = 0;
  int64_t kv_cache_bytes_ = 0;  // blocks_ x the bytes of a block over every layer.
  // This step's block table of each chunk (its own, or its slot's static one).
  std::vector<std::vector<int32_t>> tables_;
  struct KvSpan {
    const char* k = nullptr;
    const char* v = nullptr;
    int64_t offset = 0;  // Elements: position p's row starts at offset + p x D.
  };
  std::vector<KvSpan> kv_base_;                // [chunk x KV + h], for the layer at hand.
  std::vector<char> gathered_k_, gathered_v_;  // Rows of tables that are not consecutive.
  // The cache holds bf16 when the weights are bf16 or int8 (half the bytes decode attention reads;
  // transformers' bf16 model keeps a bf16 cache too), fp32 with fp32 weights.
  bool bf16_cache_ = false;
  int64_t weight_bytes_ = 0;
  std::vector<at::Tensor> buffers_;
};

Result<std::unique_ptr<StepModel>> LlamaModel::Load(const ModelLoadOptions& options) {
  namespace fs = std::filesystem;
  auto model = std::make_unique<LlamaModel>();
  auto gguf_path = FindGgufFile(options.dir);
  if (!gguf_path.ok()) return gguf_path.status();
  std::unique_ptr<GgufFile> gguf;
  if (!gguf_path->empty()) {
    auto opened = GgufFile::Open(*gguf_path);
    if (!opened.ok()) return opened.status();
    gguf = std::move(*opened);
  }
  auto arch = gguf != nullptr ? ArchitectureFromGguf(*gguf)
                              : ParseArchitecture((fs::path(options.dir) / "config.json").string());
  if (!arch.ok()) return arch.status();
  model->arch_ = *arch;
  model->serve_ = options.serve;
  if (model->serve_.context_length > model->arch_.max_position_embeddings) {
    return Status::InvalidArgument(fmt::format(
        "{}: context_length {} exceeds the model's max_position_embeddings {}", options.dir,
        model->serve_.context_length, model->arch_.max_position_embeddings));
  }
  model->weight_dtype_ =
      options.serve.precision == LlmPrecision::kFp32 ? at::kFloat : at::kBFloat16;
  model->bf16_cache_ = options.serve.precision != LlmPrecision::kFp32;
  std::unique_ptr<SafetensorsFile> safetensors;
  if (gguf == nullptr) {
    auto file = SafetensorsFile::Open((fs::path(options.dir) / "model.safetensors").string());
    if (!file.ok()) return file.status();
    safetensors = std::move(*file);
  }
  // Loading runs on one thread. An OpenMP parallel region here would leave this thread a team of
  // workers for the life of the process; with the generation loop's own team that makes more
  // OpenMP threads than cores, and libgomp then puts idle workers to sleep at once instead of
  // spinning briefly, so every layer of every step would pay a futex wake-up.
  const int omp_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct RestoreThreads {
    int threads;
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore{omp_threads};
  try {
    c10::InferenceMode guard;
    if (gguf != nullptr) {
      SLUICE_RETURN_IF_ERROR(model->LoadGgufWeights(*gguf));
      model->gguf_ = std::move(gguf);
    } else {
      SLUICE_RETURN_IF_ERROR(model->LoadWeights(*safetensors));
    }
    model->BuildRope();
    const auto& a = model->arch_;
    const LlmServeConfig& serve = model->serve_;
    const int64_t block = serve.kv_block_size;
    const int64_t per_slot = (serve.context_length + block - 1) / block;
    const int64_t element = model->bf16_cache_ ? 2 : 4;
    const int64_t block_bytes = int64_t{a.layers} * 2 * a.kv_heads * block * a.head_dim * element;
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
      const at::ScalarType cache_dtype = model->bf16_cache_ ? at::kBFloat16 : at::kFloat;
      model->cache_k_.push_back(at::empty(shape, cache_dtype));
      model->cache_v_.push_back(at::empty(shape, cache_dtype));
    }
  } catch (const c10::Error& e) {
    return Status::Internal(
        fmt::format("{}: loading the model failed: {}", options.dir, e.what_without_backtrace()));
  }
  return std::unique_ptr<StepModel>(std::move(model));
}

Status LlamaModel::LoadWeights(const SafetensorsFile& file) {
  const ModelArchitecture& a = arch_;
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
    result.Add(w, serve_.precision);
    weight_bytes_ += result.bytes();
    return result;
  };
  auto norm = [&](const at::Tensor& w) {
    weight_bytes_ += w.numel() * at::elementSize(at::kFloat);
    return w.contiguous();
  };
  const int64_t hidden = a.hidden_size, q_rows = int64_t{a.heads} * a.head_dim,
                kv_rows = int64_t{a.kv_heads} * a.head_dim;
  auto embedding = get("model.embed_tokens.weight", {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  embedding_ = embedding->to(weight_dtype_).contiguous();
  for (int i = 0; i < a.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    auto q = get(p + "self_attn.q_proj.weight", {q_rows, hidden});
    auto k = get(p + "self_attn.k_proj.weight", {kv_rows, hidden});
    auto v = get(p + "self_attn.v_proj.weight", {kv_rows, hidden});
    auto o = get(p + "self_attn.o_proj.weight", {hidden, q_rows});
    auto gate = get(p + "mlp.gate_proj.weight", {a.intermediate_size, hidden});
    auto up = get(p + "mlp.up_proj.weight", {a.intermediate_size, hidden});
    auto down = get(p + "mlp.down_proj.weight", {hidden, a.intermediate_size});
    auto attn_norm = get(p + "input_layernorm.weight", {hidden});
    auto ffn_norm = get(p + "post_attention_layernorm.weight", {hidden});
    for (const auto* t : {&q, &k, &v, &o, &gate, &up, &down, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear({*q, *k, *v});
    layer.out = linear({*o});
    layer.gate_up = linear({*gate, *up});
    layer.down = linear({*down});
    layer.attn_norm = norm(*attn_norm);
    layer.ffn_norm = norm(*ffn_norm);
    layers_.push_back(std::move(layer));
  }
  auto final_norm = get("model.norm.weight", {hidden});
  if (!final_norm.ok()) return final_norm.status();
  final_norm_ = norm(*final_norm);
  if (a.tie_word_embeddings && file.Find("lm_head.weight") == nullptr) {
    lm_head_ = linear({*embedding});
  } else {
    auto head = get("lm_head.weight", {a.vocab_size, hidden});
    if (!head.ok()) return head.status();
    lm_head_ = linear({*head});
  }
  return Status::Ok();
}

// llama.cpp's tensor names (blk.N.attn_q.weight, ...), each tensor kept in its type: quantised
// ones as parts of their layers read where the file is mapped, float ones converted to the
// serving precision. Shapes are checked against the architecture.
Status LlamaModel::LoadGgufWeights(const GgufFile& file) {
  const ModelArchitecture& a = arch_;
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
  // Consecutive float tensors become one part (stacked); each quantised tensor a part of its own.
  auto linear = [&](const std::vector<const GgufTensor*>& tensors) {
    Linear result;
    std::vector<at::Tensor> pending;
    auto flush = [&] {
      if (pending.empty()) return;
      result.Add(pending.size() == 1 ? pending[0] : at::cat(pending, 0), serve_.precision);
      pending.clear();
    };
    for (const GgufTensor* tensor : tensors) {
      if (IsQuantType(tensor->type)) {
        flush();
        result.AddBlocks(tensor->data, tensor->type, tensor->shape[0], tensor->shape[1]);
      } else {
        pending.push_back(floats(*tensor));
      }
    }
    flush();
    weight_bytes_ += result.bytes();
    return result;
  };
  auto norm = [&](const GgufTensor& tensor) {
    weight_bytes_ += tensor.elements() * at::elementSize(at::kFloat);
    return floats(tensor);
  };
  const int64_t hidden = a.hidden_size, inter = a.intermediate_size, d = a.head_dim,
                q_rows = int64_t{a.heads} * d, kv_rows = int64_t{a.kv_heads} * d;
  const bool phi3 = a.name == "phi3";
  auto embedding = find("token_embd.weight", {a.vocab_size, hidden});
  if (!embedding.ok()) return embedding.status();
  if (IsQuantType((*embedding)->type)) {
    embedding_blocks_ = (*embedding)->data;
    embedding_type_ = (*embedding)->type;
  } else {
    embedding_ = floats(**embedding).to(weight_dtype_).contiguous();
  }
  for (int i = 0; i < a.layers; ++i) {
    const std::string p = fmt::format("blk.{}.", i);
    std::vector<Result<const GgufTensor*>> qkv, gate_up;
    if (phi3) {
      qkv.push_back(find(p + "attn_qkv.weight", {q_rows + 2 * kv_rows, hidden}));
      gate_up.push_back(find(p + "ffn_up.weight", {2 * inter, hidden}));
    } else {
      qkv.push_back(find(p + "attn_q.weight", {q_rows, hidden}));
      qkv.push_back(find(p + "attn_k.weight", {kv_rows, hidden}));
      qkv.push_back(find(p + "attn_v.weight", {kv_rows, hidden}));
      gate_up.push_back(find(p + "ffn_gate.weight", {inter, hidden}));
      gate_up.push_back(find(p + "ffn_up.weight", {inter, hidden}));
    }
    auto o = find(p + "attn_output.weight", {hidden, q_rows});
    auto down = find(p + "ffn_down.weight", {hidden, inter});
    auto attn_norm = find(p + "attn_norm.weight", {hidden});
    auto ffn_norm = find(p + "ffn_norm.weight", {hidden});
    std::vector<const GgufTensor*> qkv_tensors, gate_up_tensors;
    for (auto* list : {&qkv, &gate_up}) {
      for (const auto& t : *list) {
        if (!t.ok()) return t.status();
        (list == &qkv ? qkv_tensors : gate_up_tensors).push_back(*t);
      }
    }
    for (const auto* t : {&o, &down, &attn_norm, &ffn_norm}) {
      if (!t->ok()) return t->status();
    }
    Layer layer;
    layer.qkv = linear(qkv_tensors);
    layer.out = linear({*o});
    layer.gate_up = linear(gate_up_tensors);
    layer.down = linear({*down});
    layer.attn_norm = norm(**attn_norm);
    layer.ffn_norm = norm(**ffn_norm);
    if (a.attention_bias) {
      auto qb = find(p + "attn_q.bias", {q_rows});
      auto kb = find(p + "attn_k.bias", {kv_rows});
      auto vb = find(p + "attn_v.bias", {kv_rows});
      for (const auto* t : {&qb, &kb, &vb}) {
        if (!t->ok()) return t->status();
      }
      layer.qkv.bias = at::cat({floats(**qb), floats(**kb), floats(**vb)}, 0);
      weight_bytes_ += layer.qkv.bias.nbytes();
    }
    if (a.qk_norm) {
      auto qn = find(p + "attn_q_norm.weight", {d});
      auto kn = find(p + "attn_k_norm.weight", {d});
      if (!qn.ok()) return qn.status();
      if (!kn.ok()) return kn.status();
      layer.q_norm = norm(**qn);
      layer.k_norm = norm(**kn);
    }
    if (a.post_norms) {
      auto post_attn = find(p + "post_attention_norm.weight", {hidden});
      auto post_ffn = find(p + "post_ffw_norm.weight", {hidden});
      if (!post_attn.ok()) return post_attn.status();
      if (!post_ffn.ok()) return post_ffn.status();
      layer.post_attn_norm = norm(**post_attn);
      layer.post_ffn_norm = norm(**post_ffn);
    }
    layers_.push_back(std::move(layer));
  }
  auto final_norm = find("output_norm.weight", {hidden});
  if (!final_norm.ok()) return final_norm.status();
  final_norm_ = norm(**final_norm);
  if (a.tie_word_embeddings) {
    lm_head_ = linear({*embedding});
  } else {
    auto head = find("output.weight", {a.vocab_size, hidden});
    if (!head.ok()) return head.status();
    lm_head_ = linear({*head});
  }
  return Status::Ok();
}

// cos/sin of position x inverse frequency, in fp32 as transformers computes them; for the
// sliding-window layers of a model that has them, a second table with their base and no scaling.
void LlamaModel::BuildRope() {
  const ModelArchitecture& a = arch_;
  const int64_t half = a.head_dim / 2;
  at::Tensor exponents = at::arange(0, a.head_dim, 2, at::kLong).to(at::kFloat) / a.head_dim;
  at::Tensor positions = at::arange(serve_.context_length, at::kFloat).unsqueeze(1);
  if (!a.local_layers.empty()) {
    at::Tensor local =
        positions.matmul((1.0 / at::pow(a.rope_theta_local, exponents)).unsqueeze(0));
    rope_local_cos_ = local.cos().contiguous();
    rope_local_sin_ = local.sin().contiguous();
  }
  at::Tensor inv_freq = 1.0 / at::pow(a.rope_theta, exponents);
  if (!a.rope_freq_factors.empty()) {
    inv_freq = inv_freq / at::tensor(a.rope_freq_factors, at::kFloat);
  }
  if (a.rope_scaling == RopeScaling::kLinear) {
    inv_freq = inv_freq / a.rope_factor;
  } else if (a.rope_scaling == RopeScaling::kLlama3) {
    const double original = a.rope_original_max_positions;
    const double low_wavelen = original / a.rope_low_freq_factor;
    const double high_wavelen = original / a.rope_high_freq_factor;
    at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / a.rope_factor, inv_freq);
    at::Tensor smooth = (original / wavelen - a.rope_low_freq_factor) /
                        (a.rope_high_freq_factor - a.rope_low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / a.rope_factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  at::Tensor freqs = positions.matmul(inv_freq.unsqueeze(0));  // [context, half]
  rope_cos_ = freqs.cos().contiguous();
  rope_sin_ = freqs.sin().contiguous();
  TORCH_CHECK(rope_cos_.size(1) == half);
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
                                const std::vector<int32_t>& chunk_of, int64_t begin, int64_t end) {
  const ModelArchitecture& a = arch_;
  const int64_t d = a.head_dim, half = d / 2, width = qkv.size(1), heads = a.heads + a.kv_heads,
                q_cols = int64_t{a.heads} * d, kv_cols = int64_t{a.kv_heads} * d,
                block = serve_.kv_block_size;
  float* base = qkv.data_ptr<float>();
  const bool local = IsLocal(layer);
  const float* cos_table = (local ? rope_local_cos_ : rope_cos_).data_ptr<float>();
  const float* sin_table = (local ? rope_local_sin_ : rope_sin_).data_ptr<float>();
  void* keys = cache_k_[static_cast<size_t>(layer)].data_ptr();
  void* values = cache_v_[static_cast<size_t>(layer)].data_ptr();
  auto put = [&](const float* from, void* cache, int64_t at) {
    if (bf16_cache_) {
      ToBf16(from, d, static_cast<uint16_t*>(cache) + at);
    } else {
      std::copy_n(from, d, static_cast<float*>(cache) + at);
    }
  };
  for (int64_t t = begin; t < end; ++t) {
    const int64_t position = positions[static_cast<size_t>(t)];
    const float* cos = cos_table + position * half;
    const float* sin = sin_table + position * half;
    float* row = base + t * width;
    if (a.qk_norm) {  // Each query head by q_norm, each key head by k_norm, in place.
      const Layer& weights = layers_[static_cast<size_t>(layer)];
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
      put(row + q_cols + h * d, keys, at);
      put(row + q_cols + kv_cols + h * d, values, at);
    }
  }
}

void LlamaModel::LocateKeysAndValues(int layer, const std::vector<SequenceChunk>& chunks) {
  const ModelArchitecture& a = arch_;
  const int64_t d = a.head_dim, block = serve_.kv_block_size, kv = a.kv_heads;
  const int64_t element = bf16_cache_ ? 2 : 4;
  const int64_t window = IsLocal(layer) ? a.sliding_window : 0;
  const char* keys = static_cast<const char*>(cache_k_[static_cast<size_t>(layer)].data_ptr());
  const char* values = static_cast<const char*>(cache_v_[static_cast<size_t>(layer)].data_ptr());
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
        kv_base_[i * kv + h] = KvSpan{keys, values, (first_row - lo / block * block) * d};
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
      p += n;
    }
  }
  for (const Gather& g : gathers) {
    for (int64_t h = 0; h < kv; ++h) {
      const int64_t at = g.at + h * (g.hi - g.lo) * d * element;
      kv_base_[g.chunk * kv + h] =
          KvSpan{gathered_k_.data() + at, gathered_v_.data() + at, -g.lo * d};
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
      if (bf16_cache_) {
        DecodeAttentionRows(q, width, rows, static_cast<int>(groups),
                            reinterpret_cast<const uint16_t*>(span.k) + cache_row,
                            reinterpret_cast<const uint16_t*>(span.v) + cache_row, len, d, scale,
                            result, a.heads * d, scratch.data());
      } else {
        DecodeAttentionRows(q, width, rows, static_cast<int>(groups),
                            reinterpret_cast<const float*>(span.k) + cache_row,
                            reinterpret_cast<const float*>(span.v) + cache_row, len, d, scale,
                            result, a.heads * d, scratch.data());
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

Status LlamaModel::CopyBlocks(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  for (const auto& [from, to] : copies) {
    if (from < 0 || from >= blocks_ || to < 0 || to >= blocks_ || from == to) {
      return Status::Internal(fmt::format("cannot copy block {} to block {}", from, to));
    }
  }
  const int64_t bytes = int64_t{serve_.kv_block_size} * arch_.head_dim * (bf16_cache_ ? 2 : 4);
  for (size_t layer = 0; layer < cache_k_.size(); ++layer) {
    for (at::Tensor* cache : {&cache_k_[layer], &cache_v_[layer]}) {
      char* base = static_cast<char*>(cache->data_ptr());
      for (int64_t h = 0; h < arch_.kv_heads; ++h) {
        for (const auto& [from, to] : copies) {
          std::memcpy(base + (h * blocks_ + to) * bytes, base + (h * blocks_ + from) * bytes,
                      static_cast<size_t>(bytes));
        }
      }
    }
  }
  return Status::Ok();
}

Status LlamaModel::Run(const std::vector<SequenceChunk>& chunks, std::vector<float>* logits) {
  if (chunks.empty()) return Status::Ok();
  const ModelArchitecture& a = arch_;
  std::vector<int64_t> tokens, positions, offsets, logit_rows;
  std::vector<int32_t> chunk_of;  // Each token's chunk.
  const int64_t block = serve_.kv_block_size;
  const int64_t per_slot = (serve_.context_length + block - 1) / block;
  tables_.resize(chunks.size());
  std::vector<int32_t> written;  // Blocks this step writes into: no two chunks share one.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& chunk = chunks[i];
    const int64_t len = static_cast<int64_t>(chunk.tokens.size());
    if (len == 0 || chunk.start < 0 || chunk.start + len > serve_.context_length) {
      return Status::Internal(fmt::format("chunk of {} tokens at {} exceeds the context of {}", len,
                                          chunk.start, serve_.context_length));
    }
    std::vector<int32_t>& table = tables_[i];
    if (chunk.blocks.empty()) {
      if (chunk.slot < 0 || (chunk.slot + 1) * per_slot > blocks_) {
        return Status::Internal(fmt::format("step names slot {}, out of range", chunk.slot));
      }
      table.resize(static_cast<size_t>(per_slot));
      std::iota(table.begin(), table.end(), static_cast<int32_t>(chunk.slot * per_slot));
    } else {
      table = chunk.blocks;
    }
    const int64_t needed = (chunk.start + len + block - 1) / block;
    if (static_cast<int64_t>(table.size()) < needed ||
        std::any_of(table.begin(), table.begin() + needed,
                    [this](int32_t b) { return b < 0 || b >= blocks_; })) {
      return Status::Internal(
          fmt::format("a block table of {} entries does not cover {} tokens "
                      "in [0, {}) blocks",
                      table.size(), chunk.start + len, blocks_));
    }
    for (int64_t b = chunk.start / block; b < needed; ++b) {
      written.push_back(table[static_cast<size_t>(b)]);
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    for (int64_t j = 0; j < len; ++j) {
      const int32_t token = chunk.tokens[static_cast<size_t>(j)];
      if (token < 0 || token >= a.vocab_size) {
        return Status::InvalidArgument(fmt::format("token id {} is outside the vocab", token));
      }
      if (chunk.all_logits || j == len - 1) {
        logit_rows.push_back(static_cast<int64_t>(tokens.size()));
      }
      tokens.push_back(token);
      positions.push_back(chunk.start + j);
      chunk_of.push_back(static_cast<int32_t>(i));
    }
  }
  std::sort(written.begin(), written.end());
  if (std::adjacent_find(written.begin(), written.end()) != written.end()) {
    return Status::Internal("two chunks of a step write into the same cache block");
  }
  thread_local int threads_set = -1;
  const int threads = serve_.threads > 0
                          ? serve_.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads_set != threads) {
    at::set_num_threads(threads);
    threads_set = threads;
  }
  try {
    c10::InferenceMode guard;
    const int64_t total = static_cast<int64_t>(tokens.size()), hidden = a.hidden_size,
                  inter = a.intermediate_size;
    at::Tensor x = Buffer(0, total, hidden);
    if (embedding_blocks_ != nullptr) {
      const int64_t row_bytes = QuantRowBytes(embedding_type_, hidden);
      float* xp_rows = x.data_ptr<float>();
      for (int64_t t = 0; t < total; ++t) {
        DequantizeRow(embedding_type_,
                      static_cast<const uint8_t*>(embedding_blocks_) +
                          tokens[static_cast<size_t>(t)] * row_bytes,
                      hidden, xp_rows + t * hidden);
      }
    } else {
      x.copy_(embedding_.index_select(0, at::tensor(tokens, at::kLong)));
    }
    if (a.scale_embedding) x.mul_(std::sqrt(static_cast<float>(hidden)));
    at::Tensor normed = Buffer(1, total, hidden);
    at::Tensor qkv = Buffer(2, total, layers_.front().qkv.out);
    at::Tensor heads = Buffer(3, total, int64_t{a.heads} * a.head_dim);
    at::Tensor attn = Buffer(4, total, hidden);
    at::Tensor gate_up = Buffer(5, total, 2 * inter);
    at::Tensor act = Buffer(6, total, inter);
    at::Tensor down = Buffer(7, total, hidden);  // The last layer's MLP output ...
    const float* xp = x.data_ptr<float>();
    const float* pending = nullptr;  // ... once there is one, not yet added to x.
    for (int l = 0; l < a.layers; ++l) {
      const Layer& layer = layers_[static_cast<size_t>(l)];
      RmsNorm(x, layer.attn_norm, normed, pending);
      layer.qkv.Into(normed, qkv.data_ptr<float>());
      ForRows(total, [&](int64_t begin, int64_t end) {
        RotateAndCache(l, qkv, positions, chunk_of, begin, end);
      });
      Attention(l, qkv, chunks, offsets, heads);
      layer.out.Into(heads, attn.data_ptr<float>());
      if (a.post_norms) RmsNorm(attn, layer.post_attn_norm, attn);  // In place.
      RmsNorm(x, layer.ffn_norm, normed, attn.data_ptr<float>());
      layer.gate_up.Into(normed, gate_up.data_ptr<float>());
      const float* gu = gate_up.data_ptr<float>();
      float* actp = act.data_ptr<float>();
      ForRows(total, [&](int64_t begin, int64_t end) {
        if (a.activation == GateActivation::kGeluTanh) {
          GeGlu(gu + begin * 2 * inter, end - begin, inter, actp + begin * inter);
        } else {
          SwiGlu(gu + begin * 2 * inter, end - begin, inter, actp + begin * inter);
        }
      });
      layer.down.Into(act, down.data_ptr<float>());
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
    RmsNorm(last, final_norm_, last_normed);
    const size_t before = logits->size();
    logits->resize(before + static_cast<size_t>(last.size(0) * lm_head_.out));
    lm_head_.Into(last_normed, logits->data() + before);
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
  for (const Layer& layer : layers_) {
    for (const Linear* linear : {&layer.qkv, &layer.out, &layer.gate_up, &layer.down}) add(*linear);
  }
  add(lm_head_);
  return fmt::format("{}", fmt::join(formats, "+"));
}

std::string LlamaModel::kernel_paths() const {
  bool blocks = false, vectors = false;
  for (const Layer& layer : layers_) {
    for (const Linear* linear : {&layer.qkv, &layer.out, &layer.gate_up, &layer.down}) {
      for (const Linear::Part& part : linear->parts) {
        blocks = blocks || part.blocks != nullptr;
        vectors = vectors || (part.blocks == nullptr && !part.fp32());
      }
    }
  }
  std::vector<std::string> paths;
  if (blocks) paths.emplace_back(QuantKernelIsa());
  if (vectors || !blocks) paths.emplace_back(CpuKernelIsa());
  return fmt::format("{}", fmt::join(paths, "+"));
}

}  // namespace

Result<std::unique_ptr<StepModel>> LoadLlamaModel(const ModelLoadOptions& options) {
  return LlamaModel::Load(options);
}

std::string LlmRuntimeVersion() { return fmt::format("libtorch {}", TORCH_VERSION); }

}  // namespace sluice::llm
