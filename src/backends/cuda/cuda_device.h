// The device interface (device/device.h) over the CUDA runtime: one GPU, streams that never
// synchronise with the legacy default stream, events without timing, page-locked host memory.
// Thin on purpose: the logic is in device/copy_pipeline.cc, tested through FakeDevice.
//
// Part of the CUDA library (libsluice_cuda.so), which only a GPU model loads.
#pragma once

#include <string>

#include "device/device.h"

namespace sluice::device {

// Thread-safe.
class CudaDevice final : public Device {
 public:
  // `ordinal`: the GPU's index as the CUDA runtime counts them (after CUDA_VISIBLE_DEVICES).
  explicit CudaDevice(int ordinal);

  std::string name() const override;
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
  Status Health() const override;

  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
};

}  // namespace sluice::device
