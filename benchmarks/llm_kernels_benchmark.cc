// The decoder's weight-streaming matrix products at SmolLM2-135M's shapes, on one core and on all,
// on each code path the CPU has: bytes of weight read per second is the figure to hold against
// the machine's memory bandwidth, which ReadBandwidth measures (a 512 MiB buffer summed with the
// widest loads the CPU has, split over the threads; the best of the repetitions is the ceiling).
// DecodeAttentionBf16 is one decode step's attention over a bf16 cache.
//   build/llm_kernels_benchmark --benchmark_filter='Bf16|ReadBandwidth'
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/kernels.h"

namespace {

// Every weight of one decoder layer plus a 1/30 share of the output head, as one [n, k] matrix
// each: the weights of qkv, out, gate_up and down differ in shape, so each shape runs in turn.
struct Shape {
  int64_t n, k;
};
const Shape kLayer[] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
// Llama-3.2-1B's layer (hidden 2048, 32 query and 8 KV heads of 64, intermediate 8192): the
// shapes of the GGUF files people run, whose K-quant blocks of 256 need k a multiple of 256.
const Shape kLlama1bLayer[] = {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}};
const Shape kLlama1bHead = {128256, 2048};  // Its output head (the embedding, tied): n, k.

// A weight value that is a normal number in its type: bf16 bits 0x0001 would be a denormal float,
// which the FMA path handles in microcode, hundreds of times slower.
template <class Weight>
Weight SomeWeight() {
  if constexpr (std::is_same_v<Weight, uint16_t>) {
    return sluice::llm::Fp32ToBf16(0.01f);
  } else {
    return Weight{3};
  }
}

// Limits the kernels to `isa` and labels the run with it; false (the run skipped) when this CPU
// lacks that path. The caller puts the limit back to kAmx at its end.
bool UsePath(benchmark::State& state, sluice::llm::KernelIsa isa) {
  if (isa > sluice::llm::BestKernelIsa()) {
    state.SkipWithError("this CPU lacks the path");
    for (auto _ : state) {
    }
    return false;
  }
  sluice::llm::LimitKernelIsa(isa);
  state.SetLabel(sluice::llm::KernelIsaName(isa));
  return true;
}

// Each iteration, `threads` threads walk every matrix in turn, each computing its share of the
// columns (a multiple of 64), as the decoder's threads do; the threads start once per pass, not
// once per matrix. product(index, t, first, last) computes matrix index's columns [first, last)
// into thread t's output.
template <class Product>
void PassOverMatrices(benchmark::State& state, int threads, const std::vector<Shape>& shapes,
                      const Product& product) {
  auto share = [&](int t) {
    for (size_t index = 0; index < shapes.size(); ++index) {
      const Shape& s = shapes[index];
      const int64_t per = (s.n / 64 + threads - 1) / threads * 64;
      const int64_t first = std::min(s.n, t * per), last = std::min(s.n, first + per);
      if (first < last) product(index, t, first, last);
    }
  };
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(share, t);
    share(0);
    for (auto& th : pool) th.join();
  }
}

template <class Weight, class Call>
void Run(benchmark::State& state, Call call) {
  const int64_t m = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto isa = static_cast<sluice::llm::KernelIsa>(state.range(2));
  if (!UsePath(state, isa)) return;
  // Thirty layers' worth of weights so the matrices come from memory, not cache.
  constexpr int kCopies = 30;
  std::vector<std::vector<Weight>> weights;
  std::vector<Shape> shapes;
  int64_t bytes = 0;
  for (int copy = 0; copy < kCopies; ++copy) {
    for (const Shape& s : kLayer) {
      weights.emplace_back(static_cast<size_t>(sluice::llm::PackedSize(s.n, s.k)),
                           SomeWeight<Weight>());
      shapes.push_back(s);
      bytes += s.n * s.k * static_cast<int64_t>(sizeof(Weight));
    }
  }
  std::vector<float> x(static_cast<size_t>(m * 3072), 0.5f);
  std::vector<float> scales(3072, 0.01f);
  std::vector<std::vector<float>> ys(static_cast<size_t>(threads),
                                     std::vector<float>(static_cast<size_t>(m * 3072)));
  PassOverMatrices(state, threads, shapes, [&](size_t index, int t, int64_t first, int64_t last) {
    const Shape& s = shapes[index];
    call(x.data(), m, s.k, weights[index].data(), scales.data(), s.n,
         ys[static_cast<size_t>(t)].data(), first, last);
    benchmark::DoNotOptimize(ys[static_cast<size_t>(t)].data());
  });
  state.SetBytesProcessed(state.iterations() * bytes);
  sluice::llm::LimitKernelIsa(sluice::llm::KernelIsa::kAmx);
}

void Bf16(benchmark::State& state) {
  Run<uint16_t>(state, [](const float* x, int64_t m, int64_t k, const uint16_t* w, const float*,
                          int64_t n, float* y, int64_t b,
                          int64_t e) { sluice::llm::MatmulBf16(x, m, k, w, n, y, b, e); });
}
void Int8(benchmark::State& state) {
  Run<int8_t>(state, [](const float* x, int64_t m, int64_t k, const int8_t* w, const float* s,
                        int64_t n, float* y, int64_t b,
                        int64_t e) { sluice::llm::MatmulInt8(x, m, k, w, s, n, y, b, e); });
}
// Rows of x (sequences in a decode step), threads, code path (a KernelIsa).
void Shapes(benchmark::internal::Benchmark* b) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  for (auto isa : {sluice::llm::KernelIsa::kAvx2, sluice::llm::KernelIsa::kAvx512Bf16,
                   sluice::llm::KernelIsa::kAmx}) {
    for (int64_t rows : {1, 4, 16, 64, 128, 512}) {
      b->Args({rows, 1, static_cast<int64_t>(isa)});
      if (cores > 1) b->Args({rows, cores, static_cast<int64_t>(isa)});
    }
  }
  b->ArgNames({"rows", "threads", "isa"})->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(Bf16)->Apply(Shapes);
BENCHMARK(Int8)->Apply(Shapes);

// Random bytes are blocks of random weights, but for their fp16 scales and offsets (which could
// be NaNs or denormals): those are set to 1/128; MXFP4's E8M0 byte likewise (random bytes are
// scales from 2^-127 to 2^127, and the denormal products cost the fp32 steps microcode assists).
void SetBlockScales(uint32_t type, std::vector<uint8_t>* blocks) {
  using sluice::llm::GgmlType;
  int64_t elements = 0, block_bytes = 0;
  sluice::llm::GgmlBlockLayout(type, &elements, &block_bytes);
  std::vector<int64_t> halves = {0};
  if (type == static_cast<uint32_t>(GgmlType::kQ4_1) ||
      type == static_cast<uint32_t>(GgmlType::kQ4_K)) {
    halves = {0, 2};
  } else if (type == static_cast<uint32_t>(GgmlType::kQ6_K)) {
    halves = {208};
  } else if (type == static_cast<uint32_t>(GgmlType::kQ2_K)) {
    halves = {80, 82};
  } else if (type == static_cast<uint32_t>(GgmlType::kQ3_K)) {
    halves = {108};
  }
  if (type == static_cast<uint32_t>(GgmlType::kMXFP4)) {
    for (size_t block = 0; block < blocks->size(); block += static_cast<size_t>(block_bytes)) {
      (*blocks)[block] = 127 - 7;  // 2^-7.
    }
    return;
  }
  for (size_t block = 0; block < blocks->size(); block += static_cast<size_t>(block_bytes)) {
    for (int64_t offset : halves) {
      (*blocks)[block + static_cast<size_t>(offset)] = 0x00;
      (*blocks)[block + static_cast<size_t>(offset) + 1] = 0x20;  // 0x2000: 2^-7.
    }
  }
}

// The GGUF block products (MatmulQuant) at the same shapes: one layer's matrices x 30 in one
// block format (model 0), or Llama-3.2-1B's layer x 8 (model 1: 272 MB in Q4_K, well past the
// caches), or one 2,048 x 2,048 matrix of that layer read again and again (model 2: 2.4 MB in
// Q4_K, from the caches: what the products compute a second with memory out of the way, to hold
// against model 1's rate at one row and against PeakInt8 at many; at one thread, as each pass
// starts its other threads anew, which costs more than such a product), or Llama-3.2-1B's output
// head, 128,256 x 2,048 (model 3: 216 MB in Q6_K, its type in Q4_K_M files; at 16 streams the
// largest single product of a decoding step, a fifth to a third of it), x quantised once per width
// beforehand (the decoder does it once per layer input), on the quantised path this CPU has
// (SLUICE_QUANT_KERNELS caps it). The bytes are the blocks'.
//   build/llm_kernels_benchmark --benchmark_filter='Quant/rows:16/threads:2'
//   build/llm_kernels_benchmark --benchmark_filter='Quant/rows:1/threads:1/type:12/.*/model:1'
//   build/llm_kernels_benchmark --benchmark_filter='Quant/rows:16/threads:1/.*/repacked:1/model:2'
void Quant(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto type = static_cast<uint32_t>(state.range(2));
  const bool repacked = state.range(3) != 0;
  const bool llama1b = state.range(4) != 0, in_cache = state.range(4) == 2;
  const bool head = state.range(4) == 3;
  int64_t block = 0, block_bytes = 0;
  sluice::llm::GgmlBlockLayout(type, &block, &block_bytes);
  const bool k_quant = block == 256;
  if ((repacked && !sluice::llm::CanRepackQuant(type, 576)) || (k_quant && !llama1b)) {
    state.SkipWithError(repacked && !sluice::llm::CanRepackQuant(type, 576)
                            ? "not a repacked format"
                            : "K-quants need k a multiple of 256");
    for (auto _ : state) {
    }
    return;
  }
  state.SetLabel(std::string(sluice::llm::QuantKernelIsa()) + " " +
                 sluice::llm::GgmlTypeName(type) + (repacked ? " repacked" : ""));
  std::mt19937 rng(5);
  const int copies = in_cache || head ? 1 : llama1b ? 8 : 30;
  const std::vector<Shape> layer =
      head       ? std::vector<Shape>{kLlama1bHead}
      : in_cache ? std::vector<Shape>{kLlama1bLayer[1]}
      : llama1b  ? std::vector<Shape>(std::begin(kLlama1bLayer), std::end(kLlama1bLayer))
                 : std::vector<Shape>(std::begin(kLayer), std::end(kLayer));
  int64_t widest = 0;
  for (const Shape& s : layer) widest = std::max({widest, s.k, s.n});
  std::vector<std::vector<uint8_t>> weights;
  std::vector<Shape> shapes;
  int64_t bytes = 0;
  for (int copy = 0; copy < copies; ++copy) {
    for (const Shape& s : layer) {
      std::vector<uint8_t> w(static_cast<size_t>(s.n * sluice::llm::QuantRowBytes(type, s.k)));
      for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
      SetBlockScales(type, &w);
      if (repacked) {
        std::vector<uint8_t> file = w;
        sluice::llm::RepackQuant(type, file.data(), s.n, s.k, w.data());
      }
      bytes += static_cast<int64_t>(w.size());
      weights.push_back(std::move(w));
      shapes.push_back(s);
    }
  }
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(m * widest));
  for (float& v : x) v = normal(rng);
  // x prepared once for each width the layer's matrices read.
  sluice::llm::QuantInput narrow, wide;
  narrow.Prepare(x.data(), m, layer.front().k);
  wide.Prepare(x.data(), m, layer.back().k);
  std::vector<std::vector<float>> ys(static_cast<size_t>(threads),
                                     std::vector<float>(static_cast<size_t>(m * widest)));
  PassOverMatrices(state, threads, shapes, [&](size_t index, int t, int64_t first, int64_t last) {
    const Shape& s = shapes[index];
    const sluice::llm::QuantInput& x = s.k == narrow.k ? narrow : wide;
    float* y = ys[static_cast<size_t>(t)].data();
    if (repacked) {
      sluice::llm::MatmulQuantRepacked(x, type, weights[index].data(), s.n, y, first, last);
    } else {
      sluice::llm::MatmulQuant(x, type, weights[index].data(), s.n, y, first, last);
    }
    benchmark::DoNotOptimize(ys[static_cast<size_t>(t)].data());
  });
  state.SetBytesProcessed(state.iterations() * bytes);
  // Two int8 operations per weight and row of x: the figure to hold against PeakInt8 at many rows.
  double products = 0;
  for (const Shape& s : shapes) products += static_cast<double>(s.n * s.k);
  state.counters["int8_ops_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * products * 2 * static_cast<double>(m),
      benchmark::Counter::kIsRate);
}
BENCHMARK(Quant)
    ->ArgsProduct({{1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256},
                   {1, std::max(1u, std::thread::hardware_concurrency())},
                   {2 /* Q4_0 */, 3 /* Q4_1 */, 8 /* Q8_0 */, 12 /* Q4_K */, 13 /* Q5_K */,
                    14 /* Q6_K */, 10 /* Q2_K */, 11 /* Q3_K */, 20 /* IQ4_NL */, 23 /* IQ4_XS */,
                    21 /* IQ3_S */, 17 /* IQ2_XS */, 39 /* MXFP4 */},
                   {0, 1},
                   {0, 1, 2, 3}})
    ->ArgNames({"rows", "threads", "type", "repacked", "model"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One decode step's attention at SmolLM2-135M's shapes over a bf16 cache: 16 sequences x 30
// layers x 3 KV heads (3 queries each, head size 64), each over `len` cached positions of its own
// (so the cache comes from memory, as in a step), on one thread; the bytes are the cache's.
void DecodeAttentionBf16(benchmark::State& state) {
  const int64_t len = state.range(0), d = 64, groups = 3, heads = 16 * 30 * 3;
  const auto isa = static_cast<sluice::llm::KernelIsa>(state.range(1));
  if (!UsePath(state, isa)) return;
  std::vector<uint16_t> cache(static_cast<size_t>(heads * 2 * len * d),
                              sluice::llm::Fp32ToBf16(0.01f));
  std::vector<float> q(static_cast<size_t>(groups * d), 0.1f), out(q.size()),
      scratch(static_cast<size_t>(groups * len));
  for (auto _ : state) {
    for (int64_t h = 0; h < heads; ++h) {
      const uint16_t* k = cache.data() + h * 2 * len * d;
      sluice::llm::DecodeAttention(q.data(), static_cast<int>(groups), k, k + len * d, len, d,
                                   0.125f, out.data(), scratch.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(cache.size() * 2));
  sluice::llm::LimitKernelIsa(sluice::llm::KernelIsa::kAmx);
}
BENCHMARK(DecodeAttentionBf16)
    ->ArgsProduct({{64, 192, 512},
                   {static_cast<int64_t>(sluice::llm::KernelIsa::kAvx2),
                    static_cast<int64_t>(sluice::llm::KernelIsa::kAvx512Bf16),
                    static_cast<int64_t>(sluice::llm::KernelIsa::kAmx)}})
    ->ArgNames({"len", "isa"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// A prompt's attention at Llama-3.2-1B's shapes (a KV head's 4 queries of 64, bf16 cache): runs
// of 16 consecutive tokens, as a prefill step hands them to DecodeAttentionRows, the run's last
// token at position `len`, over one KV head's cache (from cache, as in a prompt's chunk), on one
// thread. The figure is the score and value products' fp32 operations per second (2 x 2 x rows x
// groups x d per position attended).
void PromptAttentionBf16(benchmark::State& state) {
  const int64_t len = state.range(0), d = 64, groups = 4, rows = 16;
  std::vector<uint16_t> cache(static_cast<size_t>(2 * len * d));
  std::mt19937 random(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (uint16_t& c : cache) c = sluice::llm::Fp32ToBf16(value(random));
  std::vector<float> q(static_cast<size_t>(rows * groups * d)), out(q.size()),
      scratch(static_cast<size_t>(rows * groups * len));
  for (float& x : q) x = value(random);
  for (auto _ : state) {
    sluice::llm::DecodeAttentionRows(q.data(), groups * d, static_cast<int>(rows),
                                     static_cast<int>(groups), cache.data(), cache.data() + len * d,
                                     len, d, 0.125f, out.data(), groups * d, scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["flops"] = benchmark::Counter(static_cast<double>(state.iterations()) * 4.0 *
                                                   static_cast<double>(rows * groups * d) *
                                                   static_cast<double>(len - rows / 2),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(PromptAttentionBf16)
    ->ArgsProduct({{512, 2048, 8192, 16384, 32768}})
    ->ArgNames({"len"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

#if defined(__x86_64__)
__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t count) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < count; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}
__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t count) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < count; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#endif
float Sum(const float* p, size_t count) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return SumAvx512(p, count);
  if (__builtin_cpu_supports("avx2")) return SumAvx2(p, count);
#endif
  float sum = 0;
  for (size_t i = 0; i < count; ++i) sum += p[i];
  return sum;
}

// Memory read bandwidth: the ceiling the matrix products are held against. The buffer is 256 MiB
// (about SmolLM2-135M's bf16 weights, 269 MB, which is what a decode step streams) or 1 GiB.
void ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const size_t bytes = static_cast<size_t>(state.range(1)) << 20, floats = bytes / sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buffer(
      static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  std::memset(buffer.get(), 0, bytes);
  const size_t per = floats / static_cast<size_t>(threads) / 64 * 64;
  std::vector<float> sums(static_cast<size_t>(threads));
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] {
        sums[static_cast<size_t>(t)] = Sum(buffer.get() + static_cast<size_t>(t) * per, per);
      });
    }
    sums[0] = Sum(buffer.get(), per);
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(per * threads * sizeof(float)));
}
BENCHMARK(ReadBandwidth)
    ->ArgsProduct({{1, std::max(1u, std::thread::hardware_concurrency())}, {256, 1024}})
    ->ArgNames({"threads", "MiB"})
    ->UseRealTime()
    ->Repetitions(5)
    ->Unit(benchmark::kMillisecond);

// The machine's peak int8 throughput, the ceiling the block products at many rows are held
// against: 12 independent chains of 256-bit byte products (VPDPBUSD where the CPU has AVX-512
// VNNI, as the products use it; else VPMADDUBSW + VPMADDWD + VPADDD, AVX2's three instructions for
// the same 32 products) on each thread. The counter is int8 operations, two per byte product.
#if defined(__x86_64__)
__attribute__((target("avx512vnni,avx512vl"))) int64_t DpbusdLoop(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_dpbusd_epi32(acc[i], a, b);
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  return _mm256_extract_epi32(sum, 0);
}
__attribute__((target("avx2"))) int64_t MaddLoop(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) {
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
    }
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  return _mm256_extract_epi32(sum, 0);
}
#endif

void PeakInt8(benchmark::State& state) {
#if defined(__x86_64__)
  const int threads = static_cast<int>(state.range(0));
  const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  if (!vnni && !__builtin_cpu_supports("avx2")) {
    state.SkipWithError("no AVX2");
    for (auto _ : state) {
    }
    return;
  }
  state.SetLabel(vnni ? "vpdpbusd" : "vpmaddubsw");
  constexpr int64_t kIterations = 1 << 22;
  std::vector<int64_t> sinks(static_cast<size_t>(threads));
  for (auto _ : state) {
    std::vector<std::thread> pool;
    auto work = [&](int t) {
      sinks[static_cast<size_t>(t)] = vnni ? DpbusdLoop(kIterations) : MaddLoop(kIterations);
    };
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sinks.data());
  }
  // 12 chains x 32 byte products x 2 operations per iteration and thread.
  state.counters["int8_ops_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kIterations * 12 * 32 * 2 * threads,
      benchmark::Counter::kIsRate);
#else
  state.SkipWithError("x86 only");
  for (auto _ : state) {
  }
#endif
}
BENCHMARK(PeakInt8)
    ->Arg(1)
    ->Arg(std::max(1u, std::thread::hardware_concurrency()))
    ->ArgName("threads")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// STREAM's triad, a[i] = b[i] + s c[i], over three arrays of `MiB` each split over the threads:
// its bytes are STREAM's (two read and one written per element; the write-allocate read of a is
// not counted), the figure the memory-bound products are usually held against. ReadBandwidth is
// the tighter ceiling for decoding, which only reads.
void Triad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const size_t floats = (static_cast<size_t>(state.range(1)) << 20) / sizeof(float);
  std::vector<float> a(floats, 0.0f), b(floats, 1.0f), c(floats, 2.0f);
  const size_t per = floats / static_cast<size_t>(threads);
  for (auto _ : state) {
    auto part = [&](size_t t) {
      float* out = a.data() + t * per;
      const float *x = b.data() + t * per, *y = c.data() + t * per;
      for (size_t i = 0; i < per; ++i) out[i] = x[i] + 3.0f * y[i];
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(part, static_cast<size_t>(t));
    part(0);
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(a.data());
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(3 * per * static_cast<size_t>(threads) * 4));
}
BENCHMARK(Triad)
    ->ArgsProduct({{1, std::max(1u, std::thread::hardware_concurrency())}, {256}})
    ->ArgNames({"threads", "MiB"})
    ->UseRealTime()
    ->Repetitions(5)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
