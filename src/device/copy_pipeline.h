// CopyPipeline: one GPU instance's streams and staging buffers, overlapping the next batch's
// host->device copy with this batch's compute.
//
// An instance owns three streams: H2D copies, compute, D2H copies, and `slots` staging slots,
// each with page-locked host buffers and device buffers for every input and output (sized for the
// largest batch, allocated once and reused). Several engine workers (one per slot) call Run() at
// once; each Run takes a free slot and:
//
//   host inputs -> slot's pinned buffers -> [H2D stream] -> device inputs   -> event h2d_done
//   [compute stream waits h2d_done] compute(batch)                          -> event compute_done
//   [D2H stream waits compute_done] device outputs -> slot's pinned outputs -> event d2h_done
//   host waits d2h_done, copies the outputs out, frees the slot.
//
// So while batch n computes, batch n+1 (another worker, another slot) is already copied in on the
// H2D stream, and batch n-1's results go out on the D2H stream. Every buffer is reused only after
// the event of its last use: the pinned inputs after h2d_done (a host write before that would
// change bytes still being copied), the device inputs and the compute's outputs after d2h_done.
// Launches on the compute stream are serialised (a mutex held only while they are enqueued).
//
// Thread-safe. Close() refuses new runs; the destructor waits for runs in flight, then for the
// streams, before it frees a buffer.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "common/thread_pool.h"
#include "device/device.h"

namespace sluice::device {

struct CopyPipelineOptions {
  int slots = 2;                     // Batches in flight at once; >= 1.
  std::vector<size_t> input_bytes;   // Per input, the bytes of the largest batch; >= 1 input.
  std::vector<size_t> output_bytes;  // Per output, the bytes of the largest batch.
  // Threads that copy a batch's inputs into the pinned buffers, the caller's included (a 256-image
  // batch is 38 MB: one core copies it in about 4 ms, longer than the GPU takes to run it);
  // inputs under 1 MiB are copied by the caller alone. 1..16, default 1.
  int copy_threads = 1;
};

// What the compute stage is given: the slot's device inputs, already ordered after their copy.
struct DeviceBatch {
  int slot = 0;                     // 0..slots-1: compute code may keep per-slot state.
  std::vector<void*> inputs;        // Device pointers, one per input.
  std::vector<size_t> input_bytes;  // This batch's bytes of each (<= the capacity).
  Stream* stream = nullptr;         // The compute stream: enqueue everything here.
};

// What the compute stage hands back: device memory holding each output once the work it
// enqueued has run, and whatever keeps that memory alive until the copy out has run.
struct DeviceOutputs {
  std::vector<const void*> data;
  std::vector<size_t> bytes;
  std::shared_ptr<void> keep_alive;  // Released after d2h_done.
};

// Enqueues the model's work on batch.stream and returns at once; an error means nothing usable
// was enqueued (the pipeline still waits for the stream before it reuses the slot).
using ComputeFn = std::function<Result<DeviceOutputs>(const DeviceBatch& batch)>;

class CopyPipeline {
 public:
  // Creates the streams, events and buffers on `device`, which must outlive the pipeline.
  static Result<std::unique_ptr<CopyPipeline>> Create(Device& device, CopyPipelineOptions options);
  ~CopyPipeline();
  CopyPipeline(const CopyPipeline&) = delete;
  CopyPipeline& operator=(const CopyPipeline&) = delete;

  // Runs one batch: `inputs` (host bytes, one span per input, within the capacity) in, `compute`,
  // then the outputs into `outputs` (one span per output, each exactly the bytes compute reports
  // for it). Blocks the calling thread until the outputs are there. kUnavailable after Close().
  Status Run(const std::vector<std::span<const std::byte>>& inputs, const ComputeFn& compute,
             const std::vector<std::span<std::byte>>& outputs);

  // New and waiting Run() calls fail with kUnavailable; runs under way finish.
  void Close();

  int slots() const { return static_cast<int>(slots_.size()); }
  // The device buffers of `slot`'s inputs, fixed for the pipeline's life: compute code may prepare
  // work on them ahead (a CUDA graph per slot reads them at every replay).
  const std::vector<void*>& device_inputs(int slot) const { return slots_[slot].device_in; }
  Stream& compute_stream() { return *compute_stream_; }

 private:
  struct Slot {
    std::vector<void*> host_in, device_in, host_out;
    std::unique_ptr<Event> h2d_done, compute_done, d2h_done;
  };

  CopyPipeline(Device& device, CopyPipelineOptions options);
  Status Allocate();
  Result<int> AcquireSlot();
  void ReleaseSlot(int index);
  Status RunOnSlot(Slot& slot, int index, const std::vector<std::span<const std::byte>>& inputs,
                   const ComputeFn& compute, const std::vector<std::span<std::byte>>& outputs);
  // After a failure part-way: waits for all three streams, so nothing still uses the slot.
  void Drain();

  // Copies `bytes` from `src` to `dst`, split over the copy threads.
  void StageCopy(void* dst, const void* src, size_t bytes);

  Device& device_;
  const CopyPipelineOptions options_;
  std::unique_ptr<ThreadPool> copiers_;  // copy_threads - 1 threads; null when 1.
  std::unique_ptr<Stream> h2d_stream_, compute_stream_, d2h_stream_;
  std::vector<Slot> slots_;  // Fixed after Create; slot i is used only by the run holding it.
  Mutex launch_mu_;          // Held while work is enqueued on the compute stream.
  Mutex mu_;
  CondVar cv_;
  bool closed_ GUARDED_BY(mu_) = false;
  int running_ GUARDED_BY(mu_) = 0;
  std::vector<bool> busy_ GUARDED_BY(mu_);  // Per slot: held by a run.
};

}  // namespace sluice::device
