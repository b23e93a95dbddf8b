#!/usr/bin/env python3
"""ResNet-18's convolutions, one layer at a time: Sluice's operators (libsluice_torch_ops.so) against
libtorch's conv2d (oneDNN), on channels-last fp32 tensors, in this process with libtorch's threads
(all cores unless OMP_NUM_THREADS says). The 3x3 stride-1 layers by sluice::conv3x3 (Winograd),
each with its bias, the residual addition and the ReLU of a basic block's second convolution; the
others (the 7x7 stem, the strided 3x3 and 1x1 convolutions) by sluice::conv_gemm, with the bias
and the ReLU where the model has one.

Per layer and batch size: milliseconds per call (median of --iters calls), both ways interleaved
A B B A over --rounds, the ratio of the medians, the direct convolution's GFLOP/s (a multiply-add
counts 2) and the operator's error against conv2d as a fraction of the output's scale.

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

# ResNet-18's convolutions at 224 x 224: (operator, in channels, out channels, input side, kernel,
# stride, padding). conv3x3 layers take a residual and a ReLU; conv_gemm layers with a 3x3 or 7x7
# kernel a ReLU, the 1x1 ones (a downsampling shortcut) neither.
LAYERS = [
    ("conv3x3", 64, 64, 56, 3, 1, 1), ("conv3x3", 128, 128, 28, 3, 1, 1),
    ("conv3x3", 256, 256, 14, 3, 1, 1), ("conv3x3", 512, 512, 7, 3, 1, 1),
    ("conv_gemm", 3, 64, 224, 7, 2, 3), ("conv_gemm", 64, 128, 56, 3, 2, 1),
    ("conv_gemm", 128, 256, 28, 3, 2, 1), ("conv_gemm", 256, 512, 14, 3, 2, 1),
    ("conv_gemm", 64, 128, 56, 1, 2, 0), ("conv_gemm", 128, 256, 28, 1, 2, 0),
    ("conv_gemm", 256, 512, 14, 1, 2, 0),
]


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
    parser.add_argument("--operators", default="conv3x3,conv_gemm",
                        help="which layers: conv3x3, conv_gemm or both")
    args = parser.parse_args()
    if not winograd_rewrite.load_ops():
        sys.exit(f"no {winograd_rewrite.ops_library_path()}: build Sluice first (make build)")
    print(f"{torch.get_num_threads()} threads, libtorch {torch.__version__}")
    print("| batch | operator | in -> out | side | kernel / stride | conv2d ms | Sluice ms "
          "| speed-up | conv2d GFLOP/s | error / scale |")
    print("|---:|---|---|---:|---|---:|---:|---:|---:|---:|")
    operators = args.operators.split(",")
    torch.manual_seed(0)
    with torch.no_grad():
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for op, cin, cout, side, k, stride, pad in LAYERS:
                if op not in operators:
                    continue
                out_side = (side + 2 * pad - k) // stride + 1
                x = torch.randn(batch, cin, side, side).contiguous(
                    memory_format=torch.channels_last)
                residual = torch.randn(batch, cout, out_side, out_side).contiguous(
                    memory_format=torch.channels_last)
                weight = torch.randn(cout, cin, k, k) * (2.0 / (k * k * cin)) ** 0.5
                bias = torch.randn(cout)
                weight_cl = weight.contiguous(memory_format=torch.channels_last)
                with_residual, relu = op == "conv3x3", op == "conv3x3" or k > 1

                def direct():
                    y = F.conv2d(x, weight_cl, bias, stride=stride, padding=pad)
                    if with_residual:
                        y = y.add_(residual)
                    return torch.relu_(y) if relu else y

                def sluice():
                    r = residual if with_residual else None
                    if op == "conv3x3":
                        return torch.ops.sluice.conv3x3(x, weight, bias, r, relu)
                    return torch.ops.sluice.conv_gemm(x, weight, bias, r, relu, stride, pad)

                want = direct()  # The first call of each also packs the operator's weights.
                error = (sluice() - want).abs().max().item() / want.abs().max().item()
                times = {"direct": [], "sluice": []}
                for r in range(args.rounds):
                    order = ("direct", "sluice", "sluice", "direct")
                    for name in order if r % 2 == 0 else reversed(order):
                        times[name].append(median_ms(direct if name == "direct" else sluice,
                                                     args.iters))
                d, w = statistics.median(times["direct"]), statistics.median(times["sluice"])
                flops = 2 * batch * cout * cin * k * k * out_side * out_side
                print(f"| {batch} | {op} | {cin} -> {cout} | {side} | {k}x{k} / {stride} "
                      f"| {d:.2f} | {w:.2f} | {d / w:.2f}x | {flops / d / 1e6:.0f} "
                      f"| {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
