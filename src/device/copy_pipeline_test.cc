// The GPU path's pipelining, driven through FakeDevice: results, the order of copies and compute,
// the overlap of one batch's copy in with another's compute, buffer reuse, errors and shutdown.
#include "device/copy_pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "device/fake_device.h"

namespace sluice::device {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr size_t kBytes = 4096;

std::vector<std::byte> Batch(int seed, size_t bytes = kBytes) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((seed * 31 + i * 7) & 0xff);
  return v;
}

// A model that adds one to every byte, on the compute stream, into a device output buffer of its
// own per slot (as a CUDA graph's static output is per slot).
class AddOneModel {
 public:
  AddOneModel(FakeDevice& device, int slots, size_t bytes = kBytes) : device_(device) {
    for (int i = 0; i < slots; ++i) outputs_.push_back(*device.AllocDevice(bytes));
  }
  ~AddOneModel() {
    for (void* p : outputs_) device_.FreeDevice(p);
  }

  // `before` runs first inside the kernel (on the compute stream's thread).
  ComputeFn Fn(std::function<void(const DeviceBatch&)> before = nullptr) {
    return [this, before](const DeviceBatch& batch) -> Result<DeviceOutputs> {
      auto* in = static_cast<const uint8_t*>(batch.inputs[0]);
      auto* out = static_cast<uint8_t*>(outputs_[batch.slot]);
      size_t n = batch.input_bytes[0];
      device_.Launch(*batch.stream, "compute", [in, out, n, before, batch] {
        if (before) before(batch);
        for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(in[i] + 1);
      });
      return DeviceOutputs{{outputs_[batch.slot]}, {n}, nullptr};
    };
  }

 private:
  FakeDevice& device_;
  std::vector<void*> outputs_;
};

std::unique_ptr<CopyPipeline> MakePipeline(FakeDevice& device, int slots, size_t bytes = kBytes,
                                           int copy_threads = 1) {
  CopyPipelineOptions options;
  options.slots = slots;
  options.input_bytes = {bytes};
  options.output_bytes = {bytes};
  options.copy_threads = copy_threads;
  auto pipeline = CopyPipeline::Create(device, options);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status().message();
  return std::move(*pipeline);
}

Status RunBatch(CopyPipeline& pipeline, const ComputeFn& fn, const std::vector<std::byte>& in,
                std::vector<std::byte>& out) {
  out.assign(in.size(), std::byte{0});
  return pipeline.Run({std::span<const std::byte>(in)}, fn, {std::span<std::byte>(out)});
}

void ExpectAddedOne(const std::vector<std::byte>& in, const std::vector<std::byte>& out) {
  ASSERT_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t>(out[i]), static_cast<uint8_t>(static_cast<uint8_t>(in[i]) + 1))
        << "byte " << i;
  }
}

TEST(CopyPipelineTest, EveryBatchGetsItsOwnResultsFromManyThreads) {
  FakeDevice device(100us);
  {
    AddOneModel model(device, 2);
    auto pipeline = MakePipeline(device, 2);
    ComputeFn fn = model.Fn();
    std::vector<std::thread> workers;
    std::atomic<int> wrong{0};
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        for (int k = 0; k < 25; ++k) {
          std::vector<std::byte> in = Batch(w * 100 + k, 512 + 64 * ((w + k) % 50)), out;
          Status s = RunBatch(*pipeline, fn, in, out);
          bool right = s.ok();
          for (size_t i = 0; right && i < in.size(); ++i) {
            right = static_cast<uint8_t>(out[i]) == static_cast<uint8_t>(uint8_t(in[i]) + 1);
          }
          if (!right) ++wrong;
        }
      });
    }
    for (auto& t : workers) t.join();
    EXPECT_EQ(wrong.load(), 0);
  }
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
  EXPECT_EQ(device.live_allocations(), 0u);
}

// Large inputs are staged by several threads: every byte lands, whatever the split.
TEST(CopyPipelineTest, LargeInputsAreStagedInPartsByTheCopyThreads) {
  constexpr size_t kLarge = (size_t{3} << 20) + 3;  // Not a multiple of the 4 parts.
  FakeDevice device;
  {
    AddOneModel model(device, 2, kLarge);
    auto pipeline = MakePipeline(device, 2, kLarge, 4);
    ComputeFn fn = model.Fn();
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] {
        for (int k = 0; k < 3; ++k) {
          std::vector<std::byte> in = Batch(w * 10 + k, kLarge - k), out;
          ASSERT_TRUE(RunBatch(*pipeline, fn, in, out).ok());
          ExpectAddedOne(in, out);
        }
      });
    }
    for (auto& t : workers) t.join();
  }
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
  CopyPipelineOptions options;
  options.input_bytes = {1};
  options.copy_threads = 17;
  EXPECT_EQ(CopyPipeline::Create(device, options).status().code(), StatusCode::kInvalidArgument);
}

// Each stage on its own stream, in order within a batch: the copy in finished before the compute
// that reads it started, the copy out started after the compute finished, and the compute saw the
// batch's own bytes (a compute run before its copy would see the last batch's).
TEST(CopyPipelineTest, CopiesAndComputeAreOrderedByEventsOnThreeStreams) {
  FakeDevice device(1ms);
  AddOneModel model(device, 1);
  auto pipeline = MakePipeline(device, 1);
  std::atomic<int> stale{0};
  int expected_seed = 0;
  ComputeFn fn = model.Fn([&](const DeviceBatch& batch) {
    std::vector<std::byte> want = Batch(expected_seed);
    if (std::memcmp(batch.inputs[0], want.data(), kBytes) != 0) ++stale;
  });
  for (expected_seed = 0; expected_seed < 3; ++expected_seed) {
    std::vector<std::byte> in = Batch(expected_seed), out;
    ASSERT_TRUE(RunBatch(*pipeline, fn, in, out).ok());
    ExpectAddedOne(in, out);
  }
  EXPECT_EQ(stale.load(), 0);
  std::vector<FakeOp> log = device.log();
  std::vector<FakeOp> h2d, kernels, d2h;
  for (const FakeOp& op : log) {
    if (op.kind == FakeOp::Kind::kCopyToDevice) h2d.push_back(op);
    if (op.kind == FakeOp::Kind::kKernel) kernels.push_back(op);
    if (op.kind == FakeOp::Kind::kCopyToHost) d2h.push_back(op);
  }
  ASSERT_EQ(h2d.size(), 3u);
  ASSERT_EQ(kernels.size(), 3u);
  ASSERT_EQ(d2h.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_LT(h2d[k].finished, kernels[k].started) << "batch " << k;
    EXPECT_LT(kernels[k].finished, d2h[k].started) << "batch " << k;
    EXPECT_NE(h2d[k].stream, kernels[k].stream);
    EXPECT_NE(d2h[k].stream, kernels[k].stream);
    EXPECT_NE(h2d[k].stream, d2h[k].stream);
  }
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
}

// The point of the pipeline: while batch 0 computes, batch 1 is copied in. Batch 0's compute
// waits (up to 5 s) for a second copy to the device to have finished; with the overlap lost (one
// lock over a whole run, or the copy queued behind the compute on one stream) it never comes.
TEST(CopyPipelineTest, NextBatchIsCopiedInWhileThisOneComputes) {
  FakeDevice device(500us);
  AddOneModel model(device, 2);
  auto pipeline = MakePipeline(device, 2);
  std::promise<void> computing;
  std::atomic<bool> overlapped{false};
  std::atomic<bool> first{true};
  ComputeFn fn = model.Fn([&](const DeviceBatch&) {
    if (!first.exchange(false)) return;
    computing.set_value();
    overlapped = device.WaitForOps(FakeOp::Kind::kCopyToDevice, 2, 5000ms);
  });
  std::vector<std::byte> in0 = Batch(1), out0, in1 = Batch(2), out1;
  std::thread a([&] { EXPECT_TRUE(RunBatch(*pipeline, fn, in0, out0).ok()); });
  computing.get_future().wait();
  std::thread b([&] { EXPECT_TRUE(RunBatch(*pipeline, fn, in1, out1).ok()); });
  a.join();
  b.join();
  EXPECT_TRUE(overlapped) << "batch 1's copy in did not run while batch 0 computed";
  ExpectAddedOne(in0, out0);
  ExpectAddedOne(in1, out1);
  // In the log: a copy to the device that started and finished inside the first compute.
  std::vector<FakeOp> log = device.log();
  const FakeOp* kernel = nullptr;
  for (const FakeOp& op : log) {
    if (op.kind == FakeOp::Kind::kKernel) {
      kernel = &op;
      break;
    }
  }
  ASSERT_NE(kernel, nullptr);
  bool inside = false;
  for (const FakeOp& op : log) {
    inside |= op.kind == FakeOp::Kind::kCopyToDevice && op.started > kernel->started &&
              op.finished < kernel->finished;
  }
  EXPECT_TRUE(inside);
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
}

// Batch 1's results leave on the copy-out stream while batch 2 computes: the copy out does not
// queue behind the next compute.
TEST(CopyPipelineTest, ResultsAreCopiedOutWhileTheNextBatchComputes) {
  FakeDevice device(500us);
  AddOneModel model(device, 2);
  auto pipeline = MakePipeline(device, 2);
  std::atomic<int> started{0};
  std::promise<void> second_computing;
  std::atomic<bool> overlapped{false};
  ComputeFn fn = model.Fn([&](const DeviceBatch&) {
    int k = started++;
    if (k == 1) {
      second_computing.set_value();
      overlapped = device.WaitForOps(FakeOp::Kind::kCopyToHost, 1, 5000ms);
    }
  });
  std::vector<std::byte> in0 = Batch(3), out0, in1 = Batch(4), out1;
  std::thread b;
  {
    // Batch 0 goes first; batch 1 starts once batch 0's compute has begun.
    std::thread a([&] { EXPECT_TRUE(RunBatch(*pipeline, fn, in0, out0).ok()); });
    while (started.load() < 1) std::this_thread::sleep_for(100us);
    b = std::thread([&] { EXPECT_TRUE(RunBatch(*pipeline, fn, in1, out1).ok()); });
    a.join();
  }
  b.join();
  EXPECT_TRUE(overlapped) << "batch 0's copy out waited for batch 1's compute";
  ExpectAddedOne(in0, out0);
  ExpectAddedOne(in1, out1);
}

TEST(CopyPipelineTest, AComputeErrorFailsItsBatchAndTheNextOneRuns) {
  FakeDevice device;
  AddOneModel model(device, 1);
  auto pipeline = MakePipeline(device, 1);
  ComputeFn failing = [](const DeviceBatch&) -> Result<DeviceOutputs> {
    return Status::Internal("forward failed: out of memory");
  };
  std::vector<std::byte> in = Batch(5), out;
  Status s = RunBatch(*pipeline, failing, in, out);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("out of memory"));
  ASSERT_TRUE(RunBatch(*pipeline, model.Fn(), in, out).ok());
  ExpectAddedOne(in, out);
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
}

TEST(CopyPipelineTest, ACopyErrorFailsItsBatchAndTheNextOneRuns) {
  FakeDevice device;
  AddOneModel model(device, 1);
  auto pipeline = MakePipeline(device, 1);
  std::vector<std::byte> in = Batch(6), out;
  device.FailCopies(true);
  EXPECT_EQ(RunBatch(*pipeline, model.Fn(), in, out).code(), StatusCode::kInternal);
  device.FailCopies(false);
  ASSERT_TRUE(RunBatch(*pipeline, model.Fn(), in, out).ok());
  ExpectAddedOne(in, out);
}

TEST(CopyPipelineTest, OutputsOfTheWrongSizeAreAnErrorNotAnOverrun) {
  FakeDevice device;
  AddOneModel model(device, 1);
  auto pipeline = MakePipeline(device, 1);
  std::vector<std::byte> in = Batch(7);
  std::vector<std::byte> out(kBytes / 2);
  Status s =
      pipeline->Run({std::span<const std::byte>(in)}, model.Fn(), {std::span<std::byte>(out)});
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("output 0 holds 4096 bytes; 2048 expected"));
  std::vector<std::byte> too_big(kBytes + 1);
  std::vector<std::byte> out2(kBytes + 1);
  EXPECT_EQ(
      pipeline->Run({std::span<const std::byte>(too_big)}, model.Fn(), {std::span<std::byte>(out2)})
          .code(),
      StatusCode::kInvalidArgument);
}

// Close() during a run: the run in flight finishes with its results, a run waiting for a slot is
// refused (503), and the pipeline is destroyed only after the copies in flight, freeing nothing
// with work on it.
TEST(CopyPipelineTest, CloseMidRunFinishesTheRunInFlightAndRefusesTheRest) {
  FakeDevice device(1ms);
  {
    AddOneModel model(device, 1);
    auto pipeline = MakePipeline(device, 1);
    std::promise<void> computing, release;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<bool> first{true};
    ComputeFn fn = model.Fn([&, released](const DeviceBatch&) {
      if (!first.exchange(false)) return;
      computing.set_value();
      released.wait();
    });
    std::vector<std::byte> in0 = Batch(8), out0, in1 = Batch(9), out1;
    Status s0, s1;
    std::thread a([&] { s0 = RunBatch(*pipeline, fn, in0, out0); });
    computing.get_future().wait();
    std::thread b([&] { s1 = RunBatch(*pipeline, fn, in1, out1); });
    std::this_thread::sleep_for(20ms);  // b waits for the only slot.
    pipeline->Close();
    b.join();
    EXPECT_EQ(s1.code(), StatusCode::kUnavailable);
    std::thread destroy([&] { pipeline.reset(); });  // Waits for a's run.
    std::this_thread::sleep_for(20ms);
    release.set_value();
    a.join();
    destroy.join();
    EXPECT_TRUE(s0.ok()) << s0.message();
    ExpectAddedOne(in0, out0);
  }
  EXPECT_THAT(device.violations(), ::testing::IsEmpty());
  EXPECT_EQ(device.live_allocations(), 0u);
}

TEST(CopyPipelineTest, AnAllocationFailureAtCreateLeaksNothing) {
  FakeDevice device;
  device.FailNextAlloc();
  CopyPipelineOptions options;
  options.input_bytes = {kBytes};
  options.output_bytes = {kBytes};
  auto pipeline = CopyPipeline::Create(device, options);
  ASSERT_FALSE(pipeline.ok());
  EXPECT_THAT(pipeline.status().message(), HasSubstr("out of memory"));
  EXPECT_EQ(device.live_allocations(), 0u);
  options.slots = 0;
  EXPECT_EQ(CopyPipeline::Create(device, options).status().code(), StatusCode::kInvalidArgument);
}

// The fake itself catches what the pipeline must never do.
TEST(FakeDeviceTest, CatchesAHostBufferChangedBeforeItsCopyAndAFreeWithWorkPending) {
  FakeDevice device(5ms);
  {
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    void* host = *device.AllocHost(64);
    void* dev = *device.AllocDevice(64);
    std::memset(host, 1, 64);
    ASSERT_TRUE(device.CopyToDevice(dev, host, 64, **stream).ok());
    std::memset(host, 2, 64);  // Before the copy ran.
    device.FreeDevice(dev);    // With the copy pending.
    ASSERT_TRUE(device.Synchronize(**stream).ok());
    device.FreeHost(host);
  }
  std::vector<std::string> v = device.violations();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_THAT(v[0], HasSubstr("freed with 1 operations on it still pending"));
  EXPECT_THAT(v[1], HasSubstr("a host buffer changed before its copy to the device ran"));
}

}  // namespace
}  // namespace sluice::device
