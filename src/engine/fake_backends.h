// Backends for tests and micro-benchmarks of the engine: no model, exact behaviour.
//
// EchoInstance returns its inputs as its outputs (no copy), so a test can check that each request
// got its own rows back. It can hold every batch at a gate (to keep an instance busy), fail any
// batch that contains a marker value (to test per-request retry), lose its device for good on
// another (a sticky CUDA error: that batch and every later one fail), and it logs every batch.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "sluice/backend.h"

namespace sluice::testing {

// Shared by a test and its instances. Thread-safe.
class EchoLog {
 public:
  // Batches wait in Run() while the gate is closed (it starts open).
  void CloseGate() {
    MutexLock lock(mu_);
    gate_open_ = false;
  }
  void OpenGate() {
    {
      MutexLock lock(mu_);
      gate_open_ = true;
    }
    cv_.SignalAll();
  }
  // Blocks until `n` batches have entered Run() (including ones waiting at the gate).
  void WaitForBatchesStarted(size_t n) {
    MutexLock lock(mu_);
    while (batch_sizes_.size() < n) cv_.Wait(lock);
  }
  // Samples of each batch that entered Run(), in order.
  std::vector<int64_t> batch_sizes() const {
    MutexLock lock(mu_);
    return batch_sizes_;
  }
  int attached() const {
    MutexLock lock(mu_);
    return attached_;
  }

  // Called by instances.
  void RecordAttach() {
    MutexLock lock(mu_);
    ++attached_;
  }
  void EnterRun(int64_t samples) {
    MutexLock lock(mu_);
    batch_sizes_.push_back(samples);
    cv_.SignalAll();
    while (!gate_open_) cv_.Wait(lock);
  }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  bool gate_open_ GUARDED_BY(mu_) = true;
  std::vector<int64_t> batch_sizes_ GUARDED_BY(mu_);
  int attached_ GUARDED_BY(mu_) = 0;
};

// A float input value that makes a batch fail.
inline constexpr float kFailMarker = -12345.0f;
// One that makes the instance's device fail for good.
inline constexpr float kDeviceLossMarker = -54321.0f;

class EchoInstance : public BackendInstance {
 public:
  // `log` may be nullptr (no logging, no gate): the fast path for micro-benchmarks.
  explicit EchoInstance(EchoLog* log = nullptr) : log_(log) {}

  Status AttachToCurrentThread() override {
    thread_ = std::this_thread::get_id();
    if (log_) log_->RecordAttach();
    return Status::Ok();
  }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    if (std::this_thread::get_id() != thread_) {
      return Status::Internal("instance called from a thread it is not attached to");
    }
    if (log_) log_->EnterRun(inputs.empty() ? 0 : inputs[0].shape()[0]);
    if (Status lost = DeviceFailure(); !lost.ok()) return lost;
    for (const Tensor& input : inputs) {
      if (input.dtype() != DataType::kFp32) continue;
      for (float v : input.values<float>()) {
        if (v == kFailMarker) return Status::Internal("marker input");
        if (v == kDeviceLossMarker) {
          MutexLock lock(mu_);
          lost_ = Status::Unavailable(
              "GPU 0 failed for the rest of this process: an illegal "
              "memory access was encountered");
          return lost_;
        }
      }
    }
    return inputs;
  }

  Status DeviceFailure() const override {
    MutexLock lock(mu_);
    return lost_;
  }

 private:
  EchoLog* log_;
  std::thread::id thread_;
  mutable Mutex mu_;
  Status lost_ GUARDED_BY(mu_);
};

class EchoBackend : public Backend {
 public:
  // `gpus`: those it says it loaded on (a GPU backend resolves a group that named none).
  explicit EchoBackend(EchoLog* log = nullptr, std::vector<int> gpus = {})
      : log_(log), gpus_(std::move(gpus)) {}
  Result<std::unique_ptr<BackendInstance>> CreateInstance(int) override {
    return std::unique_ptr<BackendInstance>(std::make_unique<EchoInstance>(log_));
  }
  const LoadReport& load_report() const override { return report_; }
  std::vector<int> gpus() const override { return gpus_; }

 private:
  EchoLog* log_;
  std::vector<int> gpus_;
  LoadReport report_{0, 0, 0, "echo", {}};
};

}  // namespace sluice::testing
