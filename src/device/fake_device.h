// FakeDevice: the device interface on CPU threads, for tests of the GPU path's logic.
//
// Each stream is a thread running its queue in order; events order streams as CUDA's do; copies
// are memcpy (after an optional delay, so that work in flight stays in flight long enough to be
// seen), and "device memory" is host memory. Every operation is logged when it runs, with the
// stream it ran on, so a test can check order and overlap. It also catches what would corrupt a
// real GPU's results: a host buffer changed between a copy's enqueue and its run, memory freed
// with work on it still pending, and a kernel enqueued with Launch() that reads a device input
// before its copy ran (the tests check that through their own kernels).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "device/device.h"

namespace sluice::device {

struct FakeOp {
  enum class Kind { kCopyToDevice, kCopyToHost, kKernel, kRecord, kWait };
  Kind kind;
  int stream = 0;                     // The stream's number, in order of creation from 0.
  std::string label;                  // Kernels: the label given to Launch(); copies: "h2d"/"d2h".
  int64_t started = 0, finished = 0;  // Positions in the device's global order of events.
};

class FakeDevice final : public Device {
 public:
  explicit FakeDevice(std::chrono::microseconds copy_delay = std::chrono::microseconds(0));
  ~FakeDevice() override;  // Streams must be destroyed first.

  std::string name() const override { return "fake"; }
  Result<std::unique_ptr<Stream>> CreateStream() override;
  Result<std::unique_ptr<Event>> CreateEvent() override;
  Result<void*> AllocHost(size_t bytes) override;
  void FreeHost(void* ptr) override;
  Result<void*> AllocDevice(size_t bytes) override;
  void FreeDevice(void* ptr) override;
  Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) override;
  Status CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) override;
  Status Record(Event& event, Stream& stream) override;
  Status StreamWait(Stream& stream, Event& event) override;
  Status Synchronize(Event& event) override;
  Status Synchronize(Stream& stream) override;

  // Enqueues `kernel` on `stream` (what a model's launch is to a GPU), logged under `label`.
  void Launch(Stream& stream, std::string label, std::function<void()> kernel);

  // The operations that have run, in the order they finished.
  std::vector<FakeOp> log() const;
  // Problems a real device would have turned into wrong results or crashes (see the file
  // comment); empty when none.
  std::vector<std::string> violations() const;
  // Blocks until `n` operations of `kind` have finished or `timeout` passed; false on timeout.
  bool WaitForOps(FakeOp::Kind kind, size_t n, std::chrono::milliseconds timeout) const;
  // Makes the next Alloc* fail (to test errors while setting up).
  void FailNextAlloc();
  // Makes every copy fail to enqueue from now on (to test errors mid-run).
  void FailCopies(bool fail);
  size_t live_allocations() const;  // Allocated and not freed.

 private:
  class FakeStream;
  class FakeEvent;
  struct Work {
    FakeOp op;
    std::function<void()> run;  // The operation's effect (may be empty).
    FakeEvent* wait = nullptr;  // kWait: the event waited for.
    uint64_t wait_target = 0;   // kWait: the recording it waits for.
  };
  void Enqueue(Stream& stream, Work work);
  void Finish(FakeOp op);
  void AddViolation(std::string what);
  int64_t Tick();
  Status Alloc(size_t bytes, bool host, void** out);
  void Free(void* ptr, bool host);

  const std::chrono::microseconds copy_delay_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  int64_t clock_ GUARDED_BY(mu_) = 0;
  int next_stream_ GUARDED_BY(mu_) = 0;
  std::vector<FakeOp> log_ GUARDED_BY(mu_);
  std::vector<std::string> violations_ GUARDED_BY(mu_);
  // Allocation -> its size and pending operations touching it.
  struct Allocation {
    size_t bytes = 0;
    bool host = false;
    int pending = 0;
    bool freed = false;  // Freed with work pending: kept until the device goes.
  };
  std::map<const std::byte*, Allocation> allocations_ GUARDED_BY(mu_);
  bool fail_next_alloc_ GUARDED_BY(mu_) = false;
  bool fail_copies_ GUARDED_BY(mu_) = false;
  // Marks the allocations holding [p, p+bytes) as having one more (delta 1) or one less pending op.
  void Touch(const void* p, int delta) REQUIRES(mu_);
};

}  // namespace sluice::device
