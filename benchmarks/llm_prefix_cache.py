#!/usr/bin/env python3
"""Time to first token with and without a cached prefix: a long shared system prompt, short
questions; Sluice, and llama.cpp's llama-server on the same GGUF file when it is built.

Starts `sluice serve` on 127.0.0.1 for one model directory (and `llama-server -m FILE -np 16
--cache-reuse 256`, prompt caching on as by default). Each round makes a new system prompt of about
--prefix-tokens tokens (seeded words, so no round's prefix is cached before it starts), then sends
each server two streamed chat requests one after the other: the first pays the whole prompt, the
second asks another question after the same system prompt and finds the prefix cached. The
servers take turns first (A B B A ...). Prints per server the median TTFT of each kind, their
ratio (the median of the rounds' ratios), and Sluice's prefix-cache hit rate from /metrics. Every
server is stopped by its PID.

Usage: benchmarks/llm_prefix_cache.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--llama-server build/peers/llama.cpp/build/bin/llama-server] [--prefix-tokens 1024]
           [--rounds 8]
"""
import argparse
import glob
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port, metric  # noqa: E402

WORDS = ("model server request token cache batch stream latency memory thread queue river "
         "bread library sleep morning evening garden window table letter number music").split()
QUESTIONS = ["What is the first rule above?", "Summarise the rules above in one sentence.",
             "Which rule mentions a cache?", "How many rules are there?"]


def ttft(port, model, system, question):
    """Seconds to the first streamed chunk with text."""
    body = json.dumps({"model": model, "temperature": 0, "max_tokens": 8, "stream": True,
                       "messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": question}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - start
                for _ in response:  # The rest of the stream.
                    pass
                return first
    raise RuntimeError("no text streamed")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--llama-server", default="build/peers/llama.cpp/build/bin/llama-server",
                        help="skipped when absent (benchmarks/build_llama_cpp.sh builds it)")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    ggufs = sorted(glob.glob(os.path.join(args.model_dir, "*.gguf")))
    rng = random.Random(11)
    times = {}  # label -> (uncached, cached, ratios)
    with tempfile.TemporaryFile("w") as log:
        servers = []
        try:
            port = free_port()
            servers.append(("sluice", name, Server(
                "sluice", [args.sluice, "serve", "--model-repository", repository, "--model",
                           name, "--port", str(port)], "/v1/models", port, log)))
            if ggufs and os.path.exists(args.llama_server):
                port = free_port()
                threads = str(os.cpu_count())
                servers.append(("llama.cpp", "model", Server(
                    "llama.cpp", [args.llama_server, "-m", ggufs[0], "--host", "127.0.0.1",
                                  "--port", str(port), "-np", "16", "-c",
                                  str(16 * (args.prefix_tokens + 512)), "-t", threads, "-tb",
                                  threads, "--no-webui", "--cache-reuse", "256"],
                    "/health", port, log)))
            for label, model, server in servers:
                ttft(server.port, model, "warm-up", "hello")
                times[label] = ([], [], [])
            for round_index in range(args.rounds):
                # ~1.3 tokens a word for these words in SmolLM2's vocabulary.
                rules = [f"Rule {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(12)) + "."
                         for i in range(args.prefix_tokens // 20)]
                system = "\n".join(rules)
                order = servers if round_index % 2 == 0 else list(reversed(servers))
                for label, model, server in order:
                    cold = ttft(server.port, model, system, QUESTIONS[round_index % 4])
                    warm = ttft(server.port, model, system, QUESTIONS[(round_index + 1) % 4])
                    uncached, cached, ratios = times[label]
                    uncached.append(cold)
                    cached.append(warm)
                    ratios.append(warm / cold)
                    print(f"round {round_index + 1}, {label}: uncached {cold * 1e3:.0f} ms, "
                          f"cached {warm * 1e3:.0f} ms ({warm / cold:.3f})", flush=True)
            queries = metric(servers[0][2].port, "sluice_llm_prefix_cache_queries_total")
            hits = metric(servers[0][2].port, "sluice_llm_prefix_cache_hits_total")
        finally:
            for _, _, server in servers:
                server.stop()
    print(f"{args.model_dir}: system prompts of ~{args.prefix_tokens} tokens, {args.rounds} rounds")
    for label, (uncached, cached, ratios) in times.items():
        print(f"{label}: TTFT median uncached {statistics.median(uncached) * 1e3:.0f} ms, cached "
              f"{statistics.median(cached) * 1e3:.0f} ms; cached / uncached (median of rounds) "
              f"{statistics.median(ratios):.3f}")
    print(f"Sluice's prefix-cache hits: {hits:.0f} of {queries:.0f} prompt tokens "
          f"({hits / queries:.0%})")


if __name__ == "__main__":
    main()
