// AOTInductor backend. With the TorchScript backend, the only code of the CPU path that includes
// torch headers.
//
// Concurrency. torch::inductor::AOTIModelPackageLoader wraps an AOTIModelContainer that holds
// `num_runners` compiled-model objects sharing one set of constants (weights). Its run() is
// thread-safe: each call takes a free model object (waiting on a condition variable when all are
// busy), runs it with that object's own intermediate buffers, and hands it back. So one loaded
// package serves every instance: it is loaded once with one runner per instance, and each instance
// thread calls run() on it at once with no lock of Sluice's; with fewer runners than instances,
// instances would queue inside run() instead of computing side by side. A bucketed package has
// one such loader per bucket, each with one runner per instance.
#include "backends/aotinductor/aotinductor_backend.h"

#include <fmt/format.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/version.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>

#include "backends/torch_tensors.h"
#include "backends/winograd/winograd_op.h"
#include "common/system_info.h"

namespace sluice {
namespace {

using torch_backend::SecondsSince;

// A package holds one model with a dynamic batch dimension (what torch.export with a dynamic
// batch makes), or one static model per batch bucket (what tools/sluice_export.py makes: faster,
// and correct in int8, where Inductor 2.11 miscompiles a dynamic batch; that file says more),
// named "model" (the largest) and "bucket_<NNNN>" (fixed width: the loader finds a model by name
// prefix).
struct LoadedPackage {
  ModelConfig config;
  // Batch bucket -> its model; one entry keyed 0 for a dynamic-batch package.
  std::map<int64_t, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> loaders;
  LoadReport report;
};

// Runs `inputs` (batch n) on the package: a dynamic-batch model directly; otherwise the smallest
// bucket >= n, the inputs padded with zero rows up to it and the outputs cut back to n rows (the
// engine's batches come padded already: see BatchRows).
std::vector<at::Tensor> RunPackage(const LoadedPackage& package, std::vector<at::Tensor> inputs) {
  auto dynamic = package.loaders.find(0);
  if (dynamic != package.loaders.end()) return dynamic->second->run(inputs);
  const int64_t n = inputs.empty() ? 1 : inputs[0].size(0);
  auto bucket = package.loaders.lower_bound(n);  // CheckShape keeps n <= the largest bucket.
  if (bucket->first > n) {
    for (at::Tensor& t : inputs) {
      std::vector<int64_t> sizes = t.sizes().vec();
      sizes[0] = bucket->first;
      at::Tensor padded = at::zeros(sizes, t.options());
      padded.narrow(0, 0, n).copy_(t);
      t = std::move(padded);
    }
  }
  std::vector<at::Tensor> outputs = bucket->second->run(inputs);
  if (bucket->first > n) {
    for (at::Tensor& t : outputs) t = t.narrow(0, 0, n);
  }
  return outputs;
}

// "1,2,4" -> {1, 2, 4}; empty on a malformed list.
std::vector<int64_t> ParseBuckets(const std::string& text) {
  std::vector<int64_t> buckets;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    try {
      size_t used = 0;
      int64_t b = std::stoll(item, &used);
      if (used != item.size() || b < 1) return {};
      buckets.push_back(b);
    } catch (const std::exception&) {
      return {};
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return buckets;
}

// The compiled code trusts its inputs' shapes (see CheckPackage), so they are checked here: the
// batch within 1..max_batch_size, every fixed dimension as declared.
Status CheckShape(const Tensor& in, const TensorSpec& spec, int max_batch_size) {
  const Shape& shape = in.shape();
  if (shape.size() != spec.shape.size() + 1) return Status::Ok();  // WrapInput names it.
  bool fits = shape[0] >= 1 && shape[0] <= max_batch_size;
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    if (spec.shape[d] >= 0 && shape[d + 1] != spec.shape[d]) fits = false;
  }
  if (fits) return Status::Ok();
  Shape declared{max_batch_size};
  declared.insert(declared.end(), spec.shape.begin(), spec.shape.end());
  return Status::InvalidArgument(
      fmt::format("input '{}' has shape {}; the model takes {} (batch "
                  "up to {}, -1 any size)",
                  spec.name, ShapeToString(shape), ShapeToString(declared), max_batch_size));
}

class AotInductorInstance final : public BackendInstance {
 public:
  AotInductorInstance(std::shared_ptr<LoadedPackage> package, std::shared_ptr<CorePool> cores)
      : package_(std::move(package)), threads_(package_->config, std::move(cores)) {}

  Status AttachToCurrentThread() override {
    // The package's kernels open OpenMP regions without a fixed thread count (exported with
    // cpp.dynamic_threads) and its oneDNN calls use ATen's budget: both follow this thread's.
    return threads_.Attach();
  }

  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    const ModelConfig& config = package_->config;
    SLUICE_RETURN_IF_ERROR(torch_backend::CheckInputCount(inputs, config));
    const CoreLease cores = threads_.Lease();
    SLUICE_RETURN_IF_ERROR(threads_.Use(cores));
    try {
      c10::InferenceMode inference_mode;
      std::vector<at::Tensor> args;
      args.reserve(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        SLUICE_RETURN_IF_ERROR(CheckShape(inputs[i], config.inputs[i], config.max_batch_size));
        Result<at::Tensor> t = torch_backend::WrapInput(inputs[i], config.inputs[i]);
        if (!t.ok()) return t.status();
        args.push_back(std::move(*t));
      }
      std::vector<at::Tensor> outputs = RunPackage(*package_, std::move(args));
      return torch_backend::WrapOutputs(outputs, config);
    } catch (const c10::Error& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return Status::Internal(fmt::format("forward failed: {}", e.what()));
    }
  }

  // A bucketed package's smallest bucket that holds the batch (what RunPackage would pad to).
  int64_t BatchRows(int64_t samples) const override {
    if (package_->loaders.contains(0)) return samples;
    auto bucket = package_->loaders.lower_bound(samples);
    return bucket == package_->loaders.end() ? samples : bucket->first;
  }

 private:
  std::shared_ptr<LoadedPackage> package_;
  torch_backend::RunThreads threads_;
};

class AotInductorBackend final : public Backend {
 public:
  AotInductorBackend(std::shared_ptr<LoadedPackage> package, std::shared_ptr<CorePool> cores)
      : package_(std::move(package)), cores_(std::move(cores)) {}

  Result<std::unique_ptr<BackendInstance>> CreateInstance(int index) override {
    SLUICE_RETURN_IF_ERROR(torch_backend::CheckInstanceIndex(index, package_->config));
    return std::unique_ptr<BackendInstance>(
        std::make_unique<AotInductorInstance>(package_, cores_));
  }

  const LoadReport& load_report() const override { return package_->report; }

 private:
  std::shared_ptr<LoadedPackage> package_;
  std::shared_ptr<CorePool> cores_;  // Null unless instances.share_cores.
};

// Checked from the package's metadata before its library is loaded. The compiled code runs only
// where its device and instruction set exist: a CUDA package needs a CUDA build, and kernels
// compiled for AVX-512 would die of SIGILL on a CPU without it. And it checks no input shapes of
// its own (only with AOTI_RUNTIME_CHECK_INPUTS set): a batch beyond the exported range would run
// off its buffers, so a config whose max_batch_size exceeds the range that
// tools/export_models.py records (sluice.max_batch_size) is refused.
Status CheckPackage(const std::unordered_map<std::string, std::string>& metadata,
                    const ModelConfig& config) {
  auto get = [&](const char* key) {
    auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : it->second;
  };
  std::string device = get("AOTI_DEVICE_KEY");
  if (!device.empty() && device != "cpu") {
    return Status::InvalidArgument(fmt::format(
        "the package was compiled for device '{}'; this build of Sluice runs CPU packages only",
        device));
  }
  // Inductor's vector ISA, or the target tools/sluice_export.py --isa compiled the whole package
  // for (-march=x86-64-v3 / v4: Inductor records INVALID_VEC_ISA when its own vector check fails,
  // while -march still decides which instructions the compiler emits).
  std::string isa = get("AOTI_CPU_ISA");
  const std::string target = get("sluice.cpu_isa");
  if (target == "avx2") isa = "AVX2";
  if (target == "avx512") isa = "AVX512";
  bool supported = true;
  if (isa == "AVX2") {
    // F16C from /proc/cpuinfo: clang 14's __builtin_cpu_supports does not know its name.
    supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("bmi2") && CpuHasFlag("f16c");
  } else if (isa.rfind("AVX512", 0) == 0) {
    supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (!supported) {
    return Status::InvalidArgument(fmt::format(
        "the package was compiled for {} instructions, which this CPU lacks; export it on the "
        "machine that serves it",
        isa));
  }
  std::string max_batch = get("sluice.max_batch_size");
  if (max_batch.empty()) {
    return Status::InvalidArgument(
        "the package does not record its batch range (sluice.max_batch_size in its metadata, "
        "which tools/export_models.py writes)");
  }
  int exported_max = 0;
  try {
    exported_max = std::stoi(max_batch);
  } catch (const std::exception&) {
    return Status::InvalidArgument(
        fmt::format("the package's sluice.max_batch_size '{}' is not a number", max_batch));
  }
  if (config.max_batch_size > exported_max) {
    return Status::InvalidArgument(
        fmt::format("max_batch_size {} exceeds the batch range 1..{} the package was exported "
                    "with; export it again for the larger size",
                    config.max_batch_size, exported_max));
  }
  std::string precision = get("sluice.precision");
  if (!precision.empty() && precision != PrecisionName(config.precision)) {
    return Status::InvalidArgument(
        fmt::format("the package holds a {} model, the config asks for {}", precision,
                    PrecisionName(config.precision)));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> LoadAotInductorBackend(const ModelConfig& config) {
  SLUICE_RETURN_IF_ERROR(torch_backend::CheckCpuDevice(config));
  std::string path = config.model_path().string();
  std::error_code ignored;
  if (!std::filesystem::is_regular_file(config.model_path(), ignored)) {
    return Status::InvalidArgument(fmt::format(
        "model '{}': no AOTInductor package {} for precision {} (tools/export_models.py writes "
        "model.pt2, model_bf16.pt2 and model_int8.pt2)",
        config.name, path, PrecisionName(config.precision)));
  }
  // Packages may call Sluice's own operators (sluice::conv3x3) through the proxy executor.
  if (!TorchOpsRegistered()) return Status::Internal("Sluice's torch operators are not linked");
  auto package = std::make_shared<LoadedPackage>();
  package->config = config;
  package->report.runtime = fmt::format("libtorch {} (AOTInductor)", TORCH_VERSION);
  try {
    auto start = std::chrono::steady_clock::now();
    auto metadata =
        torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
    Status target = CheckPackage(metadata, config);
    if (!target.ok()) {
      return Status::InvalidArgument(
          fmt::format("model '{}': {}: {}", config.name, path, target.message()));
    }
    auto load = [&](const std::string& model_name) {
      return std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          path, model_name, /*run_single_threaded=*/false,
          /*num_runners=*/static_cast<size_t>(config.instances.count));
    };
    auto buckets_entry = metadata.find("sluice.batch_buckets");
    if (buckets_entry == metadata.end()) {
      package->loaders[0] = load("model");
    } else {
      std::vector<int64_t> buckets = ParseBuckets(buckets_entry->second);
      if (buckets.empty() || buckets.back() < config.max_batch_size) {
        return Status::InvalidArgument(
            fmt::format("model '{}': {}: batch buckets '{}' do not cover max_batch_size {}",
                        config.name, path, buckets_entry->second, config.max_batch_size));
      }
      for (int64_t b : buckets) {
        package->loaders[b] = load(b == buckets.back() ? "model" : fmt::format("bucket_{:04d}", b));
      }
    }
    package->report.load_seconds = SecondsSince(start);
  } catch (const c10::Error& e) {
    return Status::InvalidArgument(fmt::format("model '{}': loading {} failed: {}", config.name,
                                               path, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(
        fmt::format("model '{}': loading {} failed: {}", config.name, path, e.what()));
  }
  // With shared cores the warm-up holds the whole pool, as a run alone does when serving.
  std::shared_ptr<CorePool> cores = torch_backend::MakeCorePool(config);
  AotInductorInstance warm_instance(package, cores);
  SLUICE_RETURN_IF_ERROR(torch_backend::WarmUp(warm_instance, config, package->report));
  return std::unique_ptr<Backend>(
      std::make_unique<AotInductorBackend>(std::move(package), std::move(cores)));
}

}  // namespace sluice
