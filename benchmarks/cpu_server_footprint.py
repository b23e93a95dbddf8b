#!/usr/bin/env python3
"""A CPU server's footprint, for two builds side by side: start-up time (exec to "listening"),
resident memory after start and after 500 requests, and the shared libraries it maps (none of
CUDA's may be among them). Rounds interleave the binaries (A B B A ...); medians are printed.

Usage: cpu_server_footprint.py --repository DIR --model identity BINARY [BINARY ...] [--rounds 6]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import time
import urllib.request

from llm_side_by_side import rss_mib  # Standard library only.

CUDA = ("libsluice_cuda", "libtorch_cuda", "libc10_cuda", "libcublas", "libcudnn", "libnccl")


def libraries(pid):
    with open(f"/proc/{pid}/maps") as f:
        return {os.path.basename(line.split()[-1]) for line in f if ".so" in line}


def one_round(binary, repository, model):
    start = time.perf_counter()
    server = subprocess.Popen([binary, "serve", "--model-repository", repository, "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    for line in server.stdout:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    startup = time.perf_counter() - start
    try:
        if port is None:
            raise SystemExit(f"{binary} did not start")
        rss_start = rss_mib(server.pid)
        body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                       "data": list(range(16))}]}).encode()
        for _ in range(500):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                                         data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()
        rss_after = rss_mib(server.pid)
        libs = libraries(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    return {"startup_s": startup, "rss_start_mib": rss_start, "rss_after_mib": rss_after,
            "libraries": len(libs), "cuda_libraries": sorted(l for l in libs if l.startswith(CUDA))}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--repository", required=True)
    parser.add_argument("--model", default="identity")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    results = {b: [] for b in args.binaries}
    order = list(args.binaries)
    for r in range(args.rounds):
        for b in (order if r % 2 == 0 else list(reversed(order))):
            results[b].append(one_round(b, args.repository, args.model))
    for b, rows in results.items():
        med = {k: statistics.median(row[k] for row in rows)
               for k in ("startup_s", "rss_start_mib", "rss_after_mib", "libraries")}
        cuda = sorted({lib for row in rows for lib in row["cuda_libraries"]})
        print(f"{b}: start-up {med['startup_s'] * 1e3:.0f} ms "
              f"(min {min(r['startup_s'] for r in rows) * 1e3:.0f}, max "
              f"{max(r['startup_s'] for r in rows) * 1e3:.0f}), RSS {med['rss_start_mib']:.1f} MiB "
              f"after start, {med['rss_after_mib']:.1f} MiB after 500 requests, "
              f"{med['libraries']:.0f} libraries mapped, CUDA's: {cuda or 'none'} "
              f"({len(rows)} rounds, medians)")


if __name__ == "__main__":
    main()
