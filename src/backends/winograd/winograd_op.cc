#include "backends/winograd/winograd_op.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "backends/winograd/winograd_conv.h"
#include "common/mutex.h"

namespace sluice {
namespace {

void CheckChannels(int64_t channels, const char* what) {
  TORCH_CHECK(channels >= 8 && channels % 8 == 0, "sluice::conv3x3: ", what,
              " must be a positive multiple of 8, got ", channels);
}

void CheckWeight(const at::Tensor& weight, const char* op) {
  TORCH_CHECK(weight.dim() == 4 && weight.size(2) == 3 && weight.size(3) == 3, op,
              ": weight must be out x in x 3 x 3, got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat, op, ": weight must be float32");
  CheckChannels(weight.size(0), "output channels");
  CheckChannels(weight.size(1), "input channels");
}

at::Tensor Pack(const at::Tensor& weight, winograd::Tile tile) {
  const at::Tensor w = weight.contiguous().cpu();
  at::Tensor packed =
      at::empty({winograd::PackedWeightsSize(w.size(1), w.size(0), tile)}, w.options());
  winograd::PackWinogradWeights(w.data_ptr<float>(), w.size(0), w.size(1), tile,
                                packed.data_ptr<float>());
  return packed;
}

at::Tensor WinogradPack(const at::Tensor& weight) {
  CheckWeight(weight, "sluice::winograd_pack");
  return Pack(weight, winograd::Tile::k4x4);
}

at::Tensor WinogradPackMeta(const at::Tensor& weight) {
  return at::empty(
      {winograd::PackedWeightsSize(weight.size(1), weight.size(0), winograd::Tile::k4x4)},
      weight.options());
}

// FNV-1a over the weight's bytes: identifies equal weights held in different tensors (each batch
// bucket of a package holds its own copy of the constants).
uint64_t ContentHash(const at::Tensor& w) {
  const at::Tensor c = w.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = c.numel() * sizeof(float);
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// The packed form of each weight tensor conv3x3 has seen, per tile size, made on its first call
// with that size and kept while the weight's storage lives; equal weights in different storages
// share one packed copy.
// Thread-safe: instances of a model call conv3x3 at once.
class PackedWeightCache {
 public:
  static PackedWeightCache& Get() {
    static PackedWeightCache* cache = new PackedWeightCache();  // Never destroyed: used at exit.
    return *cache;
  }

  std::shared_ptr<const at::Tensor> Find(const at::Tensor& weight, winograd::Tile tile) {
    // Inference tensors (a package's constants, under InferenceMode) have no version counter;
    // they cannot change in place either.
    const StorageKey key{weight.storage().unsafeGetStorageImpl(),
                         weight.storage_offset(),
                         weight.is_inference() ? 0 : weight._version(),
                         weight.size(0),
                         weight.size(1),
                         tile};
    {
      MutexLock lock(mu_);
      auto it = by_storage_.find(key);
      if (it != by_storage_.end() && !it->second.storage.expired()) return it->second.packed;
    }
    // Hashing and packing happen outside the lock (once per weight and storage).
    const ContentKey content{ContentHash(weight), weight.size(0), weight.size(1), tile};
    std::shared_ptr<const at::Tensor> packed;
    {
      MutexLock lock(mu_);
      auto it = by_content_.find(content);
      if (it != by_content_.end()) packed = it->second.lock();
    }
    if (packed == nullptr) packed = std::make_shared<const at::Tensor>(Pack(weight, tile));
    MutexLock lock(mu_);
    Prune();
    by_content_[content] = packed;
    by_storage_.insert_or_assign(key, Entry{weight.storage().getWeakStorageImpl(), packed});
    return packed;
  }

 private:
  // The storage's address cannot be reused while its weak reference is held (the entry's).
  // (storage, offset, version, out channels, in channels, tile)
  using StorageKey =
      std::tuple<const c10::StorageImpl*, int64_t, int64_t, int64_t, int64_t, winograd::Tile>;
  using ContentKey = std::tuple<uint64_t, int64_t, int64_t, winograd::Tile>;
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    std::shared_ptr<const at::Tensor> packed;
  };

  // Drops the entries of freed weights, and packed copies no entry holds.
  void Prune() REQUIRES(mu_) {
    for (auto it = by_storage_.begin(); it != by_storage_.end();) {
      it = it->second.storage.expired() ? by_storage_.erase(it) : std::next(it);
    }
    for (auto it = by_content_.begin(); it != by_content_.end();) {
      it = it->second.expired() ? by_content_.erase(it) : std::next(it);
    }
  }

  Mutex mu_;
  std::map<StorageKey, Entry> by_storage_ GUARDED_BY(mu_);
  std::map<ContentKey, std::weak_ptr<const at::Tensor>> by_content_ GUARDED_BY(mu_);
};

at::Tensor EmptyOutput(const at::Tensor& input, const at::Tensor& bias) {
  return at::empty({input.size(0), bias.size(0), input.size(2), input.size(3)},
                   input.options().memory_format(at::MemoryFormat::ChannelsLast));
}

void CheckArgs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
               const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(input.dim() == 4 && input.scalar_type() == at::kFloat,
              "sluice::conv3x3: input must be a float32 N x C x H x W tensor, got ", input.sizes(),
              " ", input.scalar_type());
  TORCH_CHECK(bias.dim() == 1 && bias.scalar_type() == at::kFloat,
              "sluice::conv3x3: bias must be a float32 vector");
  CheckWeight(weight, "sluice::conv3x3");
  TORCH_CHECK(weight.size(1) == input.size(1) && weight.size(0) == bias.size(0),
              "sluice::conv3x3: weight ", weight.sizes(), " does not fit an input of ",
              input.size(1), " channels and a bias of ", bias.size(0));
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == at::IntArrayRef({input.size(0), bias.size(0), input.size(2),
                                                      input.size(3)}) &&
                    residual->scalar_type() == at::kFloat,
                "sluice::conv3x3: residual must be float32 shaped like the output, got ",
                residual->sizes());
  }
}

at::Tensor Conv3x3(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const std::optional<at::Tensor>& residual, bool relu) {
  CheckArgs(input, weight, bias, residual);
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor b = bias.contiguous();
  at::Tensor r;
  at::Tensor out = EmptyOutput(input, bias);
  winograd::ConvShape shape{x.size(0), x.size(2), x.size(3), x.size(1), b.size(0)};
  winograd::ConvArgs args;
  args.tile = winograd::ChooseTile(shape, args.blocking);
  const std::shared_ptr<const at::Tensor> packed = PackedWeightCache::Get().Find(weight, args.tile);
  const at::Tensor& p = *packed;
  args.input = x.data_ptr<float>();
  args.packed = p.data_ptr<float>();
  args.bias = b.data_ptr<float>();
  if (residual.has_value()) {
    r = residual->contiguous(at::MemoryFormat::ChannelsLast);
    args.residual = r.data_ptr<float>();
  }
  args.relu = relu;
  args.output = out.data_ptr<float>();
  args.threads = at::get_num_threads();
  winograd::Conv3x3(shape, args,
                    [](int64_t count, const std::function<void(int64_t, int64_t)>& body) {
                      at::parallel_for(0, count, 1, body);
                    });
  return out;
}

at::Tensor Conv3x3Meta(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                       const std::optional<at::Tensor>& residual, bool relu) {
  return EmptyOutput(input, bias);
}

}  // namespace

bool TorchOpsRegistered() { return true; }

}  // namespace sluice

TORCH_LIBRARY(sluice, m) {
  m.def("winograd_pack(Tensor weight) -> Tensor");
  m.def("conv3x3(Tensor input, Tensor weight, Tensor bias, Tensor? residual, bool relu) -> Tensor");
}

TORCH_LIBRARY_IMPL(sluice, CPU, m) {
  m.impl("winograd_pack", &sluice::WinogradPack);
  m.impl("conv3x3", &sluice::Conv3x3);
}

TORCH_LIBRARY_IMPL(sluice, Meta, m) {
  m.impl("winograd_pack", &sluice::WinogradPackMeta);
  m.impl("conv3x3", &sluice::Conv3x3Meta);
}
