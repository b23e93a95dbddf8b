#include "llm/llama/linear.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "llm/huge_pages.h"
#include "llm/kernels/ggml_blocks.h"

namespace sluice::llm::llama {
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

}  // namespace

void Linear::Add(const at::Tensor& w, LlmPrecision precision) {
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

void Linear::AddBlocks(const void* blocks, uint32_t type, int64_t rows, int64_t columns,
                       bool repack) {
  Part part;
  part.first = out;
  part.rows = rows;
  part.blocks = blocks;
  part.type = type;
  in = columns;
  if (repack && Repack(&part, columns)) {
    // The file's pages the repacked copy replaced: they stay in the page cache, but no longer
    // count in the process's resident memory (read again on a later touch, as the embedding's
    // rows are when the output head is tied to them).
    ReleasePages(blocks, rows * QuantRowBytes(type, columns));
  }
  out += rows;
  parts.push_back(std::move(part));
}

bool Linear::RepacksBlocks() { return RepackBlocks(); }

bool Linear::Repack(Part* part, int64_t columns) {
  if (!RepackBlocks() || !CanRepackQuant(part->type, part->rows)) return false;
  at::Tensor packed = WeightTensor(part->rows * QuantRowBytes(part->type, columns), at::kByte);
  RepackQuant(part->type, part->blocks, part->rows, columns, packed.data_ptr<uint8_t>());
  part->weight = std::move(packed);
  part->blocks = part->weight.data_ptr<uint8_t>();
  part->repacked = true;
  return true;
}

void Linear::UseRepacked(Part* part, const uint8_t* repacked, std::shared_ptr<void> owner,
                         int64_t columns) {
  part->weight = at::from_blob(
      const_cast<uint8_t*>(repacked), {part->rows * QuantRowBytes(part->type, columns)},
      [owner = std::move(owner)](void*) mutable { owner.reset(); },
      at::TensorOptions().dtype(at::kByte));
  part->blocks = repacked;
  part->repacked = true;
}

void Linear::Into(const at::Tensor& x, float* yp) const {
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

void Linear::Products(const at::Tensor& x, float* yp, bool vector_parts, bool int8_parts,
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
  if (block_parts) {
    // x per 256 columns as well only where a part's products take the int8 tiles, and per 256
    // alone where they take every part whole (the runs below are whole sixteens of columns): the
    // per-32 forms were three fifths of x's preparation in a prompt step, and no tiled product
    // reads them.
    bool tile_parts = false, tiles_alone = n % 16 == 0;
    for (const Part& part : parts) {
      if (part.blocks == nullptr) continue;
      const bool tiled = part.repacked && TakesInt8Tiles(part.type);
      tile_parts = tile_parts || tiled;
      tiles_alone = tiles_alone && tiled && part.first % 16 == 0 && part.rows % 16 == 0;
    }
    quantised.Reserve(xp, m, k, tile_parts, tiles_alone);
  }
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
        MatmulInt8(rows, part.weight.data_ptr<int8_t>(), part.scales.data_ptr<float>(), n, y, begin,
                   end);
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

int64_t Linear::bytes() const {
  int64_t total = bias.defined() ? static_cast<int64_t>(bias.nbytes()) : 0;
  for (const Part& part : parts) total += part.bytes(in);
  return total;
}

OneOmpThread::OneOmpThread() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }

OneOmpThread::~OneOmpThread() { omp_set_num_threads(threads_); }

void UseIntraOpThreads(int threads) {
  thread_local int threads_set = -1;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads_set != threads) {
    at::set_num_threads(threads);
    threads_set = threads;
  }
}

}  // namespace sluice::llm::llama
