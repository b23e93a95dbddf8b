#include "device/fake_device.h"

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <string_view>

namespace sluice::device {

class FakeDevice::FakeEvent final : public Event {
 public:
  uint64_t recorded = 0;   // Recordings enqueued (GUARDED_BY the device's mu_).
  uint64_t completed = 0;  // The latest recording that has run (likewise).
};

class FakeDevice::FakeStream final : public Stream {
 public:
  FakeStream(FakeDevice& device, int number) : device_(device), number_(number) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeStream() override {
    {
      MutexLock lock(device_.mu_);
      stopping_ = true;
    }
    device_.cv_.SignalAll();
    thread_.join();
  }
  void* native() const override { return const_cast<FakeStream*>(this); }

  int number() const { return number_; }
  // Called with the device's mu_ held.
  void Push(Work work) { queue_.push_back(std::move(work)); }
  bool Idle() const { return queue_.empty() && !running_; }

 private:
  void Loop() {
    MutexLock lock(device_.mu_);
    while (true) {
      while (queue_.empty() && !stopping_) device_.cv_.Wait(lock);
      if (queue_.empty()) return;
      Work& work = queue_.front();
      if (work.op.kind == FakeOp::Kind::kWait) {
        while (work.wait->completed < work.wait_target) device_.cv_.Wait(lock);
      }
      running_ = true;
      work.op.started = ++device_.clock_;
      std::function<void()> run = std::move(work.run);
      lock.Unlock();
      if (run) run();
      lock.Lock();
      Work done = std::move(queue_.front());
      queue_.pop_front();
      done.op.finished = ++device_.clock_;
      device_.log_.push_back(done.op);
      running_ = false;
      device_.cv_.SignalAll();
    }
  }

  FakeDevice& device_;
  const int number_;
  std::deque<Work> queue_;  // GUARDED_BY the device's mu_.
  bool running_ = false;    // Likewise.
  bool stopping_ = false;   // Likewise.
  std::thread thread_;
};

namespace {

uint64_t Hash(const void* p, size_t bytes) {
  return std::hash<std::string_view>()(std::string_view(static_cast<const char*>(p), bytes));
}

}  // namespace

FakeDevice::FakeDevice(std::chrono::microseconds copy_delay) : copy_delay_(copy_delay) {}

FakeDevice::~FakeDevice() {
  MutexLock lock(mu_);
  for (auto& [ptr, allocation] : allocations_) {
    delete[] ptr;
  }
}

Result<std::unique_ptr<Stream>> FakeDevice::CreateStream() {
  int number;
  {
    MutexLock lock(mu_);
    number = next_stream_++;
  }
  return std::unique_ptr<Stream>(std::make_unique<FakeStream>(*this, number));
}

Result<std::unique_ptr<Event>> FakeDevice::CreateEvent() {
  return std::unique_ptr<Event>(std::make_unique<FakeEvent>());
}

Status FakeDevice::Alloc(size_t bytes, bool host, void** out) {
  MutexLock lock(mu_);
  if (fail_next_alloc_) {
    fail_next_alloc_ = false;
    return Status::Internal(fmt::format("fake device: out of memory allocating {} bytes", bytes));
  }
  auto* p = new std::byte[bytes];
  allocations_[p] = Allocation{bytes, host, 0};
  *out = p;
  return Status::Ok();
}

void FakeDevice::Free(void* ptr, bool host) {
  MutexLock lock(mu_);
  auto it = allocations_.find(static_cast<std::byte*>(ptr));
  if (it == allocations_.end() || it->second.host != host) {
    violations_.push_back(
        fmt::format("freed {} memory it never allocated", host ? "host" : "device"));
    return;
  }
  if (it->second.pending > 0) {
    // Kept until the device goes, so the pending work does not write into freed memory.
    violations_.push_back(fmt::format("{} buffer freed with {} operations on it still pending",
                                      host ? "host" : "device", it->second.pending));
    it->second.freed = true;
    return;
  }
  if (it->second.freed) {
    violations_.push_back(fmt::format("{} buffer freed twice", host ? "host" : "device"));
    return;
  }
  delete[] it->first;
  allocations_.erase(it);
}

Result<void*> FakeDevice::AllocHost(size_t bytes) {
  void* p = nullptr;
  SLUICE_RETURN_IF_ERROR(Alloc(bytes, true, &p));
  return p;
}
void FakeDevice::FreeHost(void* ptr) { Free(ptr, true); }
Result<void*> FakeDevice::AllocDevice(size_t bytes) {
  void* p = nullptr;
  SLUICE_RETURN_IF_ERROR(Alloc(bytes, false, &p));
  return p;
}
void FakeDevice::FreeDevice(void* ptr) { Free(ptr, false); }

void FakeDevice::Touch(const void* p, int delta) {
  auto* b = static_cast<const std::byte*>(p);
  auto it = allocations_.upper_bound(b);
  if (it == allocations_.begin()) return;
  --it;
  if (b < it->first + it->second.bytes) it->second.pending += delta;
}

void FakeDevice::Enqueue(Stream& stream, Work work) {
  auto& fake = static_cast<FakeStream&>(stream);
  {
    MutexLock lock(mu_);
    work.op.stream = fake.number();
    fake.Push(std::move(work));
  }
  cv_.SignalAll();
}

Status FakeDevice::CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) {
  {
    MutexLock lock(mu_);
    if (fail_copies_) return Status::Internal("fake device: copy to device failed");
    Touch(src, 1);
    Touch(dst, 1);
  }
  uint64_t enqueued_hash = Hash(src, bytes);
  Work work;
  work.op.kind = FakeOp::Kind::kCopyToDevice;
  work.op.label = "h2d";
  work.run = [this, dst, src, bytes, enqueued_hash] {
    std::this_thread::sleep_for(copy_delay_);
    bool changed = Hash(src, bytes) != enqueued_hash;
    std::memcpy(dst, src, bytes);
    MutexLock lock(mu_);
    if (changed) violations_.push_back("a host buffer changed before its copy to the device ran");
    Touch(src, -1);
    Touch(dst, -1);
  };
  Enqueue(stream, std::move(work));
  return Status::Ok();
}

Status FakeDevice::CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) {
  {
    MutexLock lock(mu_);
    if (fail_copies_) return Status::Internal("fake device: copy to host failed");
    Touch(src, 1);
    Touch(dst, 1);
  }
  Work work;
  work.op.kind = FakeOp::Kind::kCopyToHost;
  work.op.label = "d2h";
  work.run = [this, dst, src, bytes] {
    std::this_thread::sleep_for(copy_delay_);
    std::memcpy(dst, src, bytes);
    MutexLock lock(mu_);
    Touch(src, -1);
    Touch(dst, -1);
  };
  Enqueue(stream, std::move(work));
  return Status::Ok();
}

Status FakeDevice::Record(Event& event, Stream& stream) {
  auto& fake = static_cast<FakeEvent&>(event);
  uint64_t target;
  {
    MutexLock lock(mu_);
    target = ++fake.recorded;
  }
  Work work;
  work.op.kind = FakeOp::Kind::kRecord;
  work.op.label = "record";
  work.run = [this, &fake, target] {
    {
      MutexLock lock(mu_);
      if (fake.completed < target) fake.completed = target;
    }
    cv_.SignalAll();
  };
  Enqueue(stream, std::move(work));
  return Status::Ok();
}

Status FakeDevice::StreamWait(Stream& stream, Event& event) {
  auto& fake = static_cast<FakeEvent&>(event);
  Work work;
  work.op.kind = FakeOp::Kind::kWait;
  work.op.label = "wait";
  work.wait = &fake;
  {
    MutexLock lock(mu_);
    work.wait_target = fake.recorded;
  }
  Enqueue(stream, std::move(work));
  return Status::Ok();
}

Status FakeDevice::Synchronize(Event& event) {
  auto& fake = static_cast<FakeEvent&>(event);
  MutexLock lock(mu_);
  const uint64_t target = fake.recorded;
  while (fake.completed < target) cv_.Wait(lock);
  return Status::Ok();
}

Status FakeDevice::Synchronize(Stream& stream) {
  auto& fake = static_cast<FakeStream&>(stream);
  MutexLock lock(mu_);
  while (!fake.Idle()) cv_.Wait(lock);
  return Status::Ok();
}

void FakeDevice::Launch(Stream& stream, std::string label, std::function<void()> kernel) {
  Work work;
  work.op.kind = FakeOp::Kind::kKernel;
  work.op.label = std::move(label);
  work.run = std::move(kernel);
  Enqueue(stream, std::move(work));
}

std::vector<FakeOp> FakeDevice::log() const {
  MutexLock lock(mu_);
  return log_;
}

std::vector<std::string> FakeDevice::violations() const {
  MutexLock lock(mu_);
  return violations_;
}

bool FakeDevice::WaitForOps(FakeOp::Kind kind, size_t n, std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(mu_);
  while (true) {
    size_t count = 0;
    for (const FakeOp& op : log_) count += op.kind == kind;
    if (count >= n) return true;
    if (!cv_.WaitUntil(lock, deadline) && std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
  }
}

void FakeDevice::FailNextAlloc() {
  MutexLock lock(mu_);
  fail_next_alloc_ = true;
}

void FakeDevice::FailCopies(bool fail) {
  MutexLock lock(mu_);
  fail_copies_ = fail;
}

size_t FakeDevice::live_allocations() const {
  MutexLock lock(mu_);
  size_t live = 0;
  for (const auto& [ptr, allocation] : allocations_) live += !allocation.freed;
  return live;
}

}  // namespace sluice::device
