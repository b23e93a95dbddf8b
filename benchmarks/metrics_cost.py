#!/usr/bin/env python3
"""What `/metrics` costs the server: scraped as an inference gateway's endpoint picker scrapes it
(every 50 ms), with and without a language-model load beside it.

Starts `sluice serve --model-dir MODEL_DIR` and, over one keep-alive connection, scrapes /metrics
`--scrapes` times back to back: the latency of a scrape (median, p99), the body's size, and the
server's CPU time per scrape (utime + stime of /proc/PID/stat over the run, less the same
interval idle). Then the share of one core that 20 scrapes/s take. Then, with `sluice bench --llm
-c 4` running against the server, decoding's output tokens/s with and without a 20/s scraper
beside it (A B B A).

Usage: benchmarks/metrics_cost.py MODEL_DIR [--scrapes 2000]
"""
import argparse
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, bench, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def scrape_loop(port, count, interval=0.0, stop=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies, size = [], 0
    i = 0
    while (stop is None and i < count) or (stop is not None and not stop.is_set()):
        start = time.perf_counter()
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        latencies.append(time.perf_counter() - start)
        size = len(body)
        i += 1
        if interval:
            time.sleep(max(0.0, interval - (time.perf_counter() - start)))
    conn.close()
    return latencies, size


def bench_tokens_per_s(sluice, port, results):
    options = SimpleNamespace(prompt_tokens=64, output_tokens=128, requests=16)
    return float(bench(sluice, port, "m", "4", options, results)[0]["output_tokens_per_s"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    server = Server("sluice", [args.sluice, "serve", "--port", str(port), "--model-dir",
                               os.path.abspath(args.model_dir), "--model-name", "m"],
                    "/v2/health/ready", port, open(os.devnull, "w"))
    try:
        scrape_loop(port, 50)  # Warm.
        before = cpu_seconds(server.process.pid)
        start = time.perf_counter()
        latencies, size = scrape_loop(port, args.scrapes)
        elapsed = time.perf_counter() - start
        busy = cpu_seconds(server.process.pid) - before
        idle_before = cpu_seconds(server.process.pid)
        time.sleep(elapsed)
        idle = cpu_seconds(server.process.pid) - idle_before
        per_scrape_ms = max(0.0, busy - idle) / args.scrapes * 1000
        latencies.sort()
        print(f"/metrics: {size} bytes; latency median {statistics.median(latencies) * 1e3:.3f} ms,"
              f" p99 {latencies[int(0.99 * len(latencies))] * 1e3:.3f} ms; server CPU "
              f"{per_scrape_ms:.3f} ms a scrape ({args.scrapes} scrapes, idle {idle:.2f} s CPU "
              f"over the same time); at 20 scrapes/s {per_scrape_ms * 20 / 10:.2f}% of a core")

        results = tempfile.mkdtemp(prefix="sluice-metrics-cost-")
        rates = {"without": [], "with": []}
        for r in range(args.rounds):
            for who in (("without", "with") if r % 2 == 0 else ("with", "without")):
                stop = threading.Event()
                scraper = None
                if who == "with":
                    scraper = threading.Thread(target=scrape_loop, args=(port, 0, 0.05, stop))
                    scraper.start()
                rates[who].append(bench_tokens_per_s(args.sluice, port, results))
                stop.set()
                if scraper:
                    scraper.join()
                print(f"round {r + 1}: {who} a 20/s scraper: {rates[who][-1]:.1f} output tokens/s",
                      flush=True)
        print(f"decoding, 4 streams: {statistics.median(rates['without']):.1f} output tokens/s "
              f"without, {statistics.median(rates['with']):.1f} with a 20/s scraper")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
