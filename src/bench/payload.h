// Synthetic request payloads, built before (never inside) a benchmark's timed region.
#pragma once

#include <cstdint>
#include <vector>

#include "common/half.h"
#include "config/model_config.h"
#include "sluice/status.h"
#include "sluice/tensor.h"

namespace sluice {

// One batch of random inputs matching the model's declared inputs: standard normal values for
// floating-point inputs, small non-negative integers for integer inputs, 0/1 for BOOL. Variable
// dims (-1) are an error: the benchmark cannot guess them.
Result<std::vector<Tensor>> MakeRandomInputs(const ModelConfig& config, int batch_size,
                                             uint64_t seed);

}  // namespace sluice
