#!/usr/bin/env python3
"""Time to first token of a long shared system prompt after the server restarts, with the prefix
cache's disk tier (--llm-kv-cache-disk), against the same prompt cold.

Each round makes a new prefix of --prefix-tokens random token ids (so no round's prefix is on disk
before it starts) and starts `sluice serve` on 127.0.0.1 for the model directory with a disk tier
in a temporary folder. The first streamed /v1/completions request (the prefix and a few tokens of
its own, max_tokens 1) computes the whole prompt: the cold TTFT. A second, with other own tokens,
finds the prefix in memory. The server is stopped (SIGTERM: the blocks queued for the disk are
written first) and started again on the same folder; a third request, with other own tokens
again, finds the prefix on disk only. Prints each round's three TTFTs and the ratio after the
restart over cold, then their medians (the ratio's median over the rounds). Every server is
stopped by its PID.

Usage: benchmarks/llm_kv_disk.py --model-dir models/real-sizes/llama-3.2-1b_q4_k_m
           [--sluice build/sluice] [--prefix-tokens 4096] [--rounds 3]
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port  # noqa: E402


def ttft(port, prompt):
    """Seconds to the first streamed chunk of a completion of `prompt` (token ids)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"]:
                first = time.perf_counter() - start
                for _ in response:  # The rest of the stream.
                    pass
                return first
    raise RuntimeError("nothing streamed")


def cached_tokens(port, prompt):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())["usage"]["prompt_tokens_details"]["cached_tokens"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prefix-tokens", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(5)
    context = args.prefix_tokens + 64
    rows = []
    with tempfile.TemporaryDirectory() as disk, tempfile.TemporaryFile("w") as log:
        def start():
            port = free_port()
            return Server("sluice", [args.sluice, "serve", "--model-dir", args.model_dir,
                                     "--model-name", "m", "--port", str(port),
                                     "--llm-slots", "1", "--llm-context-length", str(context),
                                     "--llm-kv-cache-disk", disk], "/v1/models", port, log,
                          timeout=600)

        for round_index in range(args.rounds):
            prefix = [rng.randrange(1000, 40000) for _ in range(args.prefix_tokens)]
            own = [[rng.randrange(1000, 40000) for _ in range(8)] for _ in range(3)]
            server = start()
            try:
                cold = ttft(server.port, prefix + own[0])
                memory = ttft(server.port, prefix + own[1])
            finally:
                server.stop()
            server = start()
            try:
                restarted = ttft(server.port, prefix + own[2])
                from_disk = cached_tokens(server.port, prefix + own[0])
            finally:
                server.stop()
            rows.append((cold, memory, restarted))
            print(f"round {round_index + 1}: cold {cold * 1e3:.0f} ms, in memory "
                  f"{memory * 1e3:.0f} ms, after a restart {restarted * 1e3:.0f} ms "
                  f"({restarted / cold:.3f} of cold; {from_disk} prompt tokens cached)",
                  flush=True)
        folder_bytes = sum(os.path.getsize(os.path.join(root, f))
                           for root, _, files in os.walk(disk) for f in files)
    print(f"{args.model_dir}: prefixes of {args.prefix_tokens} tokens, {args.rounds} rounds; "
          f"disk tier {folder_bytes / 2**20:.0f} MiB")
    print(f"TTFT median: cold {statistics.median(r[0] for r in rows) * 1e3:.0f} ms, in memory "
          f"{statistics.median(r[1] for r in rows) * 1e3:.0f} ms, after a restart "
          f"{statistics.median(r[2] for r in rows) * 1e3:.0f} ms; after a restart / cold "
          f"(median of rounds) {statistics.median(r[2] / r[0] for r in rows):.3f}")


if __name__ == "__main__":
    main()
