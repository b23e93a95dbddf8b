// Decoding at depth with each KV cache format: one model loaded twice (--llm-kv-cache-dtype bf16
// and q8_0, the same weights), `streams` sequences each at position `depth`, then decode steps of
// all of them together (one token each), timed in rounds that alternate A B B A ... Each model's
// first sequence is prefilled once and its blocks copied to the others' (StepModel::CopyBlocks):
// every sequence reads a cache of its own, as distinct prompts would, without 16 prefills.
// Prints the median step time per format, output tokens/s, and their ratio. With a sixth argument
// (bf16 or q8_0), that format alone: a long context's prefill and decoding at its depth.
//
// Usage: build/llm_kv_cache_benchmark MODEL_DIR [streams 16] [depth 4096] [steps 8] [rounds 6]
//            [format]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "llm/load_llm.h"

using sluice::llm::SequenceChunk;
using sluice::llm::StepModel;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [streams] [depth] [steps] [rounds] [format]\n",
                 argv[0]);
    return 2;
  }
  const int streams = argc > 2 ? std::atoi(argv[2]) : 16;
  const int depth = argc > 3 ? std::atoi(argv[3]) : 4096;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 8;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 6;
  const char* formats[] = {"bf16", "q8_0"};
  const std::string only = argc > 6 ? argv[6] : "";
  if (!only.empty() && only != formats[0] && only != formats[1]) {
    std::fprintf(stderr, "format %s: expected bf16 or q8_0\n", only.c_str());
    return 2;
  }
  std::vector<int> used;
  for (int f = 0; f < 2; ++f) {
    if (only.empty() || only == formats[f]) used.push_back(f);
  }
  std::unique_ptr<StepModel> models[2];
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(streams));
  for (int f : used) {
    sluice::llm::LlmLoadOverrides overrides;
    overrides.slots = streams;
    overrides.context_length = depth + steps * rounds + 16;
    overrides.kv_cache_dtype = formats[f];
    overrides.prefix_caching = "off";
    auto loaded = sluice::llm::LoadStepModel(argv[1], overrides);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      return 1;
    }
    models[f] = std::move(*loaded);
    StepModel& model = *models[f];
    const int block = model.kv_block_size();
    const int per = (overrides.context_length + block - 1) / block;
    for (int s = 0; s < streams; ++s) {
      tables[static_cast<size_t>(s)].resize(static_cast<size_t>(per));
      for (int b = 0; b < per; ++b)
        tables[static_cast<size_t>(s)][static_cast<size_t>(b)] = s * per + b;
    }
    std::vector<int32_t> prompt(static_cast<size_t>(depth));
    for (int i = 0; i < depth; ++i) prompt[static_cast<size_t>(i)] = 100 + (i * 7919) % 5000;
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> logits;
    for (int at = 0; at < depth; at += 256) {
      const int end = std::min(depth, at + 256);
      SequenceChunk chunk{0, at, {prompt.begin() + at, prompt.begin() + end}, false, tables[0]};
      logits.clear();
      if (!model.Run({chunk}, &logits).ok()) return 1;
    }
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (int s = 1; s < streams; ++s) {
      for (int b = 0; b < (depth + block - 1) / block; ++b) copies.emplace_back(b, s * per + b);
    }
    if (!model.CopyBlocks(copies).ok()) return 1;
    std::printf("%s: %s cache, %lld MiB, %d-token prefill in %.1f s\n", argv[1], formats[f],
                static_cast<long long>(model.kv_cache_bytes() >> 20), depth,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  int position[2] = {depth, depth};
  auto step_ms = [&](int f) {
    std::vector<SequenceChunk> chunks;
    std::vector<float> logits;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i, ++position[f]) {
      chunks.clear();
      for (int s = 0; s < streams; ++s) {
        chunks.push_back(
            SequenceChunk{s, position[f], {7 + s}, false, tables[static_cast<size_t>(s)]});
      }
      logits.clear();
      if (!models[f]->Run(chunks, &logits).ok()) return -1.0;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
               .count() /
           steps;
  };
  std::vector<double> times[2];
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < used.size(); ++i) {
      const int f = used[round % 2 == 0 ? i : used.size() - 1 - i];
      times[f].push_back(step_ms(f));
    }
  }
  for (int f : used) {
    std::sort(times[f].begin(), times[f].end());
    if (times[f].front() < 0) return 1;
  }
  if (used.size() == 1) {
    const double ms = times[used[0]][times[used[0]].size() / 2];
    std::printf("%d streams at depth %d, %s cache: decode step %.1f ms (%.1f tokens/s)\n", streams,
                depth, formats[used[0]], ms, 1000.0 * streams / ms);
    return 0;
  }
  const double bf16 = times[0][times[0].size() / 2], q8 = times[1][times[1].size() / 2];
  std::printf(
      "%d streams at depth %d: decode step %.1f ms with bf16 (%.1f tokens/s), %.1f ms with "
      "q8_0 (%.1f tokens/s): q8_0 %.2f x\n",
      streams, depth, bf16, 1000.0 * streams / bf16, q8, 1000.0 * streams / q8, bf16 / q8);
  return 0;
}
