// libtorch's vector math resolved on one thread before any parallel call.
#include "backends/vector_math.h"

#include <ATen/ATen.h>

#include <mutex>

namespace sluice {

void ResolveVectorMath() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The functions aten/src/ATen/cpu/vml.h sends to MKL (IMPLEMENT_VML_MKL), one element each:
    // one element runs on the calling thread.
    using Op = at::Tensor (*)(const at::Tensor&);
    constexpr Op kOps[] = {at::acos, at::asin,   at::atan, at::cos,  at::erf,
                           at::erfc, at::erfinv, at::exp,  at::log,  at::log10,
                           at::sin,  at::sqrt,   at::tan,  at::tanh, at::trunc};
    for (at::ScalarType type : {at::kFloat, at::kDouble}) {
      const at::Tensor x = at::full({1}, 0.5, at::TensorOptions().dtype(type));
      for (Op op : kOps) (void)op(x);
    }
  });
}

}  // namespace sluice
