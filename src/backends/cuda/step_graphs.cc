// CUDA graphs for the language models' device executor (llm/llama/step_graphs.h): a decode step's
// work warmed up, then captured on a stream of the pool (the legacy default stream, where the
// executor runs, cannot capture) and replayed on the caller's stream.
//
// One memory pool for all of a model's graphs: its steps run one at a time on one thread, and
// each replay's output is read (its tokens picked, its logits copied out) before the next replay,
// which a shared pool allows (see cuda_backend.cc's file comment for when it does not).
#include "llm/llama/step_graphs.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <memory>

namespace sluice::llm::llama {
namespace {

class CudaStepGraph final : public StepGraph {
 public:
  at::cuda::CUDAGraph graph;
  void Replay() override { graph.replay(); }
};

class CudaStepGraphs final : public StepGraphs {
 public:
  explicit CudaStepGraphs(c10::DeviceIndex device) : device_(device) {}
  std::unique_ptr<StepGraph> Capture(const std::function<void()>& body) override {
    const c10::DeviceIndex device = device_;
    c10::cuda::CUDAGuard on_device(device);
    // What the step wrote before (its inputs' copies) is done before the side stream reads it.
    c10::cuda::getCurrentCUDAStream(device).synchronize();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
    auto graph = std::make_unique<CudaStepGraph>();
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      body();  // Warm-up: cuBLAS's workspace and the allocator's blocks made outside the capture.
      side.synchronize();
      if (!pool_set_) {
        pool_ = at::cuda::graph_pool_handle();
        pool_set_ = true;
      }
      // Thread-local: other models' threads may be using the GPU meanwhile.
      graph->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
      try {
        body();
      } catch (...) {
        // Something in the step cannot be captured: end the capture, so the stream is usable
        // again, and let the caller run op by op.
        cudaGraph_t partial = nullptr;
        if (cudaStreamEndCapture(side.stream(), &partial) == cudaSuccess && partial != nullptr) {
          cudaGraphDestroy(partial);
        }
        cudaGetLastError();
        throw;
      }
      graph->graph.capture_end();
    }
    return graph;
  }

 private:
  c10::DeviceIndex device_;
  at::cuda::MempoolId_t pool_{};
  bool pool_set_ = false;
};

}  // namespace
}  // namespace sluice::llm::llama

// The entry point the binary finds with dlsym: a new StepGraphs for GPU `device` (the caller owns
// it).
extern "C" __attribute__((visibility("default"))) sluice::llm::llama::StepGraphs*
SluiceCudaStepGraphs(int device) {
  return new sluice::llm::llama::CudaStepGraphs(static_cast<c10::DeviceIndex>(device));
}
