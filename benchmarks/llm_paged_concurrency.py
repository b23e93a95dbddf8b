#!/usr/bin/env python3
"""More concurrent streams than static slots at the same KV-cache memory (the paged cache).

Starts `sluice serve` for one model directory in each configuration and drives it with
`sluice bench --llm` at --concurrency closed-loop streams (--requests in all, prompts of
--prompt-tokens, --output-tokens each):
  - `slots N`: N sequences at most, the pool sized for N of the full context (what a static cache
    per slot held);
  - `slots M, same memory`: M sequences at most, `--llm-kv-cache-bytes` set to the first
    server's pool (read from its /metrics), so requests are admitted as blocks for their prompt
    and max_tokens allow;
  - with --baseline-sluice, that binary (a build with a static cache per slot) at N slots too.
Configurations take turns round by round (A B C C B A ...). Prints the medians of output
tokens/s, TTFT p50 and TPOT p50, and the most sequences seen running at once (/metrics polled
every 0.1 s); every server is stopped by its PID.

Usage: benchmarks/llm_paged_concurrency.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--slots 16] [--more-slots 64] [--concurrency 64] [--requests 192]
           [--prompt-tokens 256] [--output-tokens 128] [--rounds 2] [--baseline-sluice PATH]
"""
import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port, metric  # noqa: E402

FIELDS = ["output_tokens_per_s", "ttft_median_ms", "tpot_median_ms"]


def measure(args, label, binary, flags, log, results_dir):
    port = free_port()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    server = Server(label, [binary, "serve", "--model-repository", repository, "--model", name,
                            "--port", str(port), "--llm-prefix-caching", "off"] + flags,
                    "/v1/models", port, log)
    peak, done = [0], threading.Event()

    def poll():
        while not done.wait(0.1):
            busy = metric(port, "sluice_llm_slots_busy")
            peak[0] = max(peak[0], int(busy or 0))

    poller = threading.Thread(target=poll)
    try:
        poller.start()
        subprocess.run([binary, "bench", "--llm", "--url", f"http://127.0.0.1:{port}",
                        "--model", name, "-c", str(args.concurrency), "--requests",
                        str(args.requests), "--prompt-tokens", str(args.prompt_tokens),
                        "--output-tokens", str(args.output_tokens), "--results-dir", results_dir],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        done.set()
        if poller.is_alive():
            poller.join()
        server.stop()
    runs = sorted(glob.glob(os.path.join(results_dir, "*", "summary.csv")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        row = list(csv.DictReader(f))[0]
    figures = {field: float(row[field]) for field in FIELDS}
    figures["peak_running"] = peak[0]
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--baseline-sluice", default="")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--more-slots", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as results_dir, \
            open(os.path.join(results_dir, "servers.log"), "w") as log:
        static = f"slots {args.slots}"
        paged = f"slots {args.more_slots}, same memory"
        configs = {static: (args.sluice, ["--llm-slots", str(args.slots)])}
        # The pool of the first configuration, for the second.
        port = free_port()
        name = os.path.basename(os.path.normpath(args.model_dir))
        probe = Server("probe", [args.sluice, "serve", "--model-repository",
                                 os.path.dirname(os.path.abspath(args.model_dir)), "--model", name,
                                 "--port", str(port), "--llm-slots", str(args.slots)],
                       "/v1/models", port, log)
        try:
            kv_bytes = int(metric(port, "sluice_llm_kv_cache_bytes"))
        finally:
            probe.stop()
        configs[paged] = (args.sluice, ["--llm-slots", str(args.more_slots),
                                        "--llm-kv-cache-bytes", str(kv_bytes)])
        if args.baseline_sluice:
            configs[f"baseline, slots {args.slots}"] = (args.baseline_sluice,
                                                        ["--llm-slots", str(args.slots)])
        results = {label: [] for label in configs}
        for round_index in range(args.rounds):
            order = list(configs) if round_index % 2 == 0 else list(reversed(configs))
            for label in order:
                binary, flags = configs[label]
                figures = measure(args, label, binary, flags, log, results_dir)
                results[label].append(figures)
                print(f"round {round_index + 1}, {label}: " +
                      ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    print(f"\n{args.model_dir}, KV cache {kv_bytes / 2**20:.0f} MiB, {args.concurrency} streams, "
          f"{args.requests} requests of {args.prompt_tokens} + {args.output_tokens} tokens; "
          f"medians of {args.rounds} rounds")
    print(f"{'configuration':>28} {'out tok/s':>10} {'TTFT p50':>9} {'TPOT p50':>9} {'running':>8}")
    for label, runs in results.items():
        m = {f: statistics.median(r[f] for r in runs) for f in FIELDS + ["peak_running"]}
        print(f"{label:>28} {m['output_tokens_per_s']:>10.1f} {m['ttft_median_ms']:>9.1f} "
              f"{m['tpot_median_ms']:>9.1f} {m['peak_running']:>8.0f}")


if __name__ == "__main__":
    main()
