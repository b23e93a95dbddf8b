#!/usr/bin/env python3
"""ResNet-18's 3x3 stride-1 convolutions, one layer at a time: Sluice's Winograd operator
(sluice::conv3x3, libsluice_torch_ops.so) against oneDNN's direct convolution as a frozen
Inductor package runs it (mkldnn._convolution_pointwise: the weights reordered once, the residual
addition and ReLU fused) and as eager conv2d runs it (the weights reordered on every call), each
with its bias, the residual addition and the ReLU of a basic block's second convolution, on
channels-last fp32 tensors, in this process with libtorch's threads (all cores unless
OMP_NUM_THREADS says).

Per layer and batch size: milliseconds per call (median of --iters calls), the three interleaved
A B C C B A over --rounds, the operator's speed-up over the prepacked convolution (the one that
counts: it is what the package would run otherwise), the prepacked convolution's GFLOP/s (a
multiply-add counts 2), the tile size the operator chose and its error against the direct
convolution as a fraction of the output's scale.

Usage: .venv/bin/python benchmarks/winograd_layers.py [--batch-sizes 1,8] [--iters 10] [--rounds 2]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
import winograd_rewrite  # noqa: E402

# (channels, side) of ResNet-18's four stages at 224 x 224.
LAYERS = [(64, 56), (128, 28), (256, 14), (512, 7)]


def median_ms(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not winograd_rewrite.load_ops():
        sys.exit(f"no {winograd_rewrite.ops_library_path()}: build Sluice first (make build)")
    print(f"{torch.get_num_threads()} threads, libtorch {torch.__version__}")
    print("| batch | channels | side | eager conv2d ms | oneDNN prepacked ms | sluice::conv3x3 ms "
          "| speed-up over prepacked | prepacked GFLOP/s | tile | error / scale |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    torch.manual_seed(0)
    with torch.no_grad():
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for channels, side in LAYERS:
                shape = (batch, channels, side, side)
                x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
                residual = torch.randn(shape).contiguous(memory_format=torch.channels_last)
                weight = torch.randn(channels, channels, 3, 3) * (2.0 / (9 * channels)) ** 0.5
                bias = torch.randn(channels)
                weight_cl = weight.contiguous(memory_format=torch.channels_last)
                conv = ([1, 1], [1, 1], [1, 1], 1)  # padding, stride, dilation, groups
                packed = torch.ops.mkldnn._reorder_convolution_weight(weight, *conv[:3], 1,
                                                                      list(shape))

                def eager():
                    return torch.relu_(F.conv2d(x, weight_cl, bias, padding=1).add_(residual))

                def prepacked():
                    return torch.ops.mkldnn._convolution_pointwise.binary(
                        x, residual, packed, bias, *conv, "add", None, "relu", [], "")

                def winograd():
                    return torch.ops.sluice.conv3x3(x, weight, bias, residual, True)

                want = eager()  # The first call of each also packs the operator's weights.
                assert (prepacked() - want).abs().max().item() <= 1e-4 * want.abs().max().item()
                error = (winograd() - want).abs().max().item() / want.abs().max().item()
                runs = {"eager": eager, "prepacked": prepacked, "winograd": winograd}
                times = {name: [] for name in runs}
                for r in range(args.rounds):
                    order = ("eager", "prepacked", "winograd")
                    order = order + order[::-1]
                    for name in order if r % 2 == 0 else reversed(order):
                        times[name].append(median_ms(runs[name], args.iters))
                e, d, w = (statistics.median(times[n]) for n in ("eager", "prepacked", "winograd"))
                flops = 2 * batch * channels * channels * 9 * side * side
                tile = "2x2" if tile_is_2x2(batch, channels, side) else "4x4"
                print(f"| {batch} | {channels} | {side} | {e:.2f} | {d:.2f} | {w:.2f} "
                      f"| {d / w:.2f}x | {flops / d / 1e6:.0f} | {tile} | {error:.1e} |",
                      flush=True)


def tile_is_2x2(batch, channels, side, weight_point_cost=24):
    """winograd::ChooseTile's choice (winograd_conv.h) with its default Blocking."""
    def cost(m):
        return (batch * (-(-side // m)) ** 2 + weight_point_cost) * (m + 2) ** 2
    return cost(2) < cost(4)


if __name__ == "__main__":
    main()
