#!/usr/bin/env python3
"""The language models' soak: SECONDS (default 600) of mixed OpenAI traffic against one
`sluice serve` on 127.0.0.1, then its memory, descriptors and KV cache against their baseline.

    tools/llm_soak.py SLUICE TEST_MODELS [--seconds 600] [--threads 6]

The server holds three language models built from the test models in a temporary repository:
`chat` (the tiny test model with a Hermes tool-calling template and two PEFT adapters, `a0` and
`a1`, listed in config.yaml; runtime adapter loading on), `embed` (the same weights as an
embedding model, mean pooling) and `second` (the tiny Qwen3 GGUF file, Q4_K_M). Each worker
thread loops until the deadline over the cases below in a random order; each case checks its
answer (status, shape, every stream ending once with [DONE] unless the client cut it):

    chat_stream      streamed chat, usage chunk, read to [DONE]
    chat_cut         streamed chat, the client leaves after two chunks
    completion_n     n=3 with logprobs
    schema           response_format json_schema: the content parses and fits
    tools_required   tool_choice "required": a call with valid arguments
    tools_auto       tools offered, the model free to answer
    adapter          a listed adapter as the model
    runtime_adapter  the thread's own adapter loaded, used and unloaded
    embeddings       four inputs, floats
    second           the GGUF model, streamed to [DONE]
    refused          an unknown parameter (400 naming it) and an unknown model (404)
    cut_early        a request sent and its connection closed before the answer

One more thread reloads `second` through the repository API every 30 s (--reload-every) while
its requests run.
RSS is sampled every 10 s; "start" is the sample after the first minute, "end" the last under
traffic. Fails when any case got an unexpected answer, RSS grew 5% or more, descriptors were
left open, or, idle afterwards, any model still had requests running or waiting or KV-cache
blocks held.
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from sluice_server import HERMES_TEMPLATE, serving, write_model  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
TIMEOUT = 60.0


class Unexpected(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise Unexpected(what)


def post(port, path, body, timeout=TIMEOUT):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def answer(port, path, body):
    status, data = post(port, path, body)
    expect(status == 200, f"{status} {data[:200]!r}")
    return json.loads(data)


def stream(port, path, body, cut_after=None):
    """A streamed request's chunks (JSON objects) read to [DONE], or until `cut_after` chunks,
    when the client closes the connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", path, json.dumps(dict(body, stream=True)),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise Unexpected(f"{response.status} {response.read()[:200]!r}")
        chunks, done = [], False
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            expect(not done, "data after [DONE]")
            if line == "data: [DONE]":
                done = True
                continue
            chunks.append(json.loads(line[6:]))
            if cut_after is not None and len(chunks) >= cut_after:
                return chunks
        expect(done, "the stream ended without [DONE]")
        return chunks
    finally:
        conn.close()


def chat(content, **extra):
    return dict({"model": "chat", "messages": [{"role": "user", "content": content}],
                 "max_tokens": 24, "temperature": 0.7}, **extra)


def chat_stream(port, rng, thread):
    chunks = stream(port, "/v1/chat/completions",
                    chat("tell me", stream_options={"include_usage": True}))
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    expect(sum(f is not None for f in finishes) == 1, f"finish reasons {finishes}")
    expect(chunks[-1].get("usage", {}).get("completion_tokens", 0) > 0, "no usage chunk")


def chat_cut(port, rng, thread):
    chunks = stream(port, "/v1/chat/completions", chat("go on", max_tokens=200, ignore_eos=True),
                    cut_after=2)
    expect(len(chunks) == 2, f"{len(chunks)} chunks before the cut")


def completion_n(port, rng, thread):
    reply = answer(port, "/v1/completions", {"model": "chat", "prompt": "once upon", "n": 3,
                                             "max_tokens": 12, "logprobs": 2,
                                             "temperature": 1.0, "seed": rng.randrange(1 << 30)})
    expect(sorted(c["index"] for c in reply["choices"]) == [0, 1, 2], "not three choices")
    expect(all(c["logprobs"]["tokens"] for c in reply["choices"]), "missing logprobs")


def schema(port, rng, thread):
    reply = answer(port, "/v1/chat/completions", chat("json please", max_tokens=64,
                   response_format={"type": "json_schema", "json_schema": {
                       "name": "r", "schema": SCHEMA}}))
    choice = reply["choices"][0]
    if choice["finish_reason"] == "stop":
        value = json.loads(choice["message"]["content"])
        expect(set(value) == {"n", "ok"} and isinstance(value["ok"], bool), f"{value}")


def tools_required(port, rng, thread):
    reply = answer(port, "/v1/chat/completions", chat("weather?", max_tokens=64, tools=[WEATHER],
                                                      tool_choice="required"))
    choice = reply["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        call = choice["message"]["tool_calls"][0]
        arguments = json.loads(call["function"]["arguments"])
        expect(call["function"]["name"] == "get_weather" and arguments["unit"] in ("c", "f")
               and len(arguments["city"]) <= 8, f"{call}")


def tools_auto(port, rng, thread):
    reply = answer(port, "/v1/chat/completions", chat("weather?", tools=[WEATHER]))
    expect(reply["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"), f"{reply}")


def adapter(port, rng, thread):
    reply = answer(port, "/v1/completions", {"model": rng.choice(["a0", "a1"]), "prompt": "hi",
                                             "max_tokens": 16, "ignore_eos": True})
    expect(reply["usage"]["completion_tokens"] == 16, f"{reply['usage']}")


def runtime_adapter(port, rng, thread, adapters_dir=None):
    name = f"rt{thread}"
    status, data = post(port, "/v1/load_lora_adapter",
                        {"model": "chat", "lora_name": name,
                         "lora_path": os.path.join(adapters_dir, "a1")})
    expect(status == 200, f"load: {status} {data[:200]!r}")
    reply = answer(port, "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 8})
    expect(reply["model"] == name, f"{reply['model']}")
    status, data = post(port, "/v1/unload_lora_adapter", {"model": "chat", "lora_name": name})
    expect(status == 200, f"unload: {status} {data[:200]!r}")


def embeddings(port, rng, thread):
    reply = answer(port, "/v1/embeddings", {"model": "embed", "input": [
        "hello world", "a", "the quick brown fox", "x" * rng.randrange(1, 40)]})
    expect(len(reply["data"]) == 4 and all(len(d["embedding"]) == len(reply["data"][0][
        "embedding"]) for d in reply["data"]), "not four vectors of one size")


def second(port, rng, thread):
    chunks = stream(port, "/v1/completions", {"model": "second", "prompt": "count",
                                              "max_tokens": 16})
    expect(chunks and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"),
           "no finish reason")


def refused(port, rng, thread):
    status, data = post(port, "/v1/chat/completions", chat("x", best_of=2))
    expect(status == 400 and b"best_of" in data, f"unknown parameter: {status} {data[:200]!r}")
    status, data = post(port, "/v1/completions", {"model": "nobody", "prompt": "x"})
    expect(status == 404, f"unknown model: {status}")


def cut_early(port, rng, thread):
    body = json.dumps(chat("bye", max_tokens=64)).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)


CASES = [chat_stream, chat_cut, completion_n, schema, tools_required, tools_auto, adapter,
         runtime_adapter, embeddings, second, refused, cut_early]


def make_repository(test_models, root):
    """The three models (files linked from the test models) and the adapters; returns the
    adapters' folder."""
    import peft
    import torch
    import transformers

    tiny = os.path.abspath(os.path.join(test_models, "tiny_llm"))
    adapters = os.path.join(root, "adapters")
    for rank, name, seed in ((4, "a0", 1), (8, "a1", 2)):
        torch.manual_seed(seed)
        base = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=rank, lora_alpha=2 * rank, init_lora_weights=False,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]))
        model.save_pretrained(os.path.join(adapters, name))
    for name, config in (
            ("chat", "llm:\n  precision: fp32\n  slots: 8\n  context_length: 512\n"
                     "  max_waiting: 64\n  lora:\n    max_loras: 12\n    max_lora_rank: 8\n"
                     "    runtime_loading: true\n    adapters:\n"
                     f"      a0: {adapters}/a0\n      a1: {adapters}/a1\n"),
            ("embed", "llm:\n  precision: fp32\n  context_length: 256\n"
                      "  embedding: {pooling: mean, normalize: true}\n")):
        folder = os.path.join(root, "repository", name)
        os.makedirs(folder)
        write_model(test_models, folder, HERMES_TEMPLATE, config)
    os.symlink(os.path.abspath(os.path.join(test_models, "gguf_qwen3_q4_k_m")),
               os.path.join(root, "repository", "second"))
    return adapters


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
        r'^([\w:]+)\{model(?:_name)?="(\w+)"[^}]*\} (\S+)$', text, re.M)}


def worker(port, deadline, thread, adapters_dir, tally, lock, once=False):
    rng = random.Random(thread)
    while time.monotonic() < deadline:
        cases = list(CASES)
        rng.shuffle(cases)
        for case in cases:
            if time.monotonic() >= deadline and not once:
                return
            try:
                if case is runtime_adapter:
                    case(port, rng, thread, adapters_dir)
                else:
                    case(port, rng, thread)
                outcome = None
            except (Unexpected, OSError, ValueError, KeyError, http.client.HTTPException) as e:
                outcome = f"{type(e).__name__}: {e}"
            with lock:
                tally[case.__name__][0] += 1
                if outcome:
                    tally[case.__name__][1].append(outcome)
        if once:
            return


def reloader(port, deadline, tally, lock, every):
    while time.monotonic() + every < deadline:
        time.sleep(every)
        status, data = post(port, "/v2/repository/models/second/load", {})
        with lock:
            tally["reload_second"][0] += 1
            if status != 200:
                tally["reload_second"][1].append(f"{status} {data[:200]!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sluice")
    parser.add_argument("test_models")
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--cases", help="comma-separated case names (default: all), to find "
                        "which traffic a growth comes from")
    parser.add_argument("--reload-every", type=float, default=30,
                        help="seconds between reloads of `second`; 0: none")
    args = parser.parse_args()
    if args.cases:
        chosen = args.cases.split(",")
        unknown = set(chosen) - {c.__name__ for c in CASES}
        if unknown:
            parser.error(f"unknown cases: {sorted(unknown)}")
        CASES[:] = [c for c in CASES if c.__name__ in chosen]
    warmup = min(60, args.seconds // 4)

    with tempfile.TemporaryDirectory() as root:
        adapters_dir = make_repository(args.test_models, root)
        with serving(args.sluice, ["--model-repository", os.path.join(root, "repository"),
                                   "--model-control", "--model", "chat", "--model", "embed",
                                   "--model", "second", "--max-connections", "256"],
                     with_process=True) as (port, process):
            status_path = f"/proc/{process.pid}/status"

            def rss_kib():
                with open(status_path) as f:
                    return int(re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M).group(1))

            def fds():
                return len(os.listdir(f"/proc/{process.pid}/fd"))

            # One of each case first: what the server makes once (its second event loop, the
            # grammar compiler's threads) is made before the baseline.
            tally = collections.defaultdict(lambda: [0, []])
            lock = threading.Lock()
            worker(port, time.monotonic() + 1e9, 0, adapters_dir, tally, lock, once=True)
            fds_before, rss_idle = fds(), rss_kib()
            print(f"llm soak: server pid {process.pid} on 127.0.0.1:{port}; {args.seconds} s of "
                  f"traffic, {args.threads} threads", flush=True)
            deadline = time.monotonic() + args.seconds
            threads = [threading.Thread(target=worker, args=(port, deadline, i, adapters_dir,
                                                             tally, lock))
                       for i in range(args.threads)]
            if args.reload_every > 0:
                threads.append(threading.Thread(target=reloader, args=(
                    port, deadline, tally, lock, args.reload_every)))
            for t in threads:
                t.start()
            rss_start = rss_end = rss_max = None
            elapsed = 0
            while elapsed + 10 <= args.seconds:
                time.sleep(10)
                elapsed += 10
                expect(process.poll() is None, "the server died")
                rss_end = rss_kib()
                rss_max = max(rss_max or 0, rss_end)
                if rss_start is None and elapsed >= warmup:
                    rss_start = rss_end
                with lock:
                    done = sum(n for n, _ in tally.values())
                print(f"  {elapsed:4d} s  RSS {rss_end:7d} KiB  fds {fds():4d}  requests {done}",
                      flush=True)
            for t in threads:
                t.join()
            # Idle: nothing running or waiting, no KV-cache block held, on every model.
            for _ in range(50):
                time.sleep(0.2)
                m = metrics(port)
                busy = {k: v for k, v in m.items() if v != 0 and k[0] in (
                    "vllm:num_requests_running", "vllm:num_requests_waiting",
                    "sluice_llm_kv_cache_blocks_used")}
                if not busy:
                    break
            time.sleep(2)  # Let the last connections close.
            fds_after = fds()

    failures = []
    print("\n== cases (count, unexpected)")
    for name, (count, bad) in sorted(tally.items()):
        print(f"  {name:16s} {count:6d} {len(bad):4d}")
        for outcome in collections.Counter(bad).most_common(3):
            print(f"      {outcome[1]} x {outcome[0]}")
        if bad:
            failures.append(f"{name}: {len(bad)} unexpected answers")
        if count == 0:
            failures.append(f"{name}: never ran")
    rss_start = rss_start or rss_end
    growth = (rss_end - rss_start) * 100 / rss_start
    print(f"== server\nRSS: idle {rss_idle // 1024} MiB; start (after {warmup} s) "
          f"{rss_start // 1024} MiB; end {rss_end // 1024} MiB; peak {rss_max // 1024} MiB; "
          f"growth {growth:.2f}%")
    print(f"open file descriptors: {fds_before} idle before, {fds_after} idle after")
    print(f"idle afterwards, non-zero: {busy or 'none'} (requests running, waiting; "
          "KV-cache blocks held)")
    if growth >= 5:
        failures.append(f"RSS grew {growth:.2f}%")
    if fds_after > fds_before:
        failures.append("descriptors left open")
    if busy:
        failures.append(f"not idle afterwards: {busy}")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("llm soak: " + ("FAIL" if failures else "PASS"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
