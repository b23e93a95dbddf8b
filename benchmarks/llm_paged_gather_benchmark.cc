// What the paged cache's fallback costs: a decode step of one sequence whose blocks are
// consecutive (its rows read in place) against the same step through a scattered block table
// (its rows gathered into one span per layer), at position 1024. Rounds alternate A B B A ...;
// prints the medians and their ratio.
//
// Usage: build/llm_paged_gather_benchmark models/smollm2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "llm/load_llm.h"

using sluice::llm::SequenceChunk;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  sluice::llm::LlmLoadOverrides overrides;
  overrides.slots = 4;
  auto loaded = sluice::llm::LoadStepModel(argv[1], overrides);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  sluice::llm::StepModel& model = **loaded;
  const int position = 1024, block = model.kv_block_size(), blocks = position / block + 1;
  std::vector<int32_t> consecutive(static_cast<size_t>(blocks)), scattered(consecutive.size());
  std::iota(consecutive.begin(), consecutive.end(), 0);
  for (int i = 0; i < blocks; ++i) scattered[static_cast<size_t>(i)] = blocks + 2 * i;
  std::vector<int32_t> prompt(static_cast<size_t>(position));
  for (int i = 0; i < position; ++i) prompt[static_cast<size_t>(i)] = 100 + i % 500;
  std::vector<float> logits;
  for (const auto* table : {&consecutive, &scattered}) {
    for (int start = 0; start < position; start += 256) {
      SequenceChunk chunk{0, start, {prompt.begin() + start, prompt.begin() + start + 256}, false,
                          *table};
      logits.clear();
      if (!model.Run({chunk}, &logits).ok()) return 1;
    }
  }
  auto step_ms = [&](const std::vector<int32_t>& table) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) {
      logits.clear();
      if (!model.Run({SequenceChunk{0, position, {7}, false, table}}, &logits).ok()) return -1.0;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
               .count() /
           20;
  };
  std::vector<double> in_place, gathered;
  for (int round = 0; round < 6; ++round) {
    if (round % 2 == 0) {
      in_place.push_back(step_ms(consecutive));
      gathered.push_back(step_ms(scattered));
    } else {
      gathered.push_back(step_ms(scattered));
      in_place.push_back(step_ms(consecutive));
    }
  }
  std::sort(in_place.begin(), in_place.end());
  std::sort(gathered.begin(), gathered.end());
  if (in_place.front() < 0 || gathered.front() < 0) return 1;
  const double a = in_place[3], b = gathered[3];
  std::printf("%s, one sequence at position %d: decode step %.2f ms in place, %.2f ms gathered "
              "(%.2f x)\n",
              argv[1], position, a, b, b / a);
  return 0;
}
