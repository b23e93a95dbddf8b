#!/usr/bin/env python3
"""Where a language model's streamed replies cost CPU: the engine's loop or the I/O threads.

Serves one model with each binary given (`--sluice`, and `--baseline-sluice` if set), in turns
(A B B A ...), and drives each with `sluice bench --llm` (streamed /v1/completions) at
--concurrency closed-loop streams. For each run it reads the server's threads' CPU time from
/proc/PID/task/*/stat by name (`sluice-llm`: the engine's loop and the compute threads it starts;
`sluice-io`: the HTTP I/O threads) and prints the medians of output tokens/s, TPOT p50, ITL p99
and CPU milliseconds per 1,000 output tokens by thread name. Every server is stopped by its PID.

Usage: benchmarks/llm_front_threads.py [--sluice build/sluice] [--baseline-sluice PATH]
           [--model-repository build/test-models] [--model tiny_llm] [--concurrency 64]
           [--requests 256] [--prompt-tokens 32] [--output-tokens 64] [--rounds 3]
"""
import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_ms(pid):
    """CPU milliseconds (user + system) of a process's threads, summed by thread name."""
    by_name = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            with open(f"{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # The thread ended.
        by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * 1000 / TICKS
    return by_name


def run_once(args, binary, results_dir, log):
    port = free_port()
    server = Server(binary, [binary, "serve", "--model-repository", args.model_repository,
                             "--model", args.model, "--port", str(port)], "/v1/models", port, log)
    try:
        before = thread_cpu_ms(server.process.pid)
        subprocess.run([binary, "bench", "--llm", "--url", f"http://127.0.0.1:{port}",
                        "--model", args.model, "-c", str(args.concurrency),
                        "--requests", str(args.requests), "--prompt-tokens",
                        str(args.prompt_tokens), "--output-tokens", str(args.output_tokens),
                        "--results-dir", results_dir], check=True, stdout=subprocess.DEVNULL)
        after = thread_cpu_ms(server.process.pid)
    finally:
        server.stop()
    runs = sorted(glob.glob(os.path.join(results_dir, "*", "summary.csv")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        row = next(csv.DictReader(f))
    tokens = int(row["completion_tokens"])
    result = {"output_tokens_per_s": float(row["output_tokens_per_s"]),
              "tpot_median_ms": float(row["tpot_median_ms"]),
              "itl_p99_ms": float(row["itl_p99_ms"])}
    for name in ("sluice-llm", "sluice-io"):
        used = after.get(name, 0.0) - before.get(name, 0.0)
        result[f"{name} ms/1k tokens"] = used * 1000 / tokens
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--baseline-sluice")
    parser.add_argument("--model-repository", default="build/test-models")
    parser.add_argument("--model", default="tiny_llm")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    binaries = {"sluice": args.sluice}
    if args.baseline_sluice:
        binaries["baseline"] = args.baseline_sluice
    order = list(binaries)
    results = {label: [] for label in binaries}
    with tempfile.TemporaryDirectory() as results_dir, \
            open(os.path.join(results_dir, "servers.log"), "w") as log:
        for round_index in range(args.rounds):
            for label in (order if round_index % 2 == 0 else order[::-1]):
                results[label].append(run_once(args, binaries[label], results_dir, log))
                print(f"round {round_index + 1} {label}: {results[label][-1]}", flush=True)
    print(f"\n{args.model}, {args.concurrency} streams, {args.prompt_tokens}-token prompts, "
          f"{args.output_tokens} tokens each, medians of {args.rounds} runs:")
    keys = list(results[order[0]][0])
    print("binary".ljust(10) + "".join(k.rjust(24) for k in keys))
    for label in order:
        medians = [statistics.median(r[k] for r in results[label]) for k in keys]
        print(label.ljust(10) + "".join(f"{m:24.2f}" for m in medians))


if __name__ == "__main__":
    main()
