#!/usr/bin/env python3
"""The language-model step budget (`max_step_tokens`) against inter-token latency and throughput.

For each budget, starts `sluice serve --llm-max-step-tokens B` on 127.0.0.1 and drives it with
`sluice bench --llm` at a steady load: --concurrency streams, each finished request replaced by a
new one (--requests in all), so newcomers' prompts keep arriving while the others decode. Budgets
run in interleaved rounds (A B C C B A ...), so the machine's drift falls on all alike. Prints,
per budget, the medians over rounds of output tokens/s, TPOT p50, ITL p99, their ratio and TTFT,
and writes them as CSV; every server started is stopped by its PID.

Usage: benchmarks/llm_step_budget.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--budgets 256,128,64,32] [--rounds 2] [--concurrency 16] [--requests 64]
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

FIELDS = ["output_tokens_per_s", "tpot_median_ms", "itl_p99_ms", "ttft_median_ms", "ttft_p99_ms"]


def measure(args, budget, log, results_dir):
    port = free_port()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    server = Server(f"sluice-{budget}",
                    [args.sluice, "serve", "--model-repository", repository, "--model", name,
                     "--port", str(port), "--llm-max-step-tokens", str(budget),
                     "--llm-prefix-caching", "off"],
                    "/v1/models", port, log)
    try:
        subprocess.run([args.sluice, "bench", "--llm", "--url", f"http://127.0.0.1:{port}",
                        "--model", name, "-c", str(args.concurrency), "--requests",
                        str(args.requests), "--prompt-tokens", str(args.prompt_tokens),
                        "--output-tokens", str(args.output_tokens), "--results-dir", results_dir],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        server.stop()
    runs = sorted(glob.glob(os.path.join(results_dir, "*", "summary.csv")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        row = list(csv.DictReader(f))[0]
    return {field: float(row[field]) for field in FIELDS}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--budgets", default="256,128,64,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--csv", default="results/llm_step_budget.csv")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    results = {b: [] for b in budgets}
    with tempfile.TemporaryDirectory() as results_dir, \
            open(os.path.join(results_dir, "servers.log"), "w") as log:
        for round_index in range(args.rounds):
            order = budgets if round_index % 2 == 0 else list(reversed(budgets))
            for budget in order:
                figures = measure(args, budget, log, results_dir)
                results[budget].append(figures)
                print(f"round {round_index + 1}, max_step_tokens {budget}: " +
                      ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    print(f"\n{args.model_dir}, {args.concurrency} streams, {args.requests} requests of "
          f"{args.prompt_tokens} + {args.output_tokens} tokens; medians of {args.rounds} rounds")
    print(f"{'budget':>7} {'out tok/s':>10} {'TPOT p50':>9} {'ITL p99':>8} {'ITL/TPOT':>9} "
          f"{'TTFT p50':>9} {'TTFT p99':>9}")
    rows = []
    for budget in budgets:
        m = {f: statistics.median(r[f] for r in results[budget]) for f in FIELDS}
        ratio = statistics.median(r["itl_p99_ms"] / r["tpot_median_ms"] for r in results[budget])
        rows.append({"max_step_tokens": budget, **m, "itl_p99_over_tpot_p50": ratio})
        print(f"{budget:>7} {m['output_tokens_per_s']:>10.1f} {m['tpot_median_ms']:>9.1f} "
              f"{m['itl_p99_ms']:>8.1f} {ratio:>9.2f} {m['ttft_median_ms']:>9.1f} "
              f"{m['ttft_p99_ms']:>9.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
