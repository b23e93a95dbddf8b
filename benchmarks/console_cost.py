#!/usr/bin/env python3
"""What serving the browser console costs the inference path: identity over KServe v2 JSON at 64
connections (`sluice bench --url`), against

- before:   a build from before the console (--before BINARY; left out when not given),
- off:      this build with --no-console,
- watched:  this build with the console on and a dashboard open on it: its event stream read as
            it comes (/console/events, a sample a second) and the repository index asked every
            3 s, as the page does,

each server started, measured and stopped by its PID in turn, the order reversed every round
(A B C, C B A, ...) so the machine's drift falls on all. Prints each run, then the medians and
their ratios to `off`.

Usage: benchmarks/console_cost.py --sluice build/sluice --models build/test-models \\
           [--before /path/to/older/sluice] [--rounds 4] [--duration 10]
"""
import argparse
import csv
import glob
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def start(binary, models, extra):
    process = subprocess.Popen(
        [binary, "serve", "--model-repository", models, "--model", "identity", "--port", "0",
         *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    for line in process.stdout:
        if line.startswith("Sluice listening on http://127.0.0.1:"):
            port = int(line.strip().rsplit(":", 1)[1])
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, port
        if time.time() > deadline:
            break
    process.kill()
    sys.exit(f"{binary} did not start")


def watch(port, stop):
    """A dashboard's traffic: the event stream read as it comes, the index every 3 s."""
    def events():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/console/events")
        response = conn.getresponse()
        assert response.status == 200, response.status
        while not stop.is_set():
            if not response.fp.readline():
                break
        conn.close()

    def index():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not stop.wait(3):
            conn.request("POST", "/v2/repository/index", "{}")
            conn.getresponse().read()
        conn.close()
    threads = [threading.Thread(target=events, daemon=True), threading.Thread(target=index)]
    for t in threads:
        t.start()
    return threads


def measure(sluice, port, duration, results):
    subprocess.run([sluice, "bench", "--url", f"http://127.0.0.1:{port}", "--model", "identity",
                    "--concurrency", "64", "--duration", str(duration), "--warmup", "2",
                    "--results-dir", results], check=True, capture_output=True, text=True)
    newest = max(glob.glob(os.path.join(results, "*", "summary.csv")), key=os.path.getmtime)
    with open(newest) as f:
        row = next(csv.DictReader(f))
    return {"rps": float(row["requests_per_second"]), "p50": 1e3 * float(row["p50_s"]),
            "p99": 1e3 * float(row["p99_s"]), "errors": int(row["requests"]) - int(row["ok_requests"])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--models", default="build/test-models")
    parser.add_argument("--before", help="a sluice binary built before the console")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=10)
    args = parser.parse_args()
    variants = []
    if args.before:
        variants.append(("before", args.before, []))
    variants += [("off", args.sluice, ["--no-console"]), ("watched", args.sluice, [])]
    runs = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as results:
        for round_index in range(args.rounds):
            order = variants if round_index % 2 == 0 else list(reversed(variants))
            for name, binary, extra in order:
                process, port = start(binary, args.models, extra)
                stop = threading.Event()
                threads = watch(port, stop) if name == "watched" else []
                try:
                    run = measure(args.sluice, port, args.duration, results)
                finally:
                    stop.set()
                    process.terminate()
                    process.wait(timeout=30)
                    for t in threads:
                        t.join(timeout=5)
                runs[name].append(run)
                print(f"round {round_index + 1} {name:8s} {run['rps']:9.0f} req/s  p50 "
                      f"{run['p50']:.3f} ms  p99 {run['p99']:.3f} ms  errors {run['errors']}",
                      flush=True)
    print("\nmedians (identity, v2 JSON, 64 connections):")
    base = {k: statistics.median(r[k] for r in runs["off"]) for k in ("rps", "p50", "p99")}
    for name, _, _ in variants:
        median = {k: statistics.median(r[k] for r in runs[name]) for k in ("rps", "p50", "p99")}
        print(f"  {name:8s} {median['rps']:9.0f} req/s ({median['rps'] / base['rps']:.3f}x off)  "
              f"p50 {median['p50']:.3f} ms ({median['p50'] / base['p50']:.3f}x)  "
              f"p99 {median['p99']:.3f} ms ({median['p99'] / base['p99']:.3f}x)")


if __name__ == "__main__":
    main()
