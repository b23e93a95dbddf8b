// The per-row work of a decoder step shared by its files (llama_model.cc, mixture_of_experts.cc).
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "llm/kernels/kernels.h"
#include "llm/llm_config.h"

namespace sluice::llm::llama {

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

// The gate of a gated feed-forward: GeGLU (gemma's) or SwiGLU, over `rows` rows of gate_up
// ([rows, 2 inter]) into out ([rows, inter]).
inline void GatedActivation(GateActivation activation, const float* gate_up, int64_t rows,
                            int64_t inter, float* out) {
  if (activation == GateActivation::kGeluTanh) {
    GeGlu(gate_up, rows, inter, out);
  } else {
    SwiGlu(gate_up, rows, inter, out);
  }
}

}  // namespace sluice::llm::llama
