#!/usr/bin/env python3
"""Language models through the KServe v2 repository API of the real `sluice serve` (with
--model-control): the index lists them with their state; unload stops serving one (404 for new
requests, gone from /v1/models and /metrics) after the requests it accepted finish; load brings
it back; a reload while a stream runs lets the stream finish on the old engine, whole, while new
requests go to the new one; a language model not loaded at start loads on request. The same
control over gRPC with tritonclient's load_model and unload_model (Triton's messages), for a
language model and a tensor model, with its refusals; and a server without --model-control
refuses both fronts.

Usage: tests/llm_repository_test.py SLUICE TEST_MODELS
"""
import http.client
import json
import os
import sys
import tempfile
import threading

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from openai_api_test import check, raw
from sluice_server import serving


def post(port, path, body=None):
    status, _, data = raw(port, "POST", path, body if body is not None else {}, key=None)
    return status, data


def index(port):
    status, data = post(port, "/v2/repository/index")
    check(status == 200, f"index: {status} {data[:200]}")
    return {m["name"]: m["state"] for m in json.loads(data)}


def complete(port, model, tokens=8):
    return post(port, "/v1/completions", {"model": model, "prompt": "hello", "max_tokens": tokens,
                                          "ignore_eos": True, "temperature": 0})


def stream_whole(port, model, tokens, started, result):
    """A streamed completion read to its end: [DONE] seen, its text, and its chunks (one a
    token, then one with the finish reason)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": model, "prompt": "hello", "max_tokens": tokens, "stream": True,
        "ignore_eos": True, "temperature": 0}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    text, done, chunks = "", False, 0
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunks += 1
        if chunks == 1:
            started.set()
        text += json.loads(line[6:])["choices"][0]["text"]
    conn.close()
    result.update(status=response.status, done=done, text=text, chunks=chunks)


def across(port, action, tokens):
    """A `tokens`-token stream on model a with `action` (a repository call) made while it runs:
    the call's status, and how the stream ended."""
    started, result = threading.Event(), {}
    streamer = threading.Thread(target=stream_whole, args=(port, "a", tokens, started, result))
    streamer.start()
    check(started.wait(60), "the stream did not start")
    status, data = post(port, action)
    streamer.join(120)
    return status, result


def grpc_refusal(call):
    """The gRPC status of a tritonclient call that must fail, and its message."""
    try:
        call()
    except InferenceServerException as e:
        return e.status(), e.message()
    raise AssertionError("the call did not fail")


def grpc_model_control(port, grpc_port):
    """Triton's model control over gRPC: the same loads and unloads the HTTP routes run."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    check(client.is_model_ready("identity"), "identity not ready over gRPC")
    client.unload_model("identity")
    status, _ = grpc_refusal(lambda: client.is_model_ready("identity"))
    check(status == "StatusCode.NOT_FOUND" and index(port)["identity"] == "UNAVAILABLE",
          f"identity still served after its gRPC unload: {status}")
    client.load_model("identity")
    check(client.is_model_ready("identity") and index(port)["identity"] == "READY",
          "identity not ready after its gRPC load")
    # A language model: its requests 404 once unloaded, and answer once loaded again.
    client.unload_model("b")
    check(complete(port, "b")[0] == 404 and index(port)["b"] == "UNAVAILABLE",
          "b answers after its gRPC unload")
    # Triton's RepositoryIndex over gRPC answers as /v2/repository/index does.
    listed = client.get_model_repository_index(as_json=True)["models"]
    by_name = {m["name"]: m for m in listed}
    check({m["name"]: m["state"] for m in listed} == index(port) and
          by_name["b"].get("reason") == "not loaded" and by_name["b"].get("version") == "1",
          f"gRPC index: {listed}, HTTP: {index(port)}")
    client.load_model("b")
    check(complete(port, "b")[0] == 200, "b does not answer after its gRPC load")
    status, message = grpc_refusal(lambda: client.load_model("nope"))
    check(status == "StatusCode.NOT_FOUND" and "nope" in message, f"unknown: {status} {message}")
    status, message = grpc_refusal(lambda: client.load_model("b", config="{}"))
    check(status == "StatusCode.INVALID_ARGUMENT" and "'config'" in message,
          f"config: {status} {message}")
    status, message = grpc_refusal(lambda: client.unload_model("b", unload_dependents=True) or
                                   client.unload_model("b"))
    check(status == "StatusCode.NOT_FOUND", f"b unloaded twice: {status} {message}")
    client.load_model("b")
    client.close()
    # tritonclient's HTTP model control sends Triton's bodies: the same rules.
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.unload_model("identity", unload_dependents=True)
    check(index(port)["identity"] == "UNAVAILABLE", "identity served after its HTTP unload")
    client.load_model("identity")
    check(client.is_model_ready("identity"), "identity not ready after its HTTP load")
    try:
        client.load_model("identity", config="{}")
        check(False, "a load with a config override was taken")
    except InferenceServerException as e:
        check("'config'" in e.message(), f"config over HTTP: {e.message()}")
    client.close()


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as repository:
        for name, source in [("a", "tiny_llm"), ("b", "tiny_llm"), ("later", "tiny_llm"),
                             ("identity", "identity")]:
            os.symlink(os.path.join(test_models, source), os.path.join(repository, name))
        with serving(sluice, ["--model-repository", repository, "--model-control",
                              "--model", "a", "--model", "b", "--model", "identity",
                              "--llm-threads", "1", "--grpc-port", "0", "--no-autoload"]) as (
                                  port, grpc_port):
            state = index(port)
            check(state == {"a": "READY", "b": "READY", "identity": "READY",
                            "later": "UNAVAILABLE"}, f"index: {state}")
            status, data = complete(port, "b")
            check(status == 200, f"b: {status} {data[:200]}")
            expected = json.loads(data)["choices"][0]["text"]

            # Unload b: its requests 404, it leaves /v1/models and /metrics.
            status, data = post(port, "/v2/repository/models/b/unload")
            check(status == 200, f"unload b: {status} {data[:200]}")
            check(complete(port, "b")[0] == 404, "b still answers")
            _, _, body = raw(port, "GET", "/v1/models", key=None)
            check([m["id"] for m in json.loads(body)["data"]] == ["a"], f"models: {body[:200]}")
            _, _, body = raw(port, "GET", "/metrics", key=None)
            check('model="b"' not in body.decode() and 'model="a"' in body.decode(),
                  "metrics after unloading b")
            check(index(port)["b"] == "UNAVAILABLE", "b in the index")
            # Load it again: the same answers.
            status, data = post(port, "/v2/repository/models/b/load")
            check(status == 200, f"load b: {status} {data[:200]}")
            status, data = complete(port, "b")
            check(status == 200 and json.loads(data)["choices"][0]["text"] == expected,
                  f"b reloaded: {status} {data[:200]}")
            # A model not loaded at start loads on request.
            status, data = post(port, "/v2/repository/models/later/load")
            check(status == 200 and complete(port, "later")[0] == 200, f"later: {status}")

            grpc_model_control(port, grpc_port)

            # Reload a while a long stream runs on it: the stream ends whole (the reload answers
            # once the old engine has finished it); the new engine answers after.
            status, result = across(port, "/v2/repository/models/a/load", 200)
            check(status == 200, f"reload a: {status}")
            check(result.get("status") == 200 and result.get("done") and
                  result.get("chunks") == 201, f"the stream across the reload: {result}")
            status, data = complete(port, "a")
            check(status == 200, f"a after its reload: {status}")
            # Unload it while a stream runs: the unload waits for the stream's end.
            status, result = across(port, "/v2/repository/models/a/unload", 120)
            check(status == 200, f"unload a: {status}")
            check(result.get("done") and result.get("chunks") == 121,
                  f"the stream across the unload: {result}")
            check(complete(port, "a")[0] == 404, "a still answers after its unload")
            # Errors: an unknown model; one not loaded.
            check(post(port, "/v2/repository/models/nope/load")[0] == 404, "unknown model")
            check(post(port, "/v2/repository/models/a/unload")[0] == 404, "a unloaded twice")
        # Without --model-control: 403 over HTTP, PERMISSION_DENIED over gRPC.
        with serving(sluice, ["--model-repository", repository, "--model", "b",
                              "--llm-threads", "1", "--grpc-port", "0"]) as (port, grpc_port):
            check(post(port, "/v2/repository/models/b/unload")[0] == 403, "HTTP control allowed")
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            # The index needs no model control; a repository name is refused by name.
            ready = [m["name"] for m in
                     client.get_model_repository_index(as_json=True)["models"]]
            check("b" in ready, f"gRPC index without model control: {ready}")
            try:
                client._client_stub.RepositoryIndex(
                    grpcclient.service_pb2.RepositoryIndexRequest(repository_name="other"))
                check(False, "an index of another repository was answered")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "'other'" in e.details(),
                      f"a repository name: {e.code()} {e.details()}")
            status, message = grpc_refusal(lambda: client.unload_model("b"))
            check(status == "StatusCode.PERMISSION_DENIED" and "--model-control" in message,
                  f"gRPC control allowed: {status} {message}")
            client.close()
            check(complete(port, "b")[0] == 200, "b stopped answering")
    print("llm_repository_test: all checks passed")


if __name__ == "__main__":
    main()
