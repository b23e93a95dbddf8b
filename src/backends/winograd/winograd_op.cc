#include "backends/winograd/winograd_op.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "backends/winograd/winograd_conv.h"

namespace sluice {
namespace {

void CheckChannels(int64_t channels, const char* what) {
  TORCH_CHECK(channels >= 8 && channels % 8 == 0, "sluice::conv3x3: ", what,
              " must be a positive multiple of 8, got ", channels);
}

at::Tensor WinogradPack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 4 && weight.size(2) == 3 && weight.size(3) == 3,
              "sluice::winograd_pack: weight must be out x in x 3 x 3, got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat, "sluice::winograd_pack: weight must be float32");
  CheckChannels(weight.size(0), "output channels");
  CheckChannels(weight.size(1), "input channels");
  const at::Tensor w = weight.contiguous().cpu();
  at::Tensor packed = at::empty({winograd::PackedWeightsSize(w.size(1), w.size(0))}, w.options());
  winograd::PackWinogradWeights(w.data_ptr<float>(), w.size(0), w.size(1),
                                packed.data_ptr<float>());
  return packed;
}

at::Tensor WinogradPackMeta(const at::Tensor& weight) {
  return at::empty({winograd::PackedWeightsSize(weight.size(1), weight.size(0))}, weight.options());
}

at::Tensor EmptyOutput(const at::Tensor& input, const at::Tensor& bias) {
  return at::empty({input.size(0), bias.size(0), input.size(2), input.size(3)},
                   input.options().memory_format(at::MemoryFormat::ChannelsLast));
}

void CheckArgs(const at::Tensor& input, const at::Tensor& packed, const at::Tensor& bias,
               const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(input.dim() == 4 && input.scalar_type() == at::kFloat,
              "sluice::conv3x3: input must be a float32 N x C x H x W tensor, got ", input.sizes(),
              " ", input.scalar_type());
  TORCH_CHECK(bias.dim() == 1 && bias.scalar_type() == at::kFloat,
              "sluice::conv3x3: bias must be a float32 vector");
  CheckChannels(input.size(1), "input channels");
  CheckChannels(bias.size(0), "output channels");
  TORCH_CHECK(packed.numel() == winograd::PackedWeightsSize(input.size(1), bias.size(0)),
              "sluice::conv3x3: packed weights of ", packed.numel(), " values do not fit ",
              input.size(1), " input and ", bias.size(0), " output channels");
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == at::IntArrayRef({input.size(0), bias.size(0), input.size(2),
                                                      input.size(3)}) &&
                    residual->scalar_type() == at::kFloat,
                "sluice::conv3x3: residual must be float32 shaped like the output, got ",
                residual->sizes());
  }
}

at::Tensor Conv3x3(const at::Tensor& input, const at::Tensor& packed, const at::Tensor& bias,
                   const std::optional<at::Tensor>& residual, bool relu) {
  CheckArgs(input, packed, bias, residual);
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor p = packed.contiguous();
  const at::Tensor b = bias.contiguous();
  at::Tensor r;
  at::Tensor out = EmptyOutput(input, bias);
  winograd::ConvShape shape{x.size(0), x.size(2), x.size(3), x.size(1), b.size(0)};
  winograd::ConvArgs args;
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

at::Tensor Conv3x3Meta(const at::Tensor& input, const at::Tensor& packed, const at::Tensor& bias,
                       const std::optional<at::Tensor>& residual, bool relu) {
  return EmptyOutput(input, bias);
}

}  // namespace

bool TorchOpsRegistered() { return true; }

}  // namespace sluice

TORCH_LIBRARY(sluice, m) {
  m.def("winograd_pack(Tensor weight) -> Tensor");
  m.def("conv3x3(Tensor input, Tensor packed, Tensor bias, Tensor? residual, bool relu) -> Tensor");
}

TORCH_LIBRARY_IMPL(sluice, CPU, m) {
  m.impl("winograd_pack", &sluice::WinogradPack);
  m.impl("conv3x3", &sluice::Conv3x3);
}

TORCH_LIBRARY_IMPL(sluice, Meta, m) {
  m.impl("winograd_pack", &sluice::WinogradPackMeta);
  m.impl("conv3x3", &sluice::Conv3x3Meta);
}
