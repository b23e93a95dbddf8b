// The device seam: the few operations the GPU path needs from an accelerator, as an interface.
//
// CopyPipeline (copy_pipeline.h) holds the GPU path's logic (streams, pinned staging buffers,
// events ordering their reuse) and talks to an accelerator only through this interface. The CUDA
// implementation (backends/cuda/cuda_device.cc, in the separately loaded CUDA library) is a thin
// layer over the CUDA runtime; FakeDevice (fake_device.h) runs the same operations on CPU threads
// and records their order, so tests drive the real pipelining code without a GPU.
//
// Semantics follow CUDA's: work enqueued on one stream runs in order; different streams run
// concurrently unless an event orders them; copies and kernels return at once (asynchronous).
// Torch-free and CUDA-free.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "sluice/status.h"

namespace sluice::device {

// An in-order queue of device work. Owned by whoever created it; destroy only when idle.
class Stream {
 public:
  virtual ~Stream() = default;
  // The native handle (cudaStream_t for CUDA), for code that launches its own work on it.
  virtual void* native() const = 0;
};

// A marker in a stream: it completes when everything enqueued before its Record() has run.
class Event {
 public:
  virtual ~Event() = default;
};

// Thread-safe: every method may be called from any thread.
class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // e.g. "cuda:0 (NVIDIA H100 80GB HBM3)".

  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual Result<std::unique_ptr<Event>> CreateEvent() = 0;

  // Page-locked host memory (cudaHostAlloc), which asynchronous copies need. Free with FreeHost
  // only when no copy from or to it is pending.
  virtual Result<void*> AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;
  // Device memory. Free with FreeDevice only when no work using it is pending.
  virtual Result<void*> AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* ptr) = 0;

  // Asynchronous copies on `stream`: `src` must stay unchanged and `dst` unread until an event
  // recorded after the copy completes.
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) = 0;

  // Marks `event` at the current end of `stream`.
  virtual Status Record(Event& event, Stream& stream) = 0;
  // Work enqueued on `stream` after this call waits for `event` (the host does not wait).
  virtual Status StreamWait(Stream& stream, Event& event) = 0;
  // The host waits for `event`; an event never recorded counts as complete.
  virtual Status Synchronize(Event& event) = 0;
  // The host waits for everything enqueued on `stream`.
  virtual Status Synchronize(Stream& stream) = 0;

  // OK, or the error that left the device unusable for the rest of the process (CUDA's sticky
  // errors: an illegal address, a kernel's assert, a launch failure; every later call fails the
  // same way until the process restarts). Asked after a failure, to tell the two apart.
  virtual Status Health() const { return Status::Ok(); }
};

}  // namespace sluice::device
