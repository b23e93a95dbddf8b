// A linear layer of the decoder, y = x W^T (+ b), its weights in whichever form serves them
// fastest on this CPU: fp32 (ATen's matmul), bf16 or int8 packed for kernels/kernels.h, or a GGUF
// file's quantised blocks (repacked at load where kernels.h can). Loading (weights.h) builds
// them; the step (llama_model.cc) calls Into.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/kernels/kernels.h"
#include "llm/llm_config.h"

namespace sluice::llm::llama {

// A linear layer y = x W^T (+ b), x fp32, its output columns in parts, each a weight matrix of its
// own kind: fp32 [rows, in] (ATen's matmul); bf16 or int8 packed for kernels/kernels.h (+ per-row
// fp32 scales for int8); or a GGUF file's quantised blocks, read where the file is mapped, or
// (every block type kernels.h multiplies by) repacked at load into the layout kernels.h streams
// fastest. A Hugging Face model's layers are one part each (q, k and v stacked into one matrix); a
// GGUF file's are one part per tensor, as its tensors may differ in type (Q4_K_M keeps v in Q6_K, q
// and k in Q4_K).
struct Linear {
  struct Part {
    int64_t first = 0, rows = 0;   // Output columns [first, first + rows).
    at::Tensor weight;             // fp32 [rows, in]; or bf16 / int8 [PackedSize(rows, in)].
    at::Tensor scales;             // [rows], fp32: int8 only.
    const void* blocks = nullptr;  // GGUF blocks, rows x QuantRowBytes(type, in) bytes ...
    uint32_t type = 0;             // ... of this GgmlType ...
    bool repacked = false;         // ... as RepackQuant lays them out (held in `weight`).
    std::string source;            // The GGUF tensor's name; empty for other weights.
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
  void Add(const at::Tensor& w, LlmPrecision precision);
  // One part of GGUF blocks: `rows` rows of `columns` weights of `type` (repacked unless
  // `repack` is false).
  void AddBlocks(const void* blocks, uint32_t type, int64_t rows, int64_t columns,
                 bool repack = true);
  // A block part's weights repacked into a buffer of its own, where kernels.h can: the products
  // then read eight rows as one stream and transpose nothing (kernels.h), with the same results.
  static bool Repack(Part* part, int64_t columns);
  // Whether block parts are repacked at all (SLUICE_QUANT_REPACK=0 keeps the file's layout).
  static bool RepacksBlocks();
  // A block part's weights from `repacked` (RepackQuant's layout, `rows` x QuantRowBytes bytes)
  // where another holds them (a weights cache's mapping, kept alive by `owner`): nothing copied.
  static void UseRepacked(Part* part, const uint8_t* repacked, std::shared_ptr<void> owner,
                          int64_t columns);
  // y = x W^T (+ b) into `yp`: [rows of x, out], contiguous.
  void Into(const at::Tensor& x, float* yp) const;
  // The bf16, int8 and block parts' columns, shared among the intra-op threads.
  void Products(const at::Tensor& x, float* yp, bool vector_parts, bool int8_parts,
                bool block_parts) const;
  int64_t bytes() const;
};

// Holds OpenMP at one thread for its life, then restores the count: loading (an OpenMP parallel
// region there would leave the loading thread a team of workers for the life of the process;
// with the generation loop's own team that makes more OpenMP threads than cores, and libgomp then
// puts idle workers to sleep at once instead of spinning briefly, so every layer of every step
// would pay a futex wake-up), and small products inside a step.
class OneOmpThread {
 public:
  OneOmpThread();
  ~OneOmpThread();
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int threads_;
};

// The calling thread's (a step's) intra-op threads: `threads`, or every core for 0; set only
// when it changes.
void UseIntraOpThreads(int threads);

}  // namespace sluice::llm::llama
