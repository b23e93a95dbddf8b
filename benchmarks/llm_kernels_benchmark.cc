// The decoder's weight-streaming matrix products at SmolLM2-135M's shapes, on all cores: bytes of
// weight read per second is the figure to hold against the machine's memory bandwidth.
//   build/llm_kernels_benchmark --benchmark_filter=Bf16
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "llm/cpu_kernels.h"

namespace {

using sluice::llm::Fp32ToBf16;

// Every weight of one decoder layer plus a 1/30 share of the output head, as one [n, k] matrix
// each: the weights of qkv, out, gate_up and down differ in shape, so each shape runs in turn.
struct Shape {
  int64_t n, k;
};
const Shape kLayer[] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};

template <class Weight, class Call>
void Run(benchmark::State& state, Call call) {
  const int64_t m = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  // Thirty layers' worth of weights so the matrices come from memory, not cache.
  constexpr int kCopies = 30;
  std::mt19937 rng(1);
  std::vector<std::vector<Weight>> weights;
  int64_t bytes = 0;
  for (int copy = 0; copy < kCopies; ++copy) {
    for (const Shape& s : kLayer) {
      weights.emplace_back(static_cast<size_t>(sluice::llm::PackedSize(s.n, s.k)), Weight{1});
      bytes += s.n * s.k * static_cast<int64_t>(sizeof(Weight));
    }
  }
  std::vector<float> x(static_cast<size_t>(m * 3072), 0.5f), y(static_cast<size_t>(m * 3072));
  std::vector<float> scales(3072, 0.01f);
  for (auto _ : state) {
    size_t index = 0;
    for (int copy = 0; copy < kCopies; ++copy) {
      for (const Shape& s : kLayer) {
        const Weight* w = weights[index++].data();
        std::vector<std::thread> pool;
        const int64_t per = (s.n + threads - 1) / threads;
        for (int t = 1; t < threads; ++t) {
          pool.emplace_back([&, t] {
            call(x.data(), m, s.k, w, scales.data(), s.n, y.data(), t * per,
                 std::min(s.n, (t + 1) * per));
          });
        }
        call(x.data(), m, s.k, w, scales.data(), s.n, y.data(), 0, std::min(s.n, per));
        for (auto& th : pool) th.join();
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
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
// Rows of x (sequences in a decode step), threads.
void Shapes(benchmark::internal::Benchmark* b) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  for (int64_t rows : {1, 4, 16, 64}) {
    b->Args({rows, 1});
    if (cores > 1) b->Args({rows, cores});
  }
  b->ArgNames({"rows", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(Bf16)->Apply(Shapes);
BENCHMARK(Int8)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
