#!/usr/bin/env python3
"""Time to first token with and without a cached prefix: a long shared system prompt, short
questions.

Starts `sluice serve` on 127.0.0.1 for one model directory. Each round makes a new system prompt
of about --prefix-tokens tokens (seeded words, so no round's prefix is cached before it starts),
then sends two streamed chat requests one after the other: the first pays the whole prompt (its
prefix is in no slot), the second asks another question after the same system prompt and finds
the prefix in the slot the first left. Prints the median TTFT of each, their ratio (the median of
the rounds' ratios) and the prefix-cache hit rate from /metrics. The server is stopped by its PID.

Usage: benchmarks/llm_prefix_cache.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--prefix-tokens 1024] [--rounds 8]
"""
import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port  # noqa: E402

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


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", response.read().decode(), re.M)
    return float(match.group(1)) if match else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    port = free_port()
    rng = random.Random(11)
    uncached, cached, ratios = [], [], []
    with tempfile.TemporaryFile("w") as log:
        server = Server("sluice", [args.sluice, "serve", "--model-repository", repository,
                                   "--model", name, "--port", str(port)],
                        "/v1/models", port, log)
        try:
            ttft(port, name, "warm-up", "hello")
            for round_index in range(args.rounds):
                # ~1.3 tokens a word for these words in SmolLM2's vocabulary.
                rules = [f"Rule {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(12)) + "."
                         for i in range(args.prefix_tokens // 20)]
                system = "\n".join(rules)
                cold = ttft(port, name, system, QUESTIONS[round_index % len(QUESTIONS)])
                warm = ttft(port, name, system, QUESTIONS[(round_index + 1) % len(QUESTIONS)])
                uncached.append(cold)
                cached.append(warm)
                ratios.append(warm / cold)
                print(f"round {round_index + 1}: uncached {cold * 1e3:.0f} ms, cached "
                      f"{warm * 1e3:.0f} ms ({warm / cold:.3f})", flush=True)
            queries = metric(port, "sluice_llm_prefix_cache_queries_total")
            hits = metric(port, "sluice_llm_prefix_cache_hits_total")
        finally:
            server.stop()
    print(f"{args.model_dir}: system prompts of ~{args.prefix_tokens} tokens, {args.rounds} rounds")
    print(f"TTFT median: uncached {statistics.median(uncached) * 1e3:.0f} ms, cached "
          f"{statistics.median(cached) * 1e3:.0f} ms; cached / uncached (median of rounds) "
          f"{statistics.median(ratios):.3f}")
    print(f"prefix-cache hits: {hits:.0f} of {queries:.0f} prompt tokens ({hits / queries:.0%})")


if __name__ == "__main__":
    main()
