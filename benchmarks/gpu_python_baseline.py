#!/usr/bin/env python3
"""PyTorch in Python on a GPU, the loop a user writes: the same ResNet-18 weights and work as
Sluice's resnet18_gpu (UINT8 [N, 224, 224, 3] images from pinned host memory, copied to the GPU,
normalised there, the model in fp16 channels-last, FP32 logits copied back), compiled with
torch.compile(mode="reduce-overhead") (CUDA graphs), one batch at a time.

For each batch size: samples/s over --seconds of back-to-back batches after warm-up, and the
latency of each batch (p50, p99). Writes CSV and JSON to --out.

Usage: benchmarks/gpu_python_baseline.py --out DIR [--batch-sizes 1,32,128,256] [--seconds 3]
"""
import argparse
import json
import os
import time

import torch

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-sizes", default="1,32,128,256")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--mode", default="reduce-overhead")
    args = parser.parse_args()
    import torchvision
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=1000).eval()
    model = model.cuda().half().to(memory_format=torch.channels_last)
    scale = (1.0 / (255.0 * torch.tensor(STD))).view(1, 3, 1, 1).cuda().half()
    bias = (-torch.tensor(MEAN) / torch.tensor(STD)).view(1, 3, 1, 1).cuda().half()

    def step(x):
        x = torch.addcmul(bias, x.permute(0, 3, 1, 2).half(), scale)
        return model(x.contiguous(memory_format=torch.channels_last)).float()

    compiled = torch.compile(step, mode=args.mode)
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        host = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8).pin_memory()
        start = time.time()
        with torch.inference_mode():
            for _ in range(5):
                compiled(host.cuda(non_blocking=True)).cpu()
            torch.cuda.synchronize()
            compile_s = time.time() - start
            latencies = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                s = time.perf_counter()
                out = compiled(host.cuda(non_blocking=True)).cpu()
                latencies.append(time.perf_counter() - s)
            elapsed = time.perf_counter() - t0
        assert out.shape == (batch, 1000) and torch.isfinite(out).all()
        latencies.sort()
        row = {"batch_size": batch, "mode": args.mode, "samples_per_s": batch * len(latencies) / elapsed,
               "batches": len(latencies), "p50_ms": latencies[len(latencies) // 2] * 1e3,
               "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
               "warmup_s": compile_s}
        rows.append(row)
        print(f"python {args.mode}: batch {batch:>4}  {row['samples_per_s']:>10.1f} samples/s  "
              f"p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  (warm-up {compile_s:.1f} s)",
              flush=True)
    with open(os.path.join(args.out, "python_baseline.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "python_baseline.csv"), "w") as f:
        f.write("batch_size,mode,samples_per_s,p50_ms,p99_ms,batches,warmup_s\n")
        for r in rows:
            f.write(f"{r['batch_size']},{r['mode']},{r['samples_per_s']:.1f},{r['p50_ms']:.4f},"
                    f"{r['p99_ms']:.4f},{r['batches']},{r['warmup_s']:.1f}\n")


if __name__ == "__main__":
    main()
