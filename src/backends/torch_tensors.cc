#include "backends/torch_tensors.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

namespace sluice::torch_backend {

at::ScalarType ToScalarType(DataType dtype) {
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
  return at::kFloat;
}

Result<at::Tensor> WrapInput(const Tensor& in, const TensorSpec& spec) {
  if (in.dtype() != spec.datatype) {
    return Status::InvalidArgument(fmt::format("input '{}' must be {}, got {}", spec.name,
                                               DataTypeName(spec.datatype),
                                               DataTypeName(in.dtype())));
  }
  if (in.shape().size() != spec.shape.size() + 1) {
    return Status::InvalidArgument(fmt::format("input '{}' must have {} dims (batch first), got {}",
                                               spec.name, spec.shape.size() + 1,
                                               ShapeToString(in.shape())));
  }
  return at::from_blob(const_cast<void*>(in.data()), in.shape(),
                       at::TensorOptions().dtype(ToScalarType(in.dtype())));
}

Result<std::vector<Tensor>> WrapOutputs(const std::vector<at::Tensor>& tensors,
                                        const ModelConfig& config) {
  if (tensors.size() != config.outputs.size()) {
    return Status::Internal(fmt::format("model returned {} outputs, config declares {}",
                                        tensors.size(), config.outputs.size()));
  }
  std::vector<Tensor> outputs;
  outputs.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    DataType dtype = config.outputs[i].datatype;
    at::Tensor out = tensors[i].to(ToScalarType(dtype)).contiguous();
    // An output that is its input, or a view of it (a model returning x, x.flatten(1), x[:, 0]),
    // shares the request's buffer, which WrapInput lent without ownership and which is gone
    // once the batch is answered: such storage (no owner context) is copied out.
    if (out.storage().data_ptr().get_context() == nullptr) out = out.clone();
    auto holder = std::make_shared<at::Tensor>(std::move(out));
    void* data = holder->data_ptr();
    Shape shape(holder->sizes().begin(), holder->sizes().end());
    // The aliasing shared_ptr keeps the torch tensor (and so its storage) alive.
    outputs.push_back(
        Tensor::Wrap(dtype, std::move(shape), std::shared_ptr<const void>(holder, data), data));
  }
  return outputs;
}

Status SetIntraOpThreads(int threads) {
  try {
    // The first query initialises this thread's OpenMP state; the set then makes the budget this
    // thread's own.
    (void)at::get_num_threads();
    at::set_num_threads(threads);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("setting {} threads failed: {}", threads, e.what()));
  }
}

Status RunThreads::Attach() {
  SLUICE_RETURN_IF_ERROR(SetIntraOpThreads(fixed_));
  current_ = fixed_;
  return Status::Ok();
}

Status RunThreads::Use(const CoreLease& lease) {
  if (lease.cores() < 1 || lease.cores() == current_) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(SetIntraOpThreads(lease.cores()));
  current_ = lease.cores();
  return Status::Ok();
}

std::shared_ptr<CorePool> MakeCorePool(const ModelConfig& config) {
  if (!config.instances.share_cores || config.instances.on_gpu()) return nullptr;
  return std::make_shared<CorePool>(config.instances.pool_cores);
}

Status CheckCpuDevice(const ModelConfig& config) {
  if (config.instances.device == "cpu") return Status::Ok();
  return Status::InvalidArgument(
      fmt::format("model '{}': device '{}' is not available: this build of Sluice runs on CPU only",
                  config.name, config.instances.device));
}

Status CheckInstanceIndex(int index, const ModelConfig& config) {
  if (index >= 0 && index < config.instances.count) return Status::Ok();
  return Status::InvalidArgument(
      fmt::format("instance {} out of range [0, {})", index, config.instances.count));
}

Status CheckInputCount(const std::vector<Tensor>& inputs, const ModelConfig& config) {
  if (inputs.size() == config.inputs.size()) return Status::Ok();
  return Status::InvalidArgument(fmt::format("model '{}' takes {} inputs, got {}", config.name,
                                             config.inputs.size(), inputs.size()));
}

Status WarmUp(BackendInstance& instance, const ModelConfig& config, LoadReport& report) {
  auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_ERROR(instance.AttachToCurrentThread());
  // The configured sizes only: the adaptive batcher learns the other sizes' costs from the
  // batches it runs (a size's first, cold run does not decide). Measuring every size it might
  // choose here cost resnet18 1.4 s of compute before readiness, and 3-5x that on a CPU shared
  // with loaded replicas.
  const std::vector<int>& sizes = config.warmup_batch_sizes;
  for (int batch : sizes) {
    std::vector<Tensor> inputs;
    for (const TensorSpec& spec : config.inputs) {
      Shape shape{batch};
      for (int64_t d : spec.shape) shape.push_back(d < 0 ? 1 : d);
      inputs.push_back(Tensor::Zeros(spec.datatype, std::move(shape)));
    }
    double last = 0;
    for (int i = 0; i < config.warmup_iterations; ++i) {
      const auto run_start = std::chrono::steady_clock::now();
      Result<std::vector<Tensor>> out = instance.Run(inputs);
      if (!out.ok()) {
        return Status::Internal(fmt::format("model '{}': warm-up at batch {} failed: {}",
                                            config.name, batch, out.status().message()));
      }
      last = SecondsSince(run_start);
    }
    if (config.warmup_iterations > 0) {
      auto& seconds = report.warmup_batch_seconds;
      auto same = std::find_if(seconds.begin(), seconds.end(),
                               [&](const auto& entry) { return entry.first == batch; });
      if (same != seconds.end()) {
        same->second = last;
      } else {
        seconds.emplace_back(batch, last);
      }
    }
  }
  report.warmup_seconds = SecondsSince(start);
  return Status::Ok();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace sluice::torch_backend
