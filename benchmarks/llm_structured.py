#!/usr/bin/env python3
"""Structured output (`response_format` with a JSON schema) against free text, on one server.

Starts `sluice serve` on 127.0.0.1 for one model directory and sends chat requests that ask for
the facts of a text as JSON, greedy and streamed, alternately with the schema as
`response_format` and without it (A B B A ...), `--streams` at a time. Prints, for each:
  - output tokens/s per stream after the first token (TPOT: what the per-step token mask costs);
  - how many replies parse as JSON and validate against the schema (jsonschema);
and the time a schema's first use adds to its request (the grammar compiled against the
vocabulary), from the TTFT of requests with a schema never seen before against those with a
cached one. The server is stopped by its PID.

Usage: benchmarks/llm_structured.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--rounds 3] [--streams 1] [--max-tokens 200]
"""
import argparse
import concurrent.futures
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port  # noqa: E402
from llm_speculative import TEXTS  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 60},
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 160},
                  "minItems": 1, "maxItems": 4},
        "numbers_mentioned": {"type": "array", "items": {"type": "number"}, "maxItems": 6},
    },
    "required": ["topic", "facts", "numbers_mentioned"],
    "additionalProperties": False,
}


def chat(port, model, text, max_tokens, schema):
    """One streamed request: (content, completion tokens, TTFT s, TPOT s)."""
    body = {
        "model": model, "temperature": 0, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content":
                      "Give the topic of this text, its main facts and the numbers it mentions, "
                      "as a JSON object with the keys topic, facts and numbers_mentioned.\n\n"
                      + text}]}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "facts", "schema": schema}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    content, tokens = [], 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    content.append(choice["delta"]["content"])
    end = time.perf_counter()
    first = first or end
    return "".join(content), tokens, first - start, (end - first) / max(tokens - 1, 1)


def valid(content):
    try:
        jsonschema.validate(json.loads(content), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    tpot = {"free": [], "schema": []}
    ok = {"free": 0, "schema": 0}
    count = {"free": 0, "schema": 0}
    ttft_fresh, ttft_cached = [], []
    with tempfile.TemporaryFile("w") as log:
        port = free_port()
        server = Server("sluice", [args.sluice, "serve", "--model-repository", repository,
                                   "--model", name, "--port", str(port),
                                   # Texts repeat each round: every request pays its prompt.
                                   "--llm-prefix-caching", "off"], "/v1/models", port, log)
        try:
            chat(port, name, TEXTS[0], 8, SCHEMA)  # Warm-up (and the schema compiled), untimed.
            chat(port, name, TEXTS[0], 8, None)
            with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
                for round_index in range(args.rounds):
                    for i, text in enumerate(TEXTS):
                        order = ["free", "schema"]
                        if (round_index + i) % 2:
                            order.reverse()
                        for label in order:
                            schema = SCHEMA if label == "schema" else None
                            results = list(pool.map(
                                lambda _: chat(port, name, text, args.max_tokens, schema),
                                range(args.streams)))
                            for content, tokens, _, seconds in results:
                                tpot[label].append(seconds)
                                ok[label] += valid(content)
                                count[label] += 1
                    # A schema never seen (another bound: another grammar), then again, cached.
                    fresh = copy.deepcopy(SCHEMA)
                    fresh["properties"]["topic"]["maxLength"] = 61 + round_index
                    ttft_fresh.append(chat(port, name, TEXTS[1], 4, fresh)[2])
                    ttft_cached.append(chat(port, name, TEXTS[1], 4, fresh)[2])
        finally:
            server.stop()
    free, constrained = statistics.median(tpot["free"]), statistics.median(tpot["schema"])
    print(f"{args.model_dir}, {args.streams} stream(s), {len(TEXTS)} texts x {args.rounds} rounds, "
          f"greedy, max_tokens {args.max_tokens}")
    print(f"TPOT p50: free {free * 1e3:.2f} ms, with the schema {constrained * 1e3:.2f} ms "
          f"({constrained / free:.2f} x); tokens/s per stream {1 / free:.1f} vs "
          f"{1 / constrained:.1f}")
    print(f"replies that parse and validate: free {ok['free']} of {count['free']}, "
          f"with the schema {ok['schema']} of {count['schema']}")
    print(f"a new schema's first request: TTFT {statistics.median(ttft_fresh) * 1e3:.0f} ms "
          f"against {statistics.median(ttft_cached) * 1e3:.0f} ms cached (medians)")


if __name__ == "__main__":
    main()
