// The GPU backend: TorchScript modules and AOTInductor packages compiled for CUDA, run on GPU
// instances that each own a compute stream and a copy pipeline (device/copy_pipeline.h).
//
// Built into libsluice_cuda.so, the only code that includes libtorch's CUDA headers; the sluice
// binary loads it with dlopen (backends/cuda_loader.cc) when a model asks for a GPU, so a CPU
// server never loads libtorch_cuda, cuBLAS or cuDNN.
//
// Per GPU instance (`instance_group[0].count` on each of `gpus`, every visible GPU where the group
// names none): a CudaDevice, a CopyPipeline of `copy_slots` slots and, for fixed-shape models, one
// CUDA graph per (slot, batch bucket). The engine runs `copy_slots` workers per instance: while
// one worker's batch computes, the next one's is copied in, and the one before is copied out.
//
// Each slot's graphs are captured into a memory pool of the slot's own. A pool shared by every
// graph is safe only when they replay in capture order: a graph captured later may place its
// outputs where an earlier one kept its intermediates, so the earlier one's next replay (slot 0's
// next batch) would overwrite them while they are still copied out (slot 1's answers). Within one
// slot the graphs replay one batch at a time, each batch's outputs copied out before the next,
// which a shared pool allows.
//
// A sticky CUDA error (device::Device::Health()) leaves the GPU unusable for the rest of the
// process: the instance reports it (BackendInstance::DeviceFailure()) and fails at once from then
// on, and the engine marks the model not ready and reloads it.
//
// On the device a batch is: raw bytes in (UINT8 images [N, H, W, C] are made [N, C, H, W]
// channels-last by a view and normalised by preprocess.image's mean and std in the compute
// precision), the module or package, each output converted to its declared datatype, bytes out.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/torch_tensors.h"
#include "common/mutex.h"
#include "config/model_config.h"
#include "device/copy_pipeline.h"
#include "sluice/backend.h"

namespace sluice {
namespace {

using torch_backend::SecondsSince;

at::ScalarType ComputeType(Precision p) {
  switch (p) {
    case Precision::kFp16:
      return at::kHalf;
    case Precision::kBf16:
      return at::kBFloat16;
    default:
      return at::kFloat;
  }
}

int64_t SampleBytes(const TensorSpec& spec) {
  int64_t n = DataTypeSize(spec.datatype);
  for (int64_t d : spec.shape) n *= std::max<int64_t>(d, 1);
  return n;
}

// The model's weights on one GPU, shared by that GPU's instances.
struct GpuWeights {
  int gpu = 0;
  torch::jit::Module module;                                      // TorchScript, or
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> aoti;  // an AOTInductor package.
  bool package_channels_last = false;  // The package takes channels-last inputs.
};

struct Graph {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::vector<at::Tensor> outputs;  // Static: the graph writes them at every replay.
};

// The key of a config's GPU request, for errors.
const std::string& GpuKey(const ModelConfig& config) { return config.instances.gpu_source_key; }

// cuDNN's benchmark flag is the process's: on, every convolution shape first seen is timed
// against cuDNN's algorithms. Instances that capture CUDA graphs want it while they capture (the
// graphs keep the algorithms chosen); eager instances run with cuDNN's heuristics, so that no
// new batch size pays a benchmark on a request's time and no load changes how another model runs.
// Held by one capture at a time (models load in parallel).
class CudnnBenchmarkScope {
 public:
  CudnnBenchmarkScope() : lock_(Mu()) {
    previous_ = at::globalContext().benchmarkCuDNN();
    at::globalContext().setBenchmarkCuDNN(true);
  }
  ~CudnnBenchmarkScope() { at::globalContext().setBenchmarkCuDNN(previous_); }

 private:
  static Mutex& Mu() {
    static Mutex mu;
    return mu;
  }
  MutexLock lock_;
  bool previous_ = false;
};

class GpuInstance {
 public:
  GpuInstance(const ModelConfig& config, std::shared_ptr<GpuWeights> weights)
      : config_(config), weights_(std::move(weights)), device_(weights_->gpu) {}

  ~GpuInstance() {
    if (pipeline_) pipeline_->Close();
    pipeline_.reset();  // Waits for runs in flight and the streams before freeing buffers.
    graphs_.clear();
  }

  Status Init() {
    device::CopyPipelineOptions options;
    options.slots = config_.instances.copy_slots;
    // A full batch of images is tens of MB to stage: spread over a few cores.
    options.copy_threads =
        static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency() / 4, 1, 4));
    for (const TensorSpec& in : config_.inputs) {
      options.input_bytes.push_back(SampleBytes(in) * config_.max_batch_size);
    }
    for (const TensorSpec& out : config_.outputs) {
      options.output_bytes.push_back(SampleBytes(out) * config_.max_batch_size);
    }
    auto pipeline = device::CopyPipeline::Create(device_, options);
    if (!pipeline.ok()) return pipeline.status();
    pipeline_ = std::move(*pipeline);
    const at::ScalarType type = ComputeType(config_.precision);
    auto on_gpu = at::TensorOptions().device(at::kCUDA, weights_->gpu);
    if (config_.inputs[0].datatype == DataType::kUInt8 && config_.preprocess_image) {
      const ImagePreprocessConfig& img = *config_.preprocess_image;
      const int c = img.channels;
      std::vector<float> scale(c), bias(c);
      for (int i = 0; i < c; ++i) {
        float mean = img.mean.empty() ? 0.f : img.mean[img.mean.size() == 1 ? 0 : i];
        float std = img.std.empty() ? 1.f : img.std[img.std.size() == 1 ? 0 : i];
        scale[i] = 1.f / (255.f * std);
        bias[i] = -mean / std;
      }
      scale_ = at::tensor(scale).view({1, c, 1, 1}).to(on_gpu.dtype(type));
      bias_ = at::tensor(bias).view({1, c, 1, 1}).to(on_gpu.dtype(type));
    }
    if (config_.optimize.cuda_graphs.value_or(false)) {
      // Powers of two and the sizes half-way between (1, 2, 3, 4, 6, 8, 12, ...): a batch pads
      // by at most a third, for twice the graphs of powers of two alone.
      for (int64_t b = 1; b < config_.max_batch_size; b *= 2) {
        buckets_.push_back(b);
        if (b >= 2 && b + b / 2 < config_.max_batch_size) buckets_.push_back(b + b / 2);
      }
      buckets_.push_back(config_.max_batch_size);
      return CaptureGraphs();
    }
    return Status::Ok();
  }

  // Called by the engine's workers, up to copy_slots at once.
  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) {
    if (Status failure = DeviceFailure(); !failure.ok()) return failure;
    SLUICE_RETURN_IF_ERROR(torch_backend::CheckInputCount(inputs, config_));
    const int64_t n = inputs[0].shape().empty() ? 0 : inputs[0].shape()[0];
    std::vector<std::span<const std::byte>> in_spans;
    for (size_t i = 0; i < inputs.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(CheckInput(inputs[i], config_.inputs[i], n));
      in_spans.emplace_back(static_cast<const std::byte*>(inputs[i].data()), inputs[i].byte_size());
    }
    std::vector<Tensor> outputs;
    std::vector<std::span<std::byte>> out_spans;
    for (const TensorSpec& spec : config_.outputs) {
      Shape shape{n};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      outputs.push_back(Tensor::Uninitialized(spec.datatype, shape));
      out_spans.emplace_back(static_cast<std::byte*>(outputs.back().mutable_data()),
                             outputs.back().byte_size());
    }
    Status status = pipeline_->Run(
        in_spans, [this, n](const device::DeviceBatch& batch) { return Compute(batch, n); },
        out_spans);
    if (!status.ok()) {
      // A sticky error fails this batch and every later one: kept, and answered from then on.
      if (Status health = device_.Health(); !health.ok()) {
        MutexLock lock(mu_);
        if (failure_.ok()) failure_ = health;
        return failure_;
      }
      return status;
    }
    return outputs;
  }

  Status DeviceFailure() const {
    MutexLock lock(mu_);
    return failure_;
  }

  int gpu() const { return weights_->gpu; }

 private:
  Status CheckInput(const Tensor& in, const TensorSpec& spec, int64_t n) const {
    const Shape& shape = in.shape();
    bool fits = in.dtype() == spec.datatype && shape.size() == spec.shape.size() + 1 &&
                shape[0] == n && n >= 1 && n <= config_.max_batch_size;
    for (size_t d = 0; fits && d < spec.shape.size(); ++d) {
      fits = spec.shape[d] < 0 || shape[d + 1] == spec.shape[d];
    }
    if (fits) return Status::Ok();
    Shape declared{config_.max_batch_size};
    declared.insert(declared.end(), spec.shape.begin(), spec.shape.end());
    return Status::InvalidArgument(
        fmt::format("input '{}' is {} {}; the model takes {} {} (batch up to {})", spec.name,
                    DataTypeName(in.dtype()), ShapeToString(shape), DataTypeName(spec.datatype),
                    ShapeToString(declared), config_.max_batch_size));
  }

  // Device views of the slot's input buffers for a batch of `n`.
  std::vector<at::Tensor> DeviceInputs(const std::vector<void*>& buffers, int64_t n) const {
    std::vector<at::Tensor> views;
    for (size_t i = 0; i < config_.inputs.size(); ++i) {
      const TensorSpec& spec = config_.inputs[i];
      std::vector<int64_t> sizes{n};
      sizes.insert(sizes.end(), spec.shape.begin(), spec.shape.end());
      views.push_back(at::from_blob(buffers[i], sizes,
                                    at::TensorOptions()
                                        .dtype(torch_backend::ToScalarType(spec.datatype))
                                        .device(at::kCUDA, weights_->gpu)));
    }
    return views;
  }

  // Raw inputs -> what the model takes, then the model, then the declared output datatypes.
  // Enqueued on the current stream.
  std::vector<at::Tensor> Forward(const std::vector<at::Tensor>& raw) const {
    const at::ScalarType type = ComputeType(config_.precision);
    const bool channels_last =
        weights_->aoti ? weights_->package_channels_last : config_.optimize.channels_last;
    std::vector<at::Tensor> args;
    for (const at::Tensor& in : raw) {
      at::Tensor x;
      if (scale_.defined()) {
        // [N, H, W, C] uint8 -> [N, C, H, W] (channels-last strides, no copy) -> normalised.
        x = at::addcmul(bias_, in.permute({0, 3, 1, 2}).to(type), scale_);
      } else {
        x = in.is_floating_point() ? in.to(type) : in;
      }
      if (x.dim() == 4) {
        x = channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x.contiguous();
      }
      args.push_back(std::move(x));
    }
    std::vector<at::Tensor> outs;
    if (weights_->aoti) {
      outs = weights_->aoti->run(args, c10::cuda::getCurrentCUDAStream(weights_->gpu).stream());
    } else {
      // The plain interpreter: no profiling runs, no fusion kernels compiled on a later call
      // (which a CUDA graph capture would have to survive); cuDNN does the work.
      torch::jit::GraphOptimizerEnabledGuard plain(false);
      std::vector<c10::IValue> ivalues(args.begin(), args.end());
      c10::IValue result = const_cast<torch::jit::Module&>(weights_->module).forward(ivalues);
      if (result.isTensor()) {
        outs.push_back(result.toTensor());
      } else if (result.isTuple()) {
        for (const auto& e : result.toTupleRef().elements()) outs.push_back(e.toTensor());
      } else if (result.isTensorList()) {
        for (const at::Tensor& t : result.toTensorVector()) outs.push_back(t);
      } else {
        throw std::runtime_error(
            fmt::format("the model returned {}, not tensors", result.tagKind()));
      }
    }
    if (outs.size() != config_.outputs.size()) {
      throw std::runtime_error(fmt::format("the model gave {} outputs, the config declares {}",
                                           outs.size(), config_.outputs.size()));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i] = outs[i].to(torch_backend::ToScalarType(config_.outputs[i].datatype)).contiguous();
    }
    return outs;
  }

  Result<device::DeviceOutputs> Compute(const device::DeviceBatch& batch, int64_t n) {
    try {
      c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(weights_->gpu));
      c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromExternal(
          static_cast<cudaStream_t>(batch.stream->native()), weights_->gpu));
      c10::InferenceMode inference_mode;
      device::DeviceOutputs out;
      std::vector<at::Tensor> results;
      if (!buckets_.empty()) {
        const int64_t bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), n);
        Graph& g = graphs_.at({batch.slot, bucket});
        g.graph->replay();
        results = g.outputs;
      } else {
        results = Forward(DeviceInputs(batch.inputs, n));
        out.keep_alive = std::make_shared<std::vector<at::Tensor>>(results);
      }
      for (size_t i = 0; i < results.size(); ++i) {
        out.data.push_back(results[i].data_ptr());
        out.bytes.push_back(static_cast<size_t>(n * SampleBytes(config_.outputs[i])));
      }
      return out;
    } catch (const c10::Error& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what()));
    }
  }

  // One graph per (slot, bucket), each bucket run a few times first (cuDNN benchmarks its
  // algorithms, TorchScript picks its plan), each slot's graphs in a pool of their own (see the
  // file comment). Thread-local capture: other models may be running on this GPU meanwhile.
  Status CaptureGraphs() {
    try {
      CudnnBenchmarkScope benchmark;
      c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(weights_->gpu));
      c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromExternal(
          static_cast<cudaStream_t>(pipeline_->compute_stream().native()), weights_->gpu));
      c10::InferenceMode inference_mode;
      auto stream = c10::cuda::getCurrentCUDAStream(weights_->gpu);
      for (int slot = 0; slot < pipeline_->slots(); ++slot) {
        const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
        for (int64_t b : buckets_) {
          std::vector<at::Tensor> inputs = DeviceInputs(pipeline_->device_inputs(slot), b);
          for (at::Tensor& t : inputs) t.zero_();
          if (slot == 0) {
            for (int i = 0; i < 3; ++i) Forward(inputs);
          }
          stream.synchronize();
          Graph g;
          g.graph = std::make_unique<at::cuda::CUDAGraph>();
          g.graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
          g.outputs = Forward(inputs);
          g.graph->capture_end();
          g.graph->replay();
          stream.synchronize();
          graphs_[{slot, b}] = std::move(g);
        }
      }
      return Status::Ok();
    } catch (const c10::Error& e) {
      return Status::InvalidArgument(
          fmt::format("model '{}': capturing CUDA graphs failed (set "
                      "optimize.cuda_graphs: false to run without): {}",
                      config_.name, e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return Status::InvalidArgument(
          fmt::format("model '{}': capturing CUDA graphs failed: {}", config_.name, e.what()));
    }
  }

  const ModelConfig config_;
  std::shared_ptr<GpuWeights> weights_;
  device::CudaDevice device_;
  std::unique_ptr<device::CopyPipeline> pipeline_;
  at::Tensor scale_, bias_;       // UINT8 images: x * scale + bias, [1, C, 1, 1].
  std::vector<int64_t> buckets_;  // Captured batch sizes, ascending; empty: no graphs.
  // Written only while loading; read (and replayed, one at a time per slot) after.
  std::map<std::pair<int, int64_t>, Graph> graphs_;
  mutable Mutex mu_;
  Status failure_ GUARDED_BY(mu_);  // The device's sticky error, once there has been one.
};

// One engine worker: a slot's feeder on a GPU instance.
class GpuWorker final : public BackendInstance {
 public:
  explicit GpuWorker(std::shared_ptr<GpuInstance> instance) : instance_(std::move(instance)) {}

  Status AttachToCurrentThread() override {
    try {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(instance_->gpu()));
    } catch (const c10::Error& e) {
      return Status::Internal(e.what_without_backtrace());
    }
    return Status::Ok();
  }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    return instance_->Run(inputs);
  }

  Status DeviceFailure() const override { return instance_->DeviceFailure(); }

 private:
  std::shared_ptr<GpuInstance> instance_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(ModelConfig config) : config_(std::move(config)) {}

  Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) override {
    if (index < 0 || index >= config_.instances.workers()) {
      return Status::InvalidArgument(
          fmt::format("instance {} out of range [0, {})", index, config_.instances.workers()));
    }
    return std::unique_ptr<BackendInstance>(
        std::make_unique<GpuWorker>(instances_[index / config_.instances.copy_slots]));
  }

  const LoadReport& load_report() const override { return report_; }

  std::vector<int> gpus() const override { return config_.instances.gpus; }

  Status Load() {
    std::string key = GpuKey(config_);
    const int visible = c10::cuda::device_count();
    if (visible == 0) {
      return Status::InvalidArgument(fmt::format(
          "model '{}': {}: asks for a GPU, and CUDA finds none on this machine (no NVIDIA "
          "driver or device; serve it with instance_group kind KIND_CPU)",
          config_.name, key));
    }
    // A group that names no GPUs takes every visible one, as Triton's does.
    if (config_.instances.gpus.empty()) {
      for (int gpu = 0; gpu < visible; ++gpu) config_.instances.gpus.push_back(gpu);
    }
    for (size_t i = 0; i < config_.instances.gpus.size(); ++i) {
      if (config_.instances.gpus[i] >= visible) {
        return Status::InvalidArgument(
            fmt::format("model '{}': {}: GPU {} does not exist (CUDA sees {})", config_.name,
                        config_.instances.gpu_source_key == "instances.device"
                            ? std::string("instances.device")
                            : fmt::format("instance_group[0].gpus[{}]", i),
                        config_.instances.gpus[i], visible));
      }
    }
    for (const TensorSpec& out : config_.outputs) {
      for (int64_t d : out.shape) {
        if (d < 1) {
          return Status::InvalidArgument(fmt::format(
              "model '{}': outputs: GPU instances need fixed output shapes ('{}' is {})",
              config_.name, out.name, ShapeToString(out.shape)));
        }
      }
    }
    // Also when a sweep switched a graphs config to a package (the config's own check is then
    // behind it).
    if (config_.backend == BackendKind::kAotInductor &&
        config_.optimize.cuda_graphs.value_or(false)) {
      return Status::InvalidArgument(fmt::format(
          "model '{}': optimize.cuda_graphs: AOTInductor packages cannot be captured as CUDA "
          "graphs (their runtime fails under capture); set cuda_graphs: false",
          config_.name));
    }
    std::error_code ignored;
    if (!std::filesystem::is_regular_file(config_.model_path(), ignored)) {
      return Status::InvalidArgument(
          fmt::format("model '{}': no model file {}", config_.name, config_.model_path().string()));
    }
    report_.runtime =
        fmt::format("libtorch {} (CUDA {}{})", TORCH_VERSION, CUDA_VERSION / 1000,
                    config_.backend == BackendKind::kAotInductor ? ", AOTInductor" : "");
    auto start = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<GpuWeights>> weights;
    try {
      for (int gpu : config_.instances.gpus) {
        auto w = std::make_shared<GpuWeights>();
        w->gpu = gpu;
        SLUICE_RETURN_IF_ERROR(LoadWeights(*w));
        weights.push_back(std::move(w));
      }
    } catch (const c10::Error& e) {
      return Status::InvalidArgument(fmt::format("model '{}': loading {} on the GPU failed: {}",
                                                 config_.name, config_.model_path().string(),
                                                 e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return Status::InvalidArgument(fmt::format("model '{}': loading {} on the GPU failed: {}",
                                                 config_.name, config_.model_path().string(),
                                                 e.what()));
    }
    report_.load_seconds = SecondsSince(start);
    start = std::chrono::steady_clock::now();
    for (const auto& w : weights) {
      for (int i = 0; i < config_.instances.count; ++i) {
        auto instance = std::make_shared<GpuInstance>(config_, w);
        SLUICE_RETURN_IF_ERROR(instance->Init());
        instances_.push_back(std::move(instance));
      }
    }
    report_.optimize_seconds = SecondsSince(start);
    // Every instance: the first request on each would otherwise pay for its lazy set-up (cuDNN
    // and cuBLAS handles on its GPU, its first batch through its pipeline). The first instance's
    // figures seed the batcher's costs; the others' time adds to the warm-up's.
    double warmup_seconds = 0;
    for (size_t i = 0; i < instances_.size(); ++i) {
      GpuWorker warm(instances_[i]);
      LoadReport scratch;
      SLUICE_RETURN_IF_ERROR(torch_backend::WarmUp(warm, config_, i == 0 ? report_ : scratch));
      warmup_seconds += i == 0 ? report_.warmup_seconds : scratch.warmup_seconds;
    }
    report_.warmup_seconds = warmup_seconds;
    return Status::Ok();
  }

 private:
  Status LoadWeights(GpuWeights& w) {
    const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(w.gpu));
    const std::string path = config_.model_path().string();
    if (config_.backend == BackendKind::kAotInductor) {
      auto metadata =
          torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
      auto get = [&](const char* k) {
        auto it = metadata.find(k);
        return it == metadata.end() ? std::string() : it->second;
      };
      if (get("AOTI_DEVICE_KEY") != "cuda") {
        return Status::InvalidArgument(fmt::format(
            "model '{}': {} was compiled for device '{}', not cuda (tools/export_models.py "
            "--device cuda writes CUDA packages on a GPU machine)",
            config_.name, path, get("AOTI_DEVICE_KEY")));
      }
      std::string precision = get("sluice.precision");
      if (!precision.empty() && precision != PrecisionName(config_.precision)) {
        return Status::InvalidArgument(
            fmt::format("model '{}': {} holds a {} model, the config asks for {}", config_.name,
                        path, precision, PrecisionName(config_.precision)));
      }
      std::string max_batch = get("sluice.max_batch_size");
      if (!max_batch.empty() && std::stoi(max_batch) < config_.max_batch_size) {
        return Status::InvalidArgument(
            fmt::format("model '{}': max_batch_size {} exceeds the batch range 1..{} of {}",
                        config_.name, config_.max_batch_size, max_batch, path));
      }
      w.package_channels_last = get("sluice.channels_last") == "1";
      w.aoti = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          path, "model", /*run_single_threaded=*/false,
          /*num_runners=*/
          static_cast<size_t>(config_.instances.count * config_.instances.copy_slots),
          /*device_index=*/static_cast<c10::DeviceIndex>(w.gpu));
      return Status::Ok();
    }
    torch::NoGradGuard no_grad;
    w.module = torch::jit::load(path, device);
    w.module.eval();
    w.module.to(device, ComputeType(config_.precision));
    if (config_.optimize.channels_last) {
      for (at::Tensor p : w.module.parameters()) {
        if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
      }
    }
    if (config_.optimize.freeze) w.module = torch::jit::freeze(w.module);
    return Status::Ok();
  }

  ModelConfig config_;
  LoadReport report_;
  std::vector<std::shared_ptr<GpuInstance>> instances_;
};

}  // namespace
}  // namespace sluice

// CUDA ordinal `ordinal`'s PCI bus id ("0000:3B:00.0") into `out`; 0 on success. The binary
// finds it with dlsym, for NVML's readings.
extern "C" __attribute__((visibility("default"))) int SluiceCudaPciBusId(int ordinal, char* out,
                                                                         int size) {
  return cudaDeviceGetPCIBusId(out, size, ordinal) == cudaSuccess ? 0 : 1;
}

// The entry point the binary finds with dlsym. On success returns a new backend (the caller owns
// it); on failure returns null and sets `*status`.
extern "C" __attribute__((visibility("default"))) sluice::Backend* SluiceCudaLoadBackend(
    const sluice::ModelConfig* config, sluice::Status* status) {
  auto backend = std::make_unique<sluice::CudaBackend>(*config);
  try {
    *status = backend->Load();
  } catch (const c10::Error& e) {
    *status = sluice::Status::Internal(
        fmt::format("model '{}': {}", config->name, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    *status = sluice::Status::Internal(fmt::format("model '{}': {}", config->name, e.what()));
  }
  if (!status->ok()) return nullptr;
  return backend.release();
}
