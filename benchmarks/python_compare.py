#!/usr/bin/env python3
"""Sluice's in-process pipeline against PyTorch in Python on the same model, in one run.

For one model and batch size, on the same thread budget:
  Sluice   `sluice bench --in-process` with each backend: torchscript, torchscript+freeze,
           aotinductor; each precision the backend has (fp32, bf16; int8 on aotinductor); and
           the package served by two instances sharing the cores (instances.share_cores).
  Python   eager (fp32, bf16), torch.compile(mode="max-autotune") with Inductor's freezing (the
           CPU inference recipe; fp32, bf16, and int8 from the same PT2E quantised graph the
           package holds), and torch._inductor's package loader on the very .pt2 files Sluice serves,
           called in a tight loop (sluice_export.PackageRunner: each batch bucket's model loaded
           by name, as the C++ backend does).

Every variant runs once per round, rounds in alternating order (A B ... B A), and the table
reports medians. The headline pair, Sluice's pipeline vs Python's loop on the same .pt2, is also
reported per round as a ratio.

Usage: benchmarks/python_compare.py --model resnet18 --batch-size 32 [--rounds 3] [--iters 10]
Writes results/<run-id>/python_compare.{json,md} and prints the table.
"""
import argparse
import copy
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402

import precision_auto  # noqa: E402
import sluice_export  # noqa: E402


def cpu_model():
    name = precision_auto.cpu_name()
    return platform.processor() if name == "unknown CPU" else name


def time_loop(fn, x, batch, iters, warmup=3):
    """samples/s of `iters` back-to-back calls after `warmup` untimed ones."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        start = time.perf_counter()
        for _ in range(iters):
            fn(x)
        elapsed = time.perf_counter() - start
    return iters * batch / elapsed


# The package served by two instances sharing the cores: a batch alone runs on all of them, two
# at once on half each (instances.share_cores), as resnet18's exported config serves it.
SHARED = "aotinductor, 2 instances sharing the cores"


def sluice_run(args, backend, precision):
    """samples/s of `sluice bench --in-process` with one backend and precision."""
    instances = ["--workers", "1", "--threads", str(args.threads)]
    if backend == SHARED:  # Two instances on one pool of the same cores (the served default).
        instances = ["--workers", "2", "--threads", str(max(1, args.threads // 2)),
                     "--share-cores"]
    cmd = [args.sluice, "bench", "--in-process", "--model-repository", args.model_repository,
           "--model", args.model, "--batch-size", str(args.batch_size), "--iters",
           str(args.iters), *instances, "--precision", precision, "--no-results"]
    if backend in ("aotinductor", SHARED):
        cmd += ["--backend", "aotinductor"]
    else:
        cmd += ["--backend", "torchscript",
                "--compile" if backend == "torchscript+freeze" else "--no-compile"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    match = re.search(r"Throughput \(exclude warmup\): ([0-9.]+) samples per second", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return float(match.group(1))


def python_variants(args, model_dir, example):
    """name -> (callable, input) for the Python side, built once."""
    import torch._inductor.config as inductor_config

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_models  # noqa: F401  (the model classes, for eager)

    eager = torch.jit.load(os.path.join(model_dir, "model.pt")).eval()
    # The eager module: the TorchScript file's Python twin, rebuilt from its state.
    module = rebuild_eager(args.model, eager)
    variants = {}
    x32 = example
    variants[("python eager", "fp32")] = (module, x32)
    bf16 = copy.deepcopy(module).to(torch.bfloat16)
    variants[("python eager", "bf16")] = (bf16, x32.to(torch.bfloat16))
    inductor_config.freezing = True
    variants[("python torch.compile max-autotune", "fp32")] = (
        torch.compile(module, mode="max-autotune"), x32)
    variants[("python torch.compile max-autotune", "bf16")] = (
        torch.compile(bf16, mode="max-autotune"), x32.to(torch.bfloat16))
    if os.path.exists(os.path.join(model_dir, "model_int8.pt2")):
        calibration = [(x32,)]
        int8 = sluice_export.quantize_int8(module, (x32,), calibration, args.batch_size)
        variants[("python torch.compile max-autotune", "int8")] = (
            torch.compile(int8, mode="max-autotune"), x32)
    for precision in sluice_export.PRECISIONS:
        path = os.path.join(model_dir, sluice_export.package_name(precision))
        if os.path.exists(path):
            runner = sluice_export.load_package(path)
            variants[("python aoti_load_package", precision)] = (runner, x32)
    return variants


def rebuild_eager(name, scripted):
    """The nn.Module behind a default model, with the TorchScript file's weights."""
    import export_models
    if name == "resnet18":
        import torchvision
        module = torchvision.models.resnet18(weights=None, num_classes=1000)
    elif name == "fashion_mnist":
        module = export_models.FashionCnn()
    else:
        raise SystemExit(f"no eager module known for {name}")
    module.load_state_dict(scripted.state_dict())
    return module.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=["resnet18", "fashion_mnist"])
    parser.add_argument("--model-repository", default=os.path.join(ROOT, "models"))
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--iters", type=int, default=10, help="timed calls per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16,int8",
                        help="which columns to measure, e.g. fp32,int8 (bf16 is emulated, and "
                             "slow, on CPUs without AVX-512 BF16 or AMX)")
    parser.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    parser.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = os.path.join(args.model_repository, args.model)
    shape = {"resnet18": (3, 224, 224), "fashion_mnist": (1, 28, 28)}[args.model]
    example = torch.randn(args.batch_size, *shape)

    precisions = args.precisions.split(",")
    sluice_cells = [(b, p) for b in ("torchscript", "torchscript+freeze") for p in ("fp32", "bf16")
                    if p in precisions]
    sluice_cells += [(b, p) for b in ("aotinductor", SHARED) for p in sluice_export.PRECISIONS
                     if p in precisions
                     and os.path.exists(os.path.join(model_dir, sluice_export.package_name(p)))]
    print(f"{args.model} batch {args.batch_size}, {args.threads} threads, {cpu_model()}",
          flush=True)
    start = time.time()
    variants = {cell: v for cell, v in python_variants(args, model_dir, example).items()
                if cell[1] in precisions}
    print(f"python variants built in {time.time() - start:.0f} s", flush=True)

    cells = [("sluice " + b, p) for b, p in sluice_cells] + list(variants)
    results = {cell: [] for cell in cells}
    ratios = []  # Sluice .pt2 pipeline / Python .pt2 loop, fp32, per round.

    def measure(cell):
        kind, precision = cell
        if kind.startswith("sluice "):
            value = sluice_run(args, kind[len("sluice "):], precision)
        else:
            fn, x = variants[cell]
            value = time_loop(fn, x, args.batch_size, args.iters)
        results[cell].append(value)
        print(f"  {kind:38s} {precision:5s} {value:10.1f} samples/s", flush=True)
        return value

    headline = "fp32" in precisions
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        if headline:  # The headline pair, A B B A.
            a1 = measure(("sluice aotinductor", "fp32"))
            b1 = measure(("python aoti_load_package", "fp32"))
            b2 = measure(("python aoti_load_package", "fp32"))
            a2 = measure(("sluice aotinductor", "fp32"))
            ratios.append((a1 + a2) / (b1 + b2))
            print(f"  sluice/python on the same .pt2: {ratios[-1]:.3f}", flush=True)
        rest = [c for c in cells if c not in (("sluice aotinductor", "fp32"),
                                              ("python aoti_load_package", "fp32"))]
        for cell in (rest if r % 2 == 0 else list(reversed(rest))):
            measure(cell)

    medians = {cell: statistics.median(v) for cell, v in results.items()}
    kinds = list(dict.fromkeys(kind for kind, _ in cells))
    lines = [f"| {args.model}, batch {args.batch_size}, {args.threads} threads | fp32 | bf16 | int8 |",
             "|---|---:|---:|---:|"]
    for kind in kinds:
        row = [f"{medians[(kind, p)]:.1f}" if (kind, p) in medians else "n/a"
               for p in sluice_export.PRECISIONS]
        if all(v == "n/a" for v in row):
            continue
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    best = {}
    for p in sluice_export.PRECISIONS:
        ours = [v for (k, q), v in medians.items() if q == p and k.startswith("sluice")]
        theirs = [v for (k, q), v in medians.items() if q == p and k.startswith("python")]
        if ours and theirs:
            best[p] = max(ours) / max(theirs)
    lines.append("| best Sluice / best Python | " + " | ".join(
        f"{best[p]:.2f}" if p in best else "n/a" for p in sluice_export.PRECISIONS) + " |")
    table = "\n".join(lines)
    print(table)
    if ratios:
        print(f"Sluice .pt2 pipeline / Python .pt2 loop (fp32), per round: "
              f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")

    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-python-{args.model}"
    out_dir = os.path.join(args.results_dir, run_id)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "python_compare.json"), "w") as f:
        json.dump({"model": args.model, "batch_size": args.batch_size, "threads": args.threads,
                   "iters": args.iters, "rounds": args.rounds, "cpu": cpu_model(),
                   "torch": torch.__version__, "command": " ".join(sys.argv),
                   "samples_per_s": {f"{k} {p}": v for (k, p), v in results.items()},
                   "median_samples_per_s": {f"{k} {p}": v for (k, p), v in medians.items()},
                   "pt2_ratio_per_round": ratios}, f, indent=2)
    with open(os.path.join(out_dir, "python_compare.md"), "w") as f:
        f.write(table + "\n")
    print(f"Results: {out_dir}")


if __name__ == "__main__":
    main()
