#!/usr/bin/env python3
"""Sluice against llama.cpp's llama-server on the same GGUF file, side by side.

Starts each server on 127.0.0.1 (Sluice: one `sluice serve` per model directory given, so that each
one's memory is its own; llama.cpp: `llama-server -m FILE -np 16` (--slots) with as many threads as
cores, its context 16 x (prompt + output + 64) tokens, and --no-cache-prompt; Sluice with as many
slots (--llm-slots 16: both decode up to that many sequences together) and --llm-prefix-caching
off: the client's seeded prompts repeat from round to round, and either
server's slots would answer them from the KV cache of the round before), then drives them with the
same client, `sluice bench --llm` (streamed /v1/completions, ignore_eos, prompts of the server's
own token count), at 1, 4 and 16 streams, in interleaved rounds (A B B A ...), so that drift in the
machine's speed falls on every server alike. Each server's resident memory is read from
/proc/PID/status after its runs. Prints the medians of the rounds per server and stream count, and
writes them as CSV; every process started is stopped by its PID. `--binary NAME=PATH` serves one
model with another build of Sluice (two builds compared in the same interleaved rounds; the
client is always --sluice).

benchmarks/build_llama_cpp.sh builds llama-server first.

Usage: benchmarks/llm_side_by_side.py [--sluice build/sluice] [--llama-server PATH]
           [--model NAME=DIR[@PRECISION] ...] [--gguf FILE] [--rounds 4] [--concurrency 1,4,16]
           [--prompt-tokens 128] [--output-tokens 128] [--requests N]
           [--slots 16] [--context-length N] [--binary NAME=PATH ...]
"""
import argparse
import csv
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"{process.args[0]} exited with {process.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    sys.exit(f"{url} not ready in {timeout} s")


def metric(port, name):
    """A counter or gauge from a server's /metrics (the first series of `name`); 0 when absent."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", response.read().decode(), re.M)
    return float(match.group(1)) if match else 0.0


def post_json(port, path, body, timeout=1800):
    """POSTs `body` as JSON to 127.0.0.1:port/path and returns the JSON answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, name, command, ready_path, port, log, env=None, timeout=120):
        self.name, self.port = name, port
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        env=None if env is None else {**os.environ, **env})
        wait_ready(f"http://127.0.0.1:{port}{ready_path}", self.process, timeout)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def bench(sluice, port, model, concurrency, args, results_dir):
    command = [sluice, "bench", "--llm", "--url", f"http://127.0.0.1:{port}", "--model", model,
               "-c", concurrency, "--prompt-tokens", str(args.prompt_tokens),
               "--output-tokens", str(args.output_tokens), "--results-dir", results_dir]
    if args.requests:
        command += ["--requests", str(args.requests)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    runs = sorted(glob.glob(os.path.join(results_dir, "*", "summary.csv")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        return list(csv.DictReader(f))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--llama-server", default="build/peers/llama.cpp/build/bin/llama-server")
    parser.add_argument("--model", action="append", default=[],
                        help="NAME=DIR[@PRECISION]: a model directory Sluice serves (repeatable), "
                             "PRECISION (fp32, bf16, int8) overriding its config.yaml's; default "
                             "smollm2=models/smollm2")
    parser.add_argument("--gguf", help="the file llama-server serves (default: the first "
                                       "model's .gguf)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--out", default="results/llm-side-by-side.csv")
    parser.add_argument("--requests", type=int,
                        help="timed requests per level (sluice bench's default: max(8, 2 x "
                             "streams))")
    parser.add_argument("--slots", type=int, default=16,
                        help="sequences each server holds at once (llama-server's -np, its "
                             "context that many times prompt + output + 64; Sluice's "
                             "--llm-slots): 1 for prompts of many thousand tokens")
    parser.add_argument("--context-length", type=int,
                        help="Sluice's tokens per sequence (--llm-context-length), for prompts "
                             "past its config's")
    parser.add_argument("--binary", action="append", default=[],
                        help="NAME=PATH: serve model NAME with this sluice binary instead of "
                             "--sluice (repeatable)")
    args = parser.parse_args()
    # SIGTERM (a stopped run) unwinds as an exception, so `finally` stops the servers started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    models = dict(m.split("=", 1) for m in (args.model or ["smollm2=models/smollm2"]))
    binaries = dict(b.split("=", 1) for b in args.binary)
    if set(binaries) - set(models):
        sys.exit(f"--binary names no --model: {', '.join(sorted(set(binaries) - set(models)))}")
    first_dir = next(iter(models.values())).partition("@")[0]
    gguf = args.gguf or glob.glob(os.path.join(first_dir, "*.gguf"))[0]
    threads = os.cpu_count() or 1
    results_dir = tempfile.mkdtemp(prefix="sluice-side-by-side-")
    log = open(os.path.join(results_dir, "servers.log"), "w")
    servers = []
    try:
        for name, spec in models.items():
            path, _, precision = spec.partition("@")
            port = free_port()
            command = [binaries.get(name, args.sluice), "serve", "--port", str(port), "--model-dir",
                       os.path.abspath(path), "--model-name", name, "--llm-prefix-caching", "off"]
            if precision:
                command += ["--llm-precision", precision]
            if args.context_length:
                command += ["--llm-context-length", str(args.context_length)]
            command += ["--llm-slots", str(args.slots)]
            servers.append(Server(f"sluice {name}", command, "/v2/health/ready", port, log))
        llama_port = free_port()
        servers.append(Server("llama.cpp", [args.llama_server, "-m", gguf, "--host", "127.0.0.1",
                                            "--port", str(llama_port), "-np", str(args.slots), "-c",
                                            str(args.slots *
                                                (args.prompt_tokens + args.output_tokens + 64)),
                                            "-t", str(threads), "-tb", str(threads),
                                            "--no-webui", "--no-cache-prompt"],
                              "/health", llama_port, log))
        # (label, server, model name): every Sluice model, then llama.cpp.
        targets = [(f"sluice {name}", server, name) for name, server in zip(models, servers)]
        targets.append((f"llama-server {os.path.basename(gguf)}", servers[-1], "model"))
        rows = {}
        for r in range(args.rounds):
            order = targets if r % 2 == 0 else list(reversed(targets))
            for label, server, model in order:
                print(f"round {r + 1}/{args.rounds}: {label}", flush=True)
                for row in bench(args.sluice, server.port, model, args.concurrency, args,
                                 results_dir):
                    rows.setdefault((label, int(row["concurrency"])), []).append(row)
        memory = {s.name: rss_mib(s.process.pid) for s in servers}
    finally:
        for server in servers:
            server.stop()
        log.close()
    fields = ["output_tokens_per_s", "ttft_median_ms", "tpot_median_ms", "itl_p99_ms"]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["server", "streams", "rounds"] + fields + ["rss_mib"])
        print(f"medians of {args.rounds} interleaved rounds, {args.prompt_tokens} prompt / "
              f"{args.output_tokens} output tokens, {threads} threads; RSS after the runs")
        print(f"{'server':44} {'streams':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TPOT p50':>9} "
              f"{'ITL p99':>9} {'RSS MiB':>8}")
        for (label, streams), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            medians = [statistics.median(float(run[k]) for run in runs) for k in fields]
            rss = memory[label if label.startswith("sluice") else "llama.cpp"]
            writer.writerow([label, streams, len(runs)] + [f"{m:.2f}" for m in medians] +
                            [f"{rss:.0f}"])
            print(f"{label:44} {streams:>7} {medians[0]:>10.1f} {medians[1]:>9.1f} "
                  f"{medians[2]:>9.2f} {medians[3]:>9.1f} {rss:>8.0f}")
    print(f"CSV: {args.out}; logs and runs: {results_dir}")


if __name__ == "__main__":
    main()
