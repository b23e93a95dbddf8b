// TorchScript backend. The only translation unit of the CPU path that includes torch headers.
#include "backends/torchscript/torchscript_backend.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/version.h>

#include <chrono>
#include <mutex>
#include <optional>

namespace sluice {
namespace {

std::optional<at::ScalarType> ToScalarType(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return at::kBool;
    case DataType::kUInt8:
      return at::kByte;
    case DataType::kInt8:
      return at::kChar;
    case DataType::kInt16:
      return at::kShort;
    case DataType::kInt32:
      return at::kInt;
    case DataType::kInt64:
      return at::kLong;
    case DataType::kFp16:
      return at::kHalf;
    case DataType::kBf16:
      return at::kBFloat16;
    case DataType::kFp32:
      return at::kFloat;
    case DataType::kFp64:
      return at::kDouble;
  }
  return std::nullopt;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What all instances of one model share. Module::forward may be called from several threads at
// once; the graph executor locks only while it compiles a plan.
struct LoadedModel {
  ModelConfig config;
  torch::jit::Module module;
  LoadReport report;
};

class TorchScriptInstance final : public BackendInstance {
 public:
  explicit TorchScriptInstance(std::shared_ptr<LoadedModel> model) : model_(std::move(model)) {}

  Status AttachToCurrentThread() override {
    try {
      // The first query initialises this thread's OpenMP state; the set then makes the budget
      // this thread's own (OpenMP keeps the thread count per thread).
      (void)at::get_num_threads();
      at::set_num_threads(model_->config.instances.threads);
      return Status::Ok();
    } catch (const std::exception& e) {
      return Status::Internal(
          fmt::format("setting {} threads failed: {}", model_->config.instances.threads, e.what()));
    }
  }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    const ModelConfig& config = model_->config;
    if (inputs.size() != config.inputs.size()) {
      return Status::InvalidArgument(fmt::format("model '{}' takes {} inputs, got {}", config.name,
                                                 config.inputs.size(), inputs.size()));
    }
    try {
      c10::InferenceMode inference_mode;
      std::vector<c10::IValue> args;
      args.reserve(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        Result<at::Tensor> t = ToTorch(inputs[i], config.inputs[i]);
        if (!t.ok()) return t.status();
        args.emplace_back(std::move(*t));
      }
      c10::IValue result = model_->module.forward(std::move(args));
      return FromTorch(result);
    } catch (const c10::Error& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what()));
    }
  }

 private:
  Result<at::Tensor> ToTorch(const Tensor& in, const TensorSpec& spec) const {
    if (in.dtype() != spec.datatype) {
      return Status::InvalidArgument(fmt::format("input '{}' must be {}, got {}", spec.name,
                                                 DataTypeName(spec.datatype),
                                                 DataTypeName(in.dtype())));
    }
    if (in.shape().size() != spec.shape.size() + 1) {
      return Status::InvalidArgument(
          fmt::format("input '{}' must have {} dims (batch first), got {}", spec.name,
                      spec.shape.size() + 1, ShapeToString(in.shape())));
    }
    // Zero copy: the tensor views the caller's buffer, which outlives this call.
    at::Tensor t = torch::from_blob(const_cast<void*>(in.data()), in.shape(),
                                    at::TensorOptions().dtype(*ToScalarType(in.dtype())));
    const ModelConfig& config = model_->config;
    if (config.precision == Precision::kBf16 && t.is_floating_point()) t = t.to(at::kBFloat16);
    if (config.optimize.channels_last && t.dim() == 4) {
      t = t.contiguous(at::MemoryFormat::ChannelsLast);
    }
    return t;
  }

  Result<std::vector<Tensor>> FromTorch(const c10::IValue& result) const {
    std::vector<at::Tensor> tensors;
    if (result.isTensor()) {
      tensors.push_back(result.toTensor());
    } else if (result.isTuple()) {
      for (const auto& v : result.toTupleRef().elements()) {
        if (!v.isTensor()) return Status::Internal("model returned a tuple holding a non-tensor");
        tensors.push_back(v.toTensor());
      }
    } else if (result.isTensorList()) {
      for (const at::Tensor& t : result.toTensorVector()) tensors.push_back(t);
    } else {
      return Status::Internal(fmt::format("model returned {}, expected tensors", result.tagKind()));
    }
    const ModelConfig& config = model_->config;
    if (tensors.size() != config.outputs.size()) {
      return Status::Internal(fmt::format("model returned {} outputs, config declares {}",
                                          tensors.size(), config.outputs.size()));
    }
    std::vector<Tensor> outputs;
    outputs.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      DataType dtype = config.outputs[i].datatype;
      auto holder = std::make_shared<at::Tensor>(tensors[i].to(*ToScalarType(dtype)).contiguous());
      void* data = holder->data_ptr();
      Shape shape(holder->sizes().begin(), holder->sizes().end());
      // The aliasing shared_ptr keeps the torch tensor (and so its storage) alive.
      outputs.push_back(
          Tensor::Wrap(dtype, std::move(shape), std::shared_ptr<const void>(holder, data), data));
    }
    return outputs;
  }

  std::shared_ptr<LoadedModel> model_;
};

class TorchScriptBackend final : public Backend {
 public:
  explicit TorchScriptBackend(std::shared_ptr<LoadedModel> model) : model_(std::move(model)) {}

  Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) override {
    if (index < 0 || index >= model_->config.instances.count) {
      return Status::InvalidArgument(
          fmt::format("instance {} out of range [0, {})", index, model_->config.instances.count));
    }
    return std::unique_ptr<BackendInstance>(std::make_unique<TorchScriptInstance>(model_));
  }

  const LoadReport& load_report() const override { return model_->report; }

 private:
  std::shared_ptr<LoadedModel> model_;
};

// Converts 4-D parameters to NHWC so convolutions need no layout change per call.
void ToChannelsLast(torch::jit::Module& module) {
  torch::NoGradGuard no_grad;
  for (at::Tensor p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
}

Status WarmUp(const std::shared_ptr<LoadedModel>& model) {
  TorchScriptInstance instance(model);
  SLUICE_RETURN_IF_ERROR(instance.AttachToCurrentThread());
  for (int batch : model->config.warmup_batch_sizes) {
    std::vector<Tensor> inputs;
    for (const TensorSpec& spec : model->config.inputs) {
      Shape shape{batch};
      for (int64_t d : spec.shape) shape.push_back(d < 0 ? 1 : d);
      inputs.push_back(Tensor::Zeros(spec.datatype, std::move(shape)));
    }
    for (int i = 0; i < model->config.warmup_iterations; ++i) {
      Result<std::vector<Tensor>> out = instance.Run(inputs);
      if (!out.ok()) {
        return Status::Internal(
            fmt::format("warm-up at batch {} failed: {}", batch, out.status().message()));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

std::string TorchRuntimeVersion() { return fmt::format("libtorch {}", TORCH_VERSION); }

namespace {

// Each instance's intra-op parallelism is libtorch's (OpenMP) thread budget, set per worker
// thread. OpenBLAS, which libtorch calls for some matrix products, keeps its own thread pool
// whose idle threads spin in sched_yield() between calls: on a loaded server they took a quarter
// of the CPU. BLAS calls therefore run on the calling thread. Looked up at run time, so any
// system BLAS works (OpenBLAS is the one Debian's libtorch gets with libopenblas0).
void MakeBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] {
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
    }
  });
}

}  // namespace

Result<std::unique_ptr<Backend>> LoadTorchScriptBackend(const ModelConfig& config) {
  MakeBlasSingleThreaded();
  if (config.instances.device != "cpu") {
    return Status::InvalidArgument(fmt::format(
        "model '{}': device '{}' is not available: this build of Sluice runs on CPU only",
        config.name, config.instances.device));
  }
  auto model = std::make_shared<LoadedModel>();
  model->config = config;
  model->report.runtime = TorchRuntimeVersion();
  std::string path = config.model_path().string();
  try {
    auto start = std::chrono::steady_clock::now();
    model->module = torch::jit::load(path, torch::kCPU);
    model->module.eval();
    model->report.load_seconds = SecondsSince(start);

    start = std::chrono::steady_clock::now();
    if (config.precision == Precision::kBf16) model->module.to(at::kBFloat16);
    if (config.optimize.channels_last) ToChannelsLast(model->module);
    if (config.optimize.freeze) {
      model->module = torch::jit::freeze(model->module);
      model->module = torch::jit::optimize_for_inference(model->module);
    }
    model->report.optimize_seconds = SecondsSince(start);
  } catch (const c10::Error& e) {
    return Status::InvalidArgument(fmt::format("model '{}': loading {} failed: {}", config.name,
                                               path, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(
        fmt::format("model '{}': loading {} failed: {}", config.name, path, e.what()));
  }
  auto start = std::chrono::steady_clock::now();
  Status warm = WarmUp(model);
  if (!warm.ok()) {
    return Status::Internal(fmt::format("model '{}': {}", config.name, warm.message()));
  }
  model->report.warmup_seconds = SecondsSince(start);
  return std::unique_ptr<Backend>(std::make_unique<TorchScriptBackend>(std::move(model)));
}

}  // namespace sluice
