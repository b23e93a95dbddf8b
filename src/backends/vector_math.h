// libtorch's vector math made safe to call from several threads at once. Torch-free header.
//
// ATen hands a contiguous float tensor's cos, sin, exp, log, sqrt, tanh, erf, ... to MKL's vector
// math (VML), each intra-op thread calling it on its own chunk. The MKL in PyTorch 2.11's wheels
// picks each function's kernel on its first call, and when that first call runs on two threads at
// once one of them can run a low-accuracy kernel over its whole chunk (PyTorch issue 188792):
// measured here, about one process in 250 built RoPE tables whose second half was 1.5e-4 off, and
// the decoder's logits moved by 4e-4 for that process's life. Calling every such function once on
// one thread, before any parallel call, settles the choice.
#pragma once

namespace sluice {

// Calls each vector-math function ATen routes to MKL once, on one element in fp32 and fp64, the
// first time it is called in the process (later calls return at once). Thread-safe. Call it
// before the first tensor computation: every model load does.
void ResolveVectorMath();

}  // namespace sluice
