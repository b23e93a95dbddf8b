#!/usr/bin/env python3
"""Language models on demand in the real `sluice serve` (as Ollama and llama.cpp's router serve
them): a request naming a language model of the repository that is not loaded starts its load and
waits for it (requests at once share the one load; a client that leaves meanwhile harms nothing;
with --load-wait 0 it is answered 503 with Retry-After, and the OpenAI SDK's own retries then get
the answer); one loaded so
is unloaded once idle for --keep-alive, or for its own keep_alive (a request's, as Ollama takes
it, or its config's); past --max-loaded-models, or past --max-model-memory by
the models' estimated sizes, the least recently used idle one is unloaded first; a model larger
than the budget, or than the machine's memory, is refused naming the sizes (at start, the server
does not start); a model whose load fails says why, and is not loaded again at every request;
--no-autoload keeps the 404.

Usage: tests/llm_on_demand_test.py SLUICE TEST_MODELS
"""
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import openai

from openai_api_test import check, raw
from sluice_server import serving


def index(port):
    status, _, data = raw(port, "POST", "/v2/repository/index", {}, key=None)
    check(status == 200, f"index: {status} {data[:200]}")
    return {m["name"]: m["state"] for m in json.loads(data)}


def complete(port, model):
    return raw(port, "POST", "/v1/completions", {"model": model, "prompt": "hello",
                                                 "max_tokens": 4, "temperature": 0}, key=None)


def tiny_llm_with(test_models, repository, name, config):
    """tiny_llm's files as model `name` of the repository, with this config.yaml; its folder."""
    folder = os.path.join(repository, name)
    os.makedirs(folder)
    for entry in os.listdir(os.path.join(test_models, "tiny_llm")):
        if entry != "config.yaml":
            os.symlink(os.path.join(test_models, "tiny_llm", entry), os.path.join(folder, entry))
    with open(os.path.join(folder, "config.yaml"), "w") as f:
        f.write(config)
    return folder


def wait_for(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as repository:
        for name in ("a", "b", "c"):
            os.symlink(os.path.join(test_models, "tiny_llm"), os.path.join(repository, name))
        broken = os.path.join(repository, "broken")
        os.makedirs(broken)
        with open(os.path.join(broken, "config.json"), "w") as f:
            f.write('{"model_type": "llama"}')
        open(os.path.join(broken, "model.safetensors"), "wb").close()
        keep_alive = 3
        with serving(sluice, ["--model-repository", repository, "--model", "a",
                              "--keep-alive", str(keep_alive), "--max-loaded-models", "2",
                              "--llm-threads", "1"]) as port:
            check(index(port) == {"a": "READY", "b": "UNAVAILABLE", "c": "UNAVAILABLE",
                                  "broken": "UNAVAILABLE"}, f"index at start: {index(port)}")
            # A client that asks for b and leaves at once: b's load starts, the server goes on.
            body = json.dumps({"model": "b", "prompt": "hello", "max_tokens": 4}).encode()
            with socket.create_connection(("127.0.0.1", port)) as gone:
                gone.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/json\r\nContent-Length: " +
                             str(len(body)).encode() + b"\r\n\r\n" + body)
            # Four requests for b at once wait for its one load, and each gets its answer.
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda _: complete(port, "b"), range(4)))
            check([a[0] for a in answers] == [200] * 4,
                  f"requests for b waiting for its load: {[(a[0], a[2][:200]) for a in answers]}")
            check(index(port)["b"] == "READY", f"b after its load: {index(port)}")
            # The OpenAI SDK gets c's answer whole, its first request waiting for the load. c makes
            # a third language model: a (loaded at start, unused since) is the least recently used
            # idle one and is unloaded for it; b, used last, stays.
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=8)
            reply = client.completions.create(model="c", prompt="hello", max_tokens=4,
                                              temperature=0)
            check(reply.choices[0].text and reply.usage.completion_tokens >= 1, f"c: {reply}")
            state = index(port)
            check(state["a"] == "UNAVAILABLE" and state["b"] == "READY" and
                  state["c"] == "READY", f"after c (at most 2 loaded): {state}")
            # /v1/models lists every model a request may name, each with its state (as
            # llama.cpp's router lists them): b and c loaded, a unloaded, broken unloaded (not
            # tried yet).
            _, _, body = raw(port, "GET", "/v1/models", key=None)
            listed = {m["id"]: m["status"]["value"] for m in json.loads(body)["data"]}
            check(listed == {"a": "unloaded", "b": "loaded", "c": "loaded",
                             "broken": "unloaded"}, f"/v1/models after c: {body[:400]}")
            # The OpenAI SDK reads the listing.
            check(sorted(m.id for m in client.models.list()) == ["a", "b", "broken", "c"],
                  "the SDK's listing")
            # Idle past keep_alive: b and c (loaded by requests) are unloaded.
            started = time.monotonic()
            wait_for(lambda: index(port)["b"] == "UNAVAILABLE" and
                     index(port)["c"] == "UNAVAILABLE", "b and c to be unloaded when idle",
                     timeout=keep_alive + 20)
            check(time.monotonic() - started >= keep_alive - 0.5,
                  "unloaded before their keep_alive")
            # A model that fails to load says why (its first request waited for the load), and
            # the next requests are told the same without a load each.
            status, _, data = complete(port, "broken")
            check(status == 503 and "failed to load" in data.decode(),
                  f"broken's first request: {status} {data[:300]}")
            status, headers, data = complete(port, "broken")
            check(status == 503 and int(headers.get("Retry-After", "0")) > 1 and
                  "failed to load" in json.loads(data)["error"]["message"],
                  f"broken: {status} {headers} {data[:300]}")
            _, _, body = raw(port, "GET", "/v1/models/broken", key=None)
            check(json.loads(body)["status"]["value"] == "error", f"broken listed: {body}")
            # An unknown model is still a 404.
            check(complete(port, "nope")[0] == 404, "an unknown model")
        # keep_alive per request (Ollama's, through the OpenAI SDK's extra_body) and per model
        # (config.yaml's llm.keep_alive), over the server's --keep-alive 5: a, loaded at start
        # (never unloaded for idleness by itself), asked with "1s", and c, asked with 0, are
        # unloaded before the server's 5 s; b asked with -1 and d configured with -1 stay past it.
        kept = tiny_llm_with(test_models, repository, "d", "llm:\n  keep_alive: -1\n")
        with serving(sluice, ["--model-repository", repository, "--model", "a",
                              "--keep-alive", "5", "--llm-threads", "1"]) as port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            for name, keep in (("a", "1s"), ("b", -1), ("c", 0), ("d", None)):
                extra = {} if keep is None else {"extra_body": {"keep_alive": keep}}
                client.completions.create(model=name, prompt="hello", max_tokens=2, **extra)
            asked = time.monotonic()
            wait_for(lambda: index(port)["a"] == "UNAVAILABLE" and
                     index(port)["c"] == "UNAVAILABLE",
                     "a (keep_alive 1s) and c (0) to unload before the server's 5 s",
                     timeout=asked + 4.5 - time.monotonic())
            time.sleep(max(0.0, asked + 7 - time.monotonic()))
            state = index(port)
            check(state["b"] == "READY" and state["d"] == "READY",
                  f"b (keep_alive -1) and d (config -1) past the server's 5 s: {state}")
            status, _, data = raw(port, "POST", "/v1/completions",
                                  {"model": "b", "prompt": "hi", "keep_alive": "soon"}, key=None)
            check(status == 400 and json.loads(data)["error"]["param"] == "keep_alive",
                  f"a bad keep_alive: {status} {data[:200]}")
        shutil.rmtree(kept)
        # Memory: a model larger than --max-model-memory stops the start, naming its size.
        started = subprocess.run([sluice, "serve", "--port", "0", "--model-repository",
                                  repository, "--model", "a", "--max-model-memory", "1"],
                                 capture_output=True, text=True, timeout=60)
        said = started.stdout + started.stderr
        size = re.search(r"'a' needs about ([0-9.]+) MiB \(weights [0-9.]+ MiB, KV cache "
                         r"[0-9.]+ MiB\): more than --max-model-memory", said)
        check(started.returncode != 0 and size, f"a over the budget at start: {said[-500:]}")
        one = float(size.group(1)) * (1 << 20)
        # Room for two: a third loaded unloads the least recently used idle one (a).
        with serving(sluice, ["--model-repository", repository, "--model", "a",
                              "--max-model-memory", str(int(one * 2.5)),
                              "--llm-threads", "1"]) as port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=8)
            for name in ("b", "c"):
                client.completions.create(model=name, prompt="hello", max_tokens=2)
            state = index(port)
            check(state["a"] == "UNAVAILABLE" and state["b"] == "READY" and
                  state["c"] == "READY", f"after c (memory for 2): {state}")
        # A model whose KV cache the machine has not got is refused before its load.
        tiny_llm_with(test_models, repository, "huge",
                      "llm:\n  kv_cache_bytes: 1099511627776000\n")  # 1,000 TiB
        # --load-wait 0: the request that starts a load is answered at once, 503 with
        # Retry-After naming the model; the OpenAI SDK's own retries (it follows Retry-After) get
        # the answer whole.
        with serving(sluice, ["--model-repository", repository, "--model", "a",
                              "--load-wait", "0", "--llm-threads", "1"]) as port:
            status, headers, data = complete(port, "b")
            error = json.loads(data)["error"]
            check(status == 503 and int(headers.get("Retry-After", "0")) >= 1 and
                  "'b' is loading" in error["message"] and error["param"] == "model",
                  f"first request for b with --load-wait 0: {status} {headers} {data[:300]}")
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=8)
            reply = client.completions.create(model="c", prompt="hello", max_tokens=4)
            check(reply.usage.completion_tokens >= 1, f"c through the SDK's retries: {reply}")
            check(complete(port, "huge")[0] == 503, "huge's first request")
            wait_for(lambda: "the machine has" in complete(port, "huge")[2].decode(),
                     "huge's load to be refused")
            status, _, data = complete(port, "huge")
            message = json.loads(data)["error"]["message"]
            check(status == 503 and re.search(r"'huge' needs about [0-9.]+ GiB \(weights "
                                              r"[0-9.]+ MiB, KV cache 1024000\.00 GiB\); the "
                                              r"machine has [0-9.]+ GiB left", message),
                  f"huge: {status} {message}")
            check(complete(port, "a")[0] == 200, "a still serves")
        # --no-autoload: a model not loaded is a 404.
        with serving(sluice, ["--model-repository", repository, "--model", "a",
                              "--no-autoload", "--llm-threads", "1"]) as port:
            check(complete(port, "b")[0] == 404, "b loaded with --no-autoload")
            _, _, body = raw(port, "GET", "/v1/models", key=None)
            check([m["id"] for m in json.loads(body)["data"]] == ["a"],
                  f"--no-autoload lists only what is loaded: {body[:300]}")
            check(index(port)["b"] == "UNAVAILABLE", "b in the index with --no-autoload")
    print("llm_on_demand_test: all checks passed")


if __name__ == "__main__":
    main()
