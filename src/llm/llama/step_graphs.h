// Graphs of a device step: a decode step's work recorded once per batch shape and replayed, so a
// step costs one launch instead of one per operation (CUDA graphs on a GPU, where a small model's
// decode step is hundreds of kernel launches). Header-only: the device executor
// (device_step.cc) takes a StepGraphs from DeviceOptions, Sluice's CUDA library makes the CUDA
// one (backends/cuda/step_graphs.cc), tests a stand-in that runs the recorded body again.
#pragma once

#include <functional>
#include <memory>

namespace sluice::llm::llama {

class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs the captured work again, on the tensors it captured (whose contents may have changed).
  virtual void Replay() = 0;
};

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  // Runs `body` once (a warm-up: libraries allocate their workspaces outside the capture), then
  // captures it. The capture does not compute: the caller replays the graph for the step that
  // asked for it. `body` must read and write only tensors that outlive the graph (its inputs
  // made before the call, its outputs kept by the caller from the captured run), launch no copy
  // from or to the host and read nothing back. Throws (c10::Error or std::exception) where the
  // device cannot capture.
  virtual std::unique_ptr<StepGraph> Capture(const std::function<void()>& body) = 0;
};

}  // namespace sluice::llm::llama
