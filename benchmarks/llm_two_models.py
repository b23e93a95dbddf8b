#!/usr/bin/env python3
"""Two language models in one server, both under load, against each alone.

Serves a repository of two copies of MODEL_DIR's GGUF file (models `a` and `b`) and runs
`sluice bench --llm -c CONCURRENCY` against them: `a` alone (b idle), then both at once (two bench
processes started together), with each engine at its default intra-op threads (every core, so two
busy engines oversubscribe the machine) and with `llm.threads` splitting the cores between them
(config.yaml), A B B A over `--rounds`. Prints output tokens/s per model and their sum.

Usage: benchmarks/llm_two_models.py MODEL_DIR [--rounds 2] [--concurrency 4]
"""
import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import threading
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, bench, free_port  # noqa: E402


def start(sluice, repository):
    port = free_port()
    return Server("sluice", [sluice, "serve", "--port", str(port), "--model-repository",
                             repository, "--llm-prefix-caching", "off"],
                  "/v2/health/ready", port, open(os.devnull, "w"))


def rates(args, port, models, results):
    """Output tokens/s of `sluice bench --llm` against each of `models`, all started at once."""
    options = SimpleNamespace(prompt_tokens=64, output_tokens=args.output_tokens,
                              requests=args.requests)
    found = {}

    def run(model):
        rows = bench(args.sluice, port, model, str(args.concurrency), options,
                     os.path.join(results, model))
        found[model] = float(rows[0]["output_tokens_per_s"])

    threads = [threading.Thread(target=run, args=(model,)) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(found) != len(models):
        sys.exit(f"sluice bench failed against {sorted(set(models) - set(found))}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args()
    gguf = glob.glob(os.path.join(os.path.abspath(args.model_dir), "*.gguf"))[0]
    cores = os.cpu_count() or 1
    work = tempfile.mkdtemp(prefix="sluice-two-models-")
    repositories = {}
    for setting, threads in (("default threads", 0), (f"{max(1, cores // 2)} thread(s) each",
                                                      max(1, cores // 2))):
        repository = os.path.join(work, f"repo-{threads}")
        for name in ("a", "b"):
            os.makedirs(os.path.join(repository, name))
            os.symlink(gguf, os.path.join(repository, name, "model.gguf"))
            if threads:
                with open(os.path.join(repository, name, "config.yaml"), "w") as f:
                    f.write(f"llm:\n  threads: {threads}\n")
        repositories[setting] = repository
    figures = {}
    try:
        for setting, repository in repositories.items():
            server = start(args.sluice, repository)
            try:
                for r in range(args.rounds):
                    for mode in (("alone", "both") if r % 2 == 0 else ("both", "alone")):
                        models = ("a", "b") if mode == "both" else ("a",)
                        found = rates(args, server.port, models,
                                      os.path.join(work, f"{setting}-{mode}-{r}"))
                        for model, value in found.items():
                            figures.setdefault((setting, mode, model), []).append(value)
                        print(f"{setting}, {mode}, round {r + 1}: " + ", ".join(
                            f"{m} {v:.1f}" for m, v in found.items()) + " output tokens/s",
                            flush=True)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n| engines' threads | a alone | both at once: a | b | sum | sum / a alone |")
    print("|---|---|---|---|---|---|")
    for setting in repositories:
        alone = statistics.median(figures[(setting, "alone", "a")])
        a = statistics.median(figures[(setting, "both", "a")])
        b = statistics.median(figures[(setting, "both", "b")])
        print(f"| {setting} | {alone:.1f} | {a:.1f} | {b:.1f} | {a + b:.1f} | "
              f"{(a + b) / alone:.2f} |")


if __name__ == "__main__":
    main()
