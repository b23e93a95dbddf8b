#!/usr/bin/env python3
"""The three measurements behind choices in tools/sluice_export.py and docs/performance-log.md, on
the default models (make models), 2 threads, alternated in one process:

  dynamic-vs-static  fashion_mnist at batch 64: one package with a dynamic batch dimension
                     against one exported for a static batch of 64 (same Inductor settings).
  max-autotune       MODEL at a static BATCH: a package compiled with and without Inductor's
                     max_autotune.
  thread             the fashion_mnist fp32 package called in a tight loop on Python's main
                     thread, then on a second thread (Sluice runs models on worker threads).

Usage (from the repository root):
  .venv/bin/python benchmarks/package_experiments.py dynamic-vs-static
  .venv/bin/python benchmarks/package_experiments.py max-autotune [resnet18|fashion_mnist] [BATCH]
  .venv/bin/python benchmarks/package_experiments.py thread
"""
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402

import export_models  # noqa: E402
import sluice_export  # noqa: E402


def eager(name):
    scripted = torch.jit.load(os.path.join(ROOT, "models", name, "model.pt"))
    if name == "resnet18":
        import torchvision
        module = torchvision.models.resnet18(weights=None, num_classes=1000)
    else:
        module = export_models.FashionCnn()
    module.load_state_dict(scripted.state_dict())
    return module.eval()


def compile_package(module, x, path, dynamic=False, **extra):
    configs = sluice_export._inductor_configs({"sluice.max_batch_size": str(x.shape[0])})
    configs.update(extra)
    shapes = ({0: torch.export.Dim("batch", min=1, max=x.shape[0])},) if dynamic else None
    with torch.no_grad():
        program = torch.export.export(module, (x,), dynamic_shapes=shapes)
        torch._inductor.aoti_compile_and_package(program, package_path=path,
                                                 inductor_configs=configs)
    return sluice_export.load_package(path)


def samples_per_s(fn, x, iters):
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        start = time.perf_counter()
        for _ in range(iters):
            fn(x)
    return iters * x.shape[0] / (time.perf_counter() - start)


def alternate(variants, x, iters, rounds=3):
    names = list(variants)
    for r in range(rounds):
        for name in names + names[::-1]:  # A B B A
            print(f"round {r + 1} {name:12s} {samples_per_s(variants[name], x, iters):10.1f} "
                  f"samples/s", flush=True)


def main():
    torch.set_num_threads(2)
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    work = os.path.join(ROOT, "results", "package-experiments")
    os.makedirs(work, exist_ok=True)
    if what == "dynamic-vs-static":
        module, x = eager("fashion_mnist"), torch.randn(64, 1, 28, 28)
        alternate({"dynamic": compile_package(module, x, f"{work}/dynamic.pt2", dynamic=True),
                   "static": compile_package(module, x, f"{work}/static.pt2")}, x, 100)
    elif what == "max-autotune":
        name = sys.argv[2] if len(sys.argv) > 2 else "resnet18"
        batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
        shape = (3, 224, 224) if name == "resnet18" else (1, 28, 28)
        module, x = eager(name), torch.randn(batch, *shape)
        iters = 4 if name == "resnet18" else 200
        alternate({"default": compile_package(module, x, f"{work}/default.pt2"),
                   "max_autotune": compile_package(module, x, f"{work}/max_autotune.pt2",
                                                   max_autotune=True)}, x, iters)
    elif what == "thread":
        runner = sluice_export.load_package(os.path.join(ROOT, "models/fashion_mnist/model.pt2"))
        x = torch.randn(64, 1, 28, 28)
        result = {}

        def loop(tag):
            torch.set_num_threads(2)
            with torch.inference_mode():
                result[tag] = samples_per_s(runner, x, 400)

        for r in range(3):
            loop("main")
            worker = threading.Thread(target=loop, args=("thread",))
            worker.start()
            worker.join()
            print(f"round {r + 1} main thread {result['main']:.0f}, second thread "
                  f"{result['thread']:.0f} samples/s", flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
