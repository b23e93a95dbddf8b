// The CPU's arithmetic peaks, measured: fp32 FMA, bf16 dot products (AVX-512 BF16's VDPBF16PS)
// and int8 products (AVX-512 VNNI's VPDPBUSD, else AVX2's VPMADDUBSW), on one core and on every
// core at once (one pinned thread each). Each kernel is a loop of independent register
// accumulators long enough to hide the instruction's latency, with no memory traffic: the figure
// is what the execution units can do, the ceiling a convolution's achieved rate is a fraction of
// (benchmarks/vision_peak_fraction.py).
//
// Counts: an FMA is 2 flops per lane; VDPBF16PS 2 per bf16 pair (32 pairs a 512-bit register);
// VPDPBUSD 2 per byte pair (64 a register); on AVX2 without VNNI, VPMADDUBSW 2 per byte pair
// (32 a 256-bit register). Printed as JSON, one object.
//
// Usage: machine_peak [--seconds 0.5]
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kAccumulators = 12;  // Enough to cover 4-cycle latency on 2-3 ports.
constexpr long kInner = 1 << 14;

__attribute__((target("avx512f"), noinline)) double Fp32Avx512(long rounds) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (long k = 0; k < kInner; ++k) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return static_cast<double>(out[0]);
}

__attribute__((target("avx2,fma"), noinline)) double Fp32Avx2(long rounds) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (long k = 0; k < kInner; ++k) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
  }
  float out[8];
  __m256 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_storeu_ps(out, sum);
  return static_cast<double>(out[0]);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) double Bf16Avx512(long rounds) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0.
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // bf16 ~6e-8.
  for (long r = 0; r < rounds; ++r) {
    for (long k = 0; k < kInner; ++k) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    }
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return static_cast<double>(out[0]);
}

__attribute__((target("avx512f,avx512vnni"), noinline)) double Int8Avx512(long rounds) {
  __m512i acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  for (long r = 0; r < rounds; ++r) {
    for (long k = 0; k < kInner; ++k) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    }
  }
  __m512i sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  int32_t out[16];
  _mm512_storeu_si512(out, sum);
  return static_cast<double>(out[0]);
}

// AVX2 without VNNI: VPMADDUBSW, 32 byte products summed in pairs to 16 bits. It is the only
// instruction that multiplies bytes, so its rate bounds any int8 convolution on such a CPU
// (which also spends instructions widening the sums to 32 bits: the bound is not reached).
// VPADDSW accumulates; the accumulator feeds the next product, so no step is loop-invariant.
__attribute__((target("avx2"), noinline)) double Int8Avx2(long rounds) {
  __m256i acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_epi8(static_cast<char>(i));
  const __m256i b = _mm256_set1_epi8(1);
  for (long r = 0; r < rounds; ++r) {
    for (long k = 0; k < kInner; ++k) {
      for (int i = 0; i < kAccumulators; ++i) {
        acc[i] = _mm256_adds_epi16(acc[i], _mm256_maddubs_epi16(acc[i], b));
      }
    }
  }
  __m256i sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm256_add_epi16(sum, acc[i]);
  int16_t out[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), sum);
  return static_cast<double>(out[0]);
}

struct Kernel {
  const char* name;
  const char* isa;
  double (*run)(long);
  double ops_per_inner;  // Operations of one inner iteration (all accumulators).
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Operations per second of `threads` threads running `k` together for about `seconds`.
double Measure(const Kernel& k, int threads, double seconds) {
  // Calibrate rounds on one thread, then run every thread for the same count.
  long rounds = 1;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    volatile double sink = k.run(rounds);
    (void)sink;
    double s = Seconds(t0, std::chrono::steady_clock::now());
    if (s > seconds / 4) {
      rounds = static_cast<long>(static_cast<double>(rounds) * seconds / s) + 1;
      break;
    }
    rounds *= 2;
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> elapsed(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Pin(t);
      ready.fetch_add(1);
      while (!go.load()) {
      }
      auto t0 = std::chrono::steady_clock::now();
      volatile double sink = k.run(rounds);
      (void)sink;
      elapsed[static_cast<size_t>(t)] = Seconds(t0, std::chrono::steady_clock::now());
    });
  }
  while (ready.load() < threads) {
  }
  go = true;
  for (auto& th : pool) th.join();
  double slowest = 0;
  for (double e : elapsed) slowest = std::max(slowest, e);
  return k.ops_per_inner * static_cast<double>(kInner) * static_cast<double>(rounds) * threads /
         slowest;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  __builtin_cpu_init();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<Kernel> kernels;
  if (__builtin_cpu_supports("avx512f")) {
    kernels.push_back({"fp32", "avx512 fma", Fp32Avx512, 2.0 * 16 * kAccumulators});
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernels.push_back({"fp32", "avx2 fma", Fp32Avx2, 2.0 * 8 * kAccumulators});
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    kernels.push_back({"bf16", "avx512 vdpbf16ps", Bf16Avx512, 2.0 * 32 * kAccumulators});
  }
  if (__builtin_cpu_supports("avx512vnni")) {
    kernels.push_back({"int8", "avx512 vpdpbusd", Int8Avx512, 2.0 * 64 * kAccumulators});
  } else if (__builtin_cpu_supports("avx2")) {
    kernels.push_back({"int8", "avx2 vpmaddubsw", Int8Avx2, 2.0 * 32 * kAccumulators});
  }
  std::printf("{\"cores\": %d, \"peaks\": [", cores);
  for (size_t i = 0; i < kernels.size(); ++i) {
    const double one = Measure(kernels[i], 1, seconds);
    const double all = Measure(kernels[i], cores, seconds);
    std::printf(
        "%s\n  {\"precision\": \"%s\", \"isa\": \"%s\", \"gops_one_core\": %.1f, "
        "\"gops_all_cores\": %.1f}",
        i ? "," : "", kernels[i].name, kernels[i].isa, one / 1e9, all / 1e9);
  }
  std::printf("\n]}\n");
  return 0;
}
