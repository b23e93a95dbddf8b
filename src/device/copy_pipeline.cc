#include "device/copy_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace sluice::device {

Result<std::unique_ptr<CopyPipeline>> CopyPipeline::Create(Device& device,
                                                           CopyPipelineOptions options) {
  if (options.slots < 1) {
    return Status::InvalidArgument(
        fmt::format("a copy pipeline needs >= 1 slot (got {})", options.slots));
  }
  if (options.input_bytes.empty()) {
    return Status::InvalidArgument("a copy pipeline needs at least one input");
  }
  if (options.copy_threads < 1 || options.copy_threads > 16) {
    return Status::InvalidArgument(
        fmt::format("a copy pipeline takes 1 to 16 copy threads (got {})", options.copy_threads));
  }
  std::unique_ptr<CopyPipeline> pipeline(new CopyPipeline(device, std::move(options)));
  SLUICE_RETURN_IF_ERROR(pipeline->Allocate());
  return pipeline;
}

CopyPipeline::CopyPipeline(Device& device, CopyPipelineOptions options)
    : device_(device), options_(std::move(options)) {}

Status CopyPipeline::Allocate() {
  if (options_.copy_threads > 1) {
    // Each run queues copy_threads - 1 chunks; slots runs may queue at once.
    copiers_ = std::make_unique<ThreadPool>(
        options_.copy_threads - 1,
        static_cast<size_t>(options_.copy_threads) * static_cast<size_t>(options_.slots));
  }
  for (auto* stream : {&h2d_stream_, &compute_stream_, &d2h_stream_}) {
    auto created = device_.CreateStream();
    if (!created.ok()) return created.status();
    *stream = std::move(*created);
  }
  slots_.resize(options_.slots);
  {
    MutexLock lock(mu_);
    busy_.assign(options_.slots, false);
  }
  auto alloc_all = [&](const std::vector<size_t>& sizes, bool host, std::vector<void*>& out) {
    for (size_t bytes : sizes) {
      auto ptr = host ? device_.AllocHost(std::max<size_t>(bytes, 1))
                      : device_.AllocDevice(std::max<size_t>(bytes, 1));
      if (!ptr.ok()) return ptr.status();
      out.push_back(*ptr);
    }
    return Status::Ok();
  };
  for (Slot& slot : slots_) {
    SLUICE_RETURN_IF_ERROR(alloc_all(options_.input_bytes, true, slot.host_in));
    SLUICE_RETURN_IF_ERROR(alloc_all(options_.input_bytes, false, slot.device_in));
    SLUICE_RETURN_IF_ERROR(alloc_all(options_.output_bytes, true, slot.host_out));
    for (auto* event : {&slot.h2d_done, &slot.compute_done, &slot.d2h_done}) {
      auto created = device_.CreateEvent();
      if (!created.ok()) return created.status();
      *event = std::move(*created);
    }
  }
  return Status::Ok();
}

CopyPipeline::~CopyPipeline() {
  Close();
  {
    MutexLock lock(mu_);
    while (running_ > 0) cv_.Wait(lock);
  }
  // Nothing may still read or write a buffer when it is freed.
  if (h2d_stream_ && compute_stream_ && d2h_stream_) Drain();
  for (Slot& slot : slots_) {
    for (void* p : slot.host_in) device_.FreeHost(p);
    for (void* p : slot.device_in) device_.FreeDevice(p);
    for (void* p : slot.host_out) device_.FreeHost(p);
  }
}

void CopyPipeline::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.SignalAll();
}

Result<int> CopyPipeline::AcquireSlot() {
  MutexLock lock(mu_);
  while (true) {
    if (closed_) return Status::Unavailable("the GPU instance is shutting down");
    for (size_t i = 0; i < busy_.size(); ++i) {
      if (!busy_[i]) {
        busy_[i] = true;
        ++running_;
        return static_cast<int>(i);
      }
    }
    cv_.Wait(lock);
  }
}

void CopyPipeline::ReleaseSlot(int index) {
  {
    MutexLock lock(mu_);
    busy_[index] = false;
    --running_;
  }
  cv_.SignalAll();
}

void CopyPipeline::Drain() {
  // Errors here leave nothing better to do than go on: each stream is waited for in turn.
  (void)device_.Synchronize(*h2d_stream_);
  (void)device_.Synchronize(*compute_stream_);
  (void)device_.Synchronize(*d2h_stream_);
}

Status CopyPipeline::Run(const std::vector<std::span<const std::byte>>& inputs,
                         const ComputeFn& compute,
                         const std::vector<std::span<std::byte>>& outputs) {
  if (inputs.size() != options_.input_bytes.size()) {
    return Status::InvalidArgument(fmt::format("the GPU instance takes {} inputs, got {}",
                                               options_.input_bytes.size(), inputs.size()));
  }
  if (outputs.size() != options_.output_bytes.size()) {
    return Status::InvalidArgument(fmt::format("the GPU instance gives {} outputs, {} asked for",
                                               options_.output_bytes.size(), outputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].size() > options_.input_bytes[i]) {
      return Status::InvalidArgument(
          fmt::format("input {} holds {} bytes; the GPU instance's buffers take at most {}", i,
                      inputs[i].size(), options_.input_bytes[i]));
    }
  }
  auto index = AcquireSlot();
  if (!index.ok()) return index.status();
  Status status = RunOnSlot(slots_[*index], *index, inputs, compute, outputs);
  ReleaseSlot(*index);
  return status;
}

void CopyPipeline::StageCopy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kParallelFrom = size_t{1} << 20;
  if (!copiers_ || bytes < kParallelFrom) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t parts = static_cast<size_t>(options_.copy_threads);
  const size_t chunk = (bytes + parts - 1) / parts;
  Mutex mu;
  CondVar done;
  size_t pending = 0;
  auto copy = [dst, src](size_t begin, size_t end) {
    std::memcpy(static_cast<std::byte*>(dst) + begin, static_cast<const std::byte*>(src) + begin,
                end - begin);
  };
  for (size_t p = 1; p < parts; ++p) {
    const size_t begin = std::min(bytes, p * chunk), end = std::min(bytes, begin + chunk);
    if (begin == end) continue;
    {
      MutexLock lock(mu);
      ++pending;
    }
    bool queued = copiers_->TrySubmit([&, begin, end] {
      copy(begin, end);
      MutexLock lock(mu);
      if (--pending == 0) done.SignalAll();
    });
    if (!queued) {  // The pool is full: this thread copies the chunk itself.
      copy(begin, end);
      MutexLock lock(mu);
      --pending;
    }
  }
  copy(0, std::min(bytes, chunk));
  MutexLock lock(mu);
  while (pending > 0) done.Wait(lock);
}

Status CopyPipeline::RunOnSlot(Slot& slot, int index,
                               const std::vector<std::span<const std::byte>>& inputs,
                               const ComputeFn& compute,
                               const std::vector<std::span<std::byte>>& outputs) {
  // The pinned inputs are rewritten only once their last copy to the device has run.
  SLUICE_RETURN_IF_ERROR(device_.Synchronize(*slot.h2d_done));
  DeviceBatch batch;
  batch.slot = index;
  batch.stream = compute_stream_.get();
  Status status = Status::Ok();
  for (size_t i = 0; i < inputs.size() && status.ok(); ++i) {
    if (!inputs[i].empty()) StageCopy(slot.host_in[i], inputs[i].data(), inputs[i].size());
    status =
        device_.CopyToDevice(slot.device_in[i], slot.host_in[i], inputs[i].size(), *h2d_stream_);
    batch.inputs.push_back(slot.device_in[i]);
    batch.input_bytes.push_back(inputs[i].size());
  }
  if (status.ok()) status = device_.Record(*slot.h2d_done, *h2d_stream_);
  if (!status.ok()) {
    Drain();
    return status;
  }

  Result<DeviceOutputs> produced = Status::Internal("compute did not run");
  {
    MutexLock launch(launch_mu_);
    status = device_.StreamWait(*compute_stream_, *slot.h2d_done);
    if (status.ok()) {
      produced = compute(batch);
      status =
          produced.ok() ? device_.Record(*slot.compute_done, *compute_stream_) : produced.status();
    }
  }
  if (status.ok() &&
      (produced->data.size() != outputs.size() || produced->bytes.size() != outputs.size())) {
    status = Status::Internal(fmt::format("the model gave {} outputs, {} declared",
                                          produced->data.size(), outputs.size()));
  }
  for (size_t i = 0; status.ok() && i < outputs.size(); ++i) {
    if (produced->bytes[i] != outputs[i].size() || produced->bytes[i] > options_.output_bytes[i]) {
      status = Status::Internal(
          fmt::format("output {} holds {} bytes; {} expected (buffers take at most {})", i,
                      produced->bytes[i], outputs[i].size(), options_.output_bytes[i]));
    }
  }
  if (!status.ok()) {
    Drain();
    return status;
  }

  status = device_.StreamWait(*d2h_stream_, *slot.compute_done);
  for (size_t i = 0; status.ok() && i < outputs.size(); ++i) {
    status =
        device_.CopyToHost(slot.host_out[i], produced->data[i], produced->bytes[i], *d2h_stream_);
  }
  if (status.ok()) status = device_.Record(*slot.d2h_done, *d2h_stream_);
  if (status.ok()) status = device_.Synchronize(*slot.d2h_done);
  if (!status.ok()) {
    Drain();
    return status;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].empty()) std::memcpy(outputs[i].data(), slot.host_out[i], outputs[i].size());
  }
  return Status::Ok();  // `produced` (and its keep_alive) goes now, after d2h_done.
}

}  // namespace sluice::device
