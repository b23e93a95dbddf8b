// TorchScript backend. With backends/ and llm/, the only code that includes torch headers.
#include "backends/torchscript/torchscript_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/version.h>

#include <chrono>

#include "backends/torch_tensors.h"

namespace sluice {
namespace {

using torch_backend::SecondsSince;

// What all instances of one model share. Module::forward may be called from several threads at
// once; the graph executor locks only while it compiles a plan.
struct LoadedModel {
  ModelConfig config;
  torch::jit::Module module;
  LoadReport report;
};

class TorchScriptInstance final : public BackendInstance {
 public:
  TorchScriptInstance(std::shared_ptr<LoadedModel> model, std::shared_ptr<CorePool> cores)
      : model_(std::move(model)), threads_(model_->config, std::move(cores)) {}

  Status AttachToCurrentThread() override { return threads_.Attach(); }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    const ModelConfig& config = model_->config;
    SLUICE_RETURN_IF_ERROR(torch_backend::CheckInputCount(inputs, config));
    const CoreLease cores = threads_.Lease();
    SLUICE_RETURN_IF_ERROR(threads_.Use(cores));
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
    Result<at::Tensor> wrapped = torch_backend::WrapInput(in, spec);
    if (!wrapped.ok()) return wrapped;
    at::Tensor t = std::move(*wrapped);
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
    return torch_backend::WrapOutputs(tensors, model_->config);
  }

  std::shared_ptr<LoadedModel> model_;
  torch_backend::RunThreads threads_;
};

class TorchScriptBackend final : public Backend {
 public:
  TorchScriptBackend(std::shared_ptr<LoadedModel> model, std::shared_ptr<CorePool> cores)
      : model_(std::move(model)), cores_(std::move(cores)) {}

  Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) override {
    SLUICE_RETURN_IF_ERROR(torch_backend::CheckInstanceIndex(index, model_->config));
    return std::unique_ptr<BackendInstance>(std::make_unique<TorchScriptInstance>(model_, cores_));
  }

  const LoadReport& load_report() const override { return model_->report; }

 private:
  std::shared_ptr<LoadedModel> model_;
  std::shared_ptr<CorePool> cores_;  // Null unless instances.share_cores.
};

// Converts 4-D parameters to NHWC so convolutions need no layout change per call.
void ToChannelsLast(torch::jit::Module& module) {
  torch::NoGradGuard no_grad;
  for (at::Tensor p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
}

}  // namespace

Result<std::unique_ptr<Backend>> LoadTorchScriptBackend(const ModelConfig& config) {
  SLUICE_RETURN_IF_ERROR(torch_backend::CheckCpuDevice(config));
  auto model = std::make_shared<LoadedModel>();
  model->config = config;
  model->report.runtime = fmt::format("libtorch {} (TorchScript)", TORCH_VERSION);
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
  // With shared cores the warm-up holds the whole pool, as a run alone does when serving.
  std::shared_ptr<CorePool> cores = torch_backend::MakeCorePool(config);
  TorchScriptInstance warm_instance(model, cores);
  SLUICE_RETURN_IF_ERROR(torch_backend::WarmUp(warm_instance, config, model->report));
  return std::unique_ptr<Backend>(
      std::make_unique<TorchScriptBackend>(std::move(model), std::move(cores)));
}

}  // namespace sluice
