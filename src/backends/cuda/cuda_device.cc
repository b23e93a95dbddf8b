#include "backends/cuda/cuda_device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace sluice::device {
namespace {

Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(
      fmt::format("{} failed: {} ({})", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

// Makes `ordinal` the calling thread's current device for one call.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != ordinal) cudaSetDevice(ordinal);
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }

 private:
  int previous_ = -1;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  ~CudaStream() override { cudaStreamDestroy(stream_); }
  void* native() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

cudaStream_t Native(Stream& s) { return static_cast<CudaStream&>(s).get(); }
cudaEvent_t Native(Event& e) { return static_cast<CudaEvent&>(e).get(); }

}  // namespace

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {}

std::string CudaDevice::name() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal_) != cudaSuccess) {
    return fmt::format("cuda:{}", ordinal_);
  }
  return fmt::format("cuda:{} ({})", ordinal_, prop.name);
}

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream() {
  DeviceScope scope(ordinal_);
  cudaStream_t stream = nullptr;
  SLUICE_RETURN_IF_ERROR(
      Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  return std::unique_ptr<Stream>(std::make_unique<CudaStream>(stream));
}

Result<std::unique_ptr<Event>> CudaDevice::CreateEvent() {
  DeviceScope scope(ordinal_);
  cudaEvent_t event = nullptr;
  SLUICE_RETURN_IF_ERROR(
      Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
  return std::unique_ptr<Event>(std::make_unique<CudaEvent>(event));
}

Result<void*> CudaDevice::AllocHost(size_t bytes) {
  DeviceScope scope(ordinal_);
  void* p = nullptr;
  SLUICE_RETURN_IF_ERROR(Check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc"));
  return p;
}

void CudaDevice::FreeHost(void* ptr) { cudaFreeHost(ptr); }

Result<void*> CudaDevice::AllocDevice(size_t bytes) {
  DeviceScope scope(ordinal_);
  void* p = nullptr;
  SLUICE_RETURN_IF_ERROR(Check(cudaMalloc(&p, bytes), "cudaMalloc"));
  return p;
}

void CudaDevice::FreeDevice(void* ptr) {
  DeviceScope scope(ordinal_);
  cudaFree(ptr);
}

Status CudaDevice::CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Native(stream)),
               "cudaMemcpyAsync (host to device)");
}

Status CudaDevice::CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Native(stream)),
               "cudaMemcpyAsync (device to host)");
}

Status CudaDevice::Record(Event& event, Stream& stream) {
  return Check(cudaEventRecord(Native(event), Native(stream)), "cudaEventRecord");
}

Status CudaDevice::StreamWait(Stream& stream, Event& event) {
  return Check(cudaStreamWaitEvent(Native(stream), Native(event), 0), "cudaStreamWaitEvent");
}

Status CudaDevice::Synchronize(Event& event) {
  return Check(cudaEventSynchronize(Native(event)), "cudaEventSynchronize");
}

Status CudaDevice::Synchronize(Stream& stream) {
  return Check(cudaStreamSynchronize(Native(stream)), "cudaStreamSynchronize");
}

Status CudaDevice::Health() const {
  DeviceScope scope(ordinal_);
  // Any call on the context returns a sticky error once there has been one; a query of an idle
  // stream does nothing else.
  const cudaError_t error = cudaStreamQuery(cudaStreamPerThread);
  switch (error) {
    // The errors CUDA 13's driver_types.h documents as leaving the process "in an inconsistent
    // state": it "must be terminated and relaunched" to use CUDA again.
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
      return Status::Unavailable(fmt::format(
          "GPU {} failed for the rest of this process: {} ({}); the server must restart to use "
          "it again",
          ordinal_, cudaGetErrorString(error), cudaGetErrorName(error)));
    default:
      return Status::Ok();
  }
}

}  // namespace sluice::device
