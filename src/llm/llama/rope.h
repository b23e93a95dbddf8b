// Rotary position embeddings' tables for a decoder, every scaling its families use (linear,
// Llama 3's, LongRoPE's short and long factors, YaRN's ramp and attention factor, GGUF's
// per-frequency divisors), shared by the CPU step (llama_model.cc) and the device step
// (device_step.cc).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "llm/llm_config.h"

namespace sluice::llm::llama {

struct RopeTables {
  at::Tensor cos, sin;  // [context (x 2 with long factors), head_dim / 2], fp32.
  // The sliding-window layers' tables, where they rotate with a base of their own (gemma3's);
  // undefined otherwise.
  at::Tensor local_cos, local_sin;
  // LongRoPE served past its original context: from this row, the long factors' rows (0: one
  // table).
  int64_t long_row = 0;
};

// cos/sin of position x inverse frequency, in fp32 as transformers computes them; for the
// sliding-window layers of a model that has them, a second table with their base and no scaling.
RopeTables BuildRopeTables(const ModelArchitecture& arch, int context_length);

}  // namespace sluice::llm::llama
