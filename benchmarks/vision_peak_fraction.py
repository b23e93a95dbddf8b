#!/usr/bin/env python3
"""How close a vision model's convolutions run to the machine's peak, batch by batch and
precision by precision.

The peaks come from build/machine_peak (fp32 FMA, bf16 VDPBF16PS, int8 VPDPBUSD or, on AVX2
without VNNI, VPMADDUBSW; one core and all cores). The model's work per sample is counted by
PyTorch's FlopCounterMode on its TorchScript file (a multiply-add counts 2, as the peaks count
it). Its speed is Sluice's own: `sluice sweep` over the AOTInductor packages (the batched
pipeline, in process), samples/s per cell. Each cell's achieved GOP/s = work per sample x
samples/s, shown as a fraction of its precision's all-cores peak (fp32's for a precision this CPU
has no dot products for).

Usage: .venv/bin/python benchmarks/vision_peak_fraction.py [--model resnet18] [--models models]
           [--batch-sizes 1,8,32,64] [--precisions fp32,bf16,int8] [--iters 10]
"""
import argparse
import csv
import glob
import json
import os
import subprocess
import tempfile

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flops_per_sample(model_dir):
    import yaml
    with open(os.path.join(model_dir, "config.yaml")) as f:
        shape = yaml.safe_load(f)["inputs"][0]["shape"]
    model = torch.jit.load(os.path.join(model_dir, "model.pt")).eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.zeros(1, *shape))
    return counter.get_total_flops()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    p.add_argument("--peak", default=os.path.join(ROOT, "build", "machine_peak"))
    p.add_argument("--models", default=os.path.join(ROOT, "models"))
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--precisions", default="fp32,bf16,int8")
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()

    peaks = json.loads(subprocess.run([args.peak], check=True, capture_output=True,
                                      text=True).stdout)
    by_precision = {row["precision"]: row for row in peaks["peaks"]}
    print(f"machine peaks ({peaks['cores']} cores):")
    for row in peaks["peaks"]:
        print(f"  {row['precision']:5s} {row['isa']:18s} {row['gops_one_core']:8.1f} GOP/s one "
              f"core, {row['gops_all_cores']:8.1f} all cores")
    work = flops_per_sample(os.path.join(args.models, args.model))
    print(f"{args.model}: {work / 1e9:.3f} GFLOP a sample (a multiply-add counts 2)")

    out = tempfile.mkdtemp(prefix="sluice-peak-")
    subprocess.run([args.sluice, "sweep", "--model-repository", args.models, "--model",
                    args.model, "--backends", "aotinductor", "--precisions", args.precisions,
                    "--batch-sizes", args.batch_sizes, "--iters", str(args.iters),
                    "--results-dir", out], check=True, stdout=subprocess.DEVNULL)
    summary = glob.glob(os.path.join(out, "*", "summary.csv"))[0]
    print("\n| precision | batch | samples/s | achieved GOP/s | peak GOP/s (all cores) | "
          "fraction of peak |")
    print("|---|---:|---:|---:|---:|---:|")
    with open(summary) as f:
        for row in csv.DictReader(f):
            precision = row["precision"]
            peak = by_precision.get(precision, by_precision["fp32"])
            achieved = work * float(row["samples_per_s"]) / 1e9
            print(f"| {precision} | {row['batch_size']} | {float(row['samples_per_s']):.1f} | "
                  f"{achieved:.1f} | {peak['gops_all_cores']:.1f} ({peak['isa']}) | "
                  f"{achieved / peak['gops_all_cores']:.1%} |")


if __name__ == "__main__":
    main()
