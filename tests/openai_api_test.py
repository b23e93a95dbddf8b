#!/usr/bin/env python3
"""The OpenAI-style API of the real `sluice serve`, driven by the OpenAI Python SDK (and raw HTTP
where the SDK hides what is checked): /v1/models, chat and text completions, streaming with a
usage chunk, /tokenize and /detokenize, vLLM's render routes, the error shapes, a disconnect mid-stream, the API key;
two servers sharing one weights cache; a thinking template's reasoning_content; `sluice bench
--llm`, over HTTP and in process.

Usage: tests/openai_api_test.py SLUICE TEST_MODELS
"""
import http.client
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import jsonschema
import openai
import pydantic
import typing

from sluice_server import serving, templated_model

API_KEY = "test-key-123"


def raw(port, method, path, body=None, key=API_KEY):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), data


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def metric(port, name, labels='model="tiny_llm"'):
    _, _, body = raw(port, "GET", "/metrics")
    match = re.search(rf'^{name}{{{labels}}} (\S+)$', body.decode(), re.M)
    return float(match.group(1)) if match else None


def clients_gone(port):
    """Requests whose client left before its answer (counted as 499, as nginx logs them)."""
    return metric(port, "sluice_http_responses_total", 'code="499"') or 0


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as repository:
        os.symlink(os.path.join(test_models, "tiny_llm"), os.path.join(repository, "tiny_llm"))
        os.symlink(os.path.join(test_models, "identity"), os.path.join(repository, "identity"))
        with serving(sluice, ["--model-repository", repository, "--api-key", API_KEY,
                              "--llm-threads", "1"]) as port:
            run(port)
            bench(sluice, port)
    weights_cache(sluice, test_models)
    reasoning(sluice, test_models)
    in_process_bench(sluice, test_models)
    print("openai_api_test: all checks passed")


def in_process_bench(sluice, test_models):
    """`sluice bench --llm --in-process`: --requests requests in all through --concurrency streams
    (each ended request replaced), the engine's slots and step budget as given and named on the
    first line; the two engine flags refused where they would set nothing."""
    out = subprocess.run(
        [sluice, "bench", "--llm", "--in-process", "--model-dir",
         os.path.join(test_models, "tiny_llm"), "--threads", "1", "--concurrency", "2",
         "--requests", "5", "--llm-slots", "1", "--llm-max-step-tokens", "7", "--prompt-tokens",
         "20", "--output-tokens", "48"],
        capture_output=True, text=True, timeout=300)
    check(out.returncode == 0, f"in-process bench failed: {out.stdout} {out.stderr}")
    check("slots 1, step budget 7 prompt tokens" in out.stdout, out.stdout)
    line = re.search(r"concurrency +2, (\d+) requests, (\d+) output tokens in ([\d.]+) s: "
                     r"first token \(prefill\) median ([\d.]+) ms, max ([\d.]+) ms", out.stdout)
    check(line is not None, out.stdout)
    # Every one of the 5 requests ran its 48 tokens (not just one a stream).
    check(int(line.group(1)) == 5 and int(line.group(2)) == 5 * 48, out.stdout)
    # One slot: the requests run one after another. Each one's first token is timed from its own
    # submission (the fifth's waits out the fourth, about 2/5 of the run), not from the run's
    # start (4/5 of it).
    check(float(line.group(5)) < 0.6 * 1e3 * float(line.group(3)), out.stdout)
    for flags in (["--url", "http://127.0.0.1:9", "--llm-slots", "2"],
                  ["--in-process", "--llm-max-step-tokens", "16", "--agreement", "int8"]):
        refused = subprocess.run(
            [sluice, "bench", "--llm", "--model-dir", os.path.join(test_models, "tiny_llm")] +
            flags, capture_output=True, text=True, timeout=60)
        check(refused.returncode != 0 and "--llm-slots and --llm-max-step-tokens" in
              refused.stdout + refused.stderr, f"{flags}: {refused.stdout} {refused.stderr}")


THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}")


def reasoning(sluice, test_models):
    """A model whose chat template thinks (Qwen3's shape): the reply inside the block the prompt
    opens is reasoning_content, streamed and not alike; chat_template_kwargs' enable_thinking
    false closes the block in the prompt and the reply is content."""
    with templated_model(test_models, THINKING_TEMPLATE) as model:
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        with serving(sluice, ["--model-dir", model, "--model-name", "m"]) as port:
            status, _, data = raw(port, "POST", "/v1/chat/completions", body, key=None)
            check(status == 200, f"thinking: {status} {data[:200]}")
            message = json.loads(data)["choices"][0]["message"]
            # The tiny random model never closes the block in 8 tokens: all of it is reasoning.
            check(message["content"] == "" and message["reasoning_content"],
                  f"thinking on: {message}")
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            streamed = {"reasoning_content": "", "content": ""}
            for chunk in client.chat.completions.create(
                    model="m", messages=body["messages"], max_tokens=8, temperature=0,
                    stream=True, extra_body={"ignore_eos": True}):
                if chunk.choices:
                    delta = chunk.choices[0].delta
                    streamed["reasoning_content"] += getattr(delta, "reasoning_content", None) or ""
                    streamed["content"] += delta.content or ""
            check(streamed == {"reasoning_content": message["reasoning_content"], "content": ""},
                  f"streamed {streamed} against {message}")
            status, _, data = raw(port, "POST", "/v1/chat/completions",
                                  {**body, "chat_template_kwargs": {"enable_thinking": False}},
                                  key=None)
            check(status == 200, f"thinking off: {status} {data[:200]}")
            message = json.loads(data)["choices"][0]["message"]
            check(message["content"] and message["reasoning_content"] is None,
                  f"thinking off: {message}")
            # An agent loop appends the reply as the SDK gave it, reasoning_content included,
            # and asks again: the second turn is served.
            first = client.chat.completions.create(model="m", messages=body["messages"],
                                                   max_tokens=8, temperature=0)
            check(getattr(first.choices[0].message, "reasoning_content", None),
                  f"first turn: {first}")
            second = client.chat.completions.create(
                model="m", max_tokens=8, temperature=0,
                messages=body["messages"] + [first.choices[0].message,
                                             {"role": "user", "content": "And 3 + 3?"}])
            check(second.choices[0].finish_reason in ("stop", "length"), f"second: {second}")


def mapping_pages(pid, path):
    """(Rss, Shared_Clean + Shared_Dirty) in kB of `pid`'s mappings of `path` (a file just written
    is dirty in the page cache until written back)."""
    rss = shared = 0
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = fields[5] if len(fields) > 5 else None
            elif current == path and fields[0] == "Rss:":
                rss += int(fields[1])
            elif current == path and fields[0] in ("Shared_Clean:", "Shared_Dirty:"):
                shared += int(fields[1])
    return rss, shared


def weights_cache(sluice, test_models):
    """--llm-weights-cache: the first server writes a GGUF file's repacked weights to the folder
    and serves from it; a second, started beside it, maps the same file and shares its pages; both
    answer alike."""
    model = os.path.join(test_models, "gguf_smollm2_q4_1")
    prompt = {"model": "m", "prompt": "The capital of France is", "max_tokens": 8,
              "temperature": 0}
    with tempfile.TemporaryDirectory() as cache:
        args = ["--model-dir", model, "--model-name", "m", "--llm-weights-cache", cache]
        with serving(sluice, args, with_process=True) as (port_a, server_a):
            files = os.listdir(cache)
            check(len(files) == 1 and files[0].endswith(".repacked"), f"cache: {files}")
            path = os.path.join(cache, files[0])
            with serving(sluice, args, with_process=True) as (port_b, server_b):
                check(os.listdir(cache) == files, f"the second server wrote: {os.listdir(cache)}")
                answers = []
                for port in (port_a, port_b):
                    status, _, body = raw(port, "POST", "/v1/completions", prompt, key=None)
                    check(status == 200, f"completion: {status} {body[:200]}")
                    answers.append(json.loads(body)["choices"][0]["text"])
                check(answers[0] == answers[1], f"answers differ: {answers}")
                size_kb = os.path.getsize(path) // 1024
                for pid in (server_a.pid, server_b.pid):
                    rss, shared = mapping_pages(pid, path)
                    check(rss >= 0.9 * size_kb and shared >= 0.9 * rss,
                          f"pid {pid}: {rss} kB of the {size_kb} kB file mapped, {shared} shared")


def run(port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0)

    models = client.models.list()
    check([m.id for m in models.data] == ["tiny_llm"], f"models: {models}")
    model = client.models.retrieve("tiny_llm")
    check(model.id == "tiny_llm" and model.object == "model", f"model: {model}")
    try:
        client.models.retrieve("no_such_model")
        check(False, "an unknown model was found")
    except openai.NotFoundError as e:
        check(e.body.get("param") == "model", f"unknown model: {e.body}")

    messages = [{"role": "user", "content": "hello world"}]
    chat = client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=12,
                                          temperature=0, extra_body={"ignore_eos": True})
    reply = chat.choices[0].message.content
    check(chat.object == "chat.completion" and chat.choices[0].message.role == "assistant",
          f"chat: {chat}")
    check(chat.usage.completion_tokens == 12 and chat.choices[0].finish_reason == "length",
          f"usage: {chat.usage}")
    check(chat.usage.prompt_tokens > 5 and
          chat.usage.total_tokens == chat.usage.prompt_tokens + 12, f"usage: {chat.usage}")

    # Streaming: the same greedy text, a role first, a finish reason, then the usage chunk.
    chunks = list(client.chat.completions.create(
        model="tiny_llm", messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk: {chunks[0]}")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == reply, f"streamed {streamed!r} != {reply!r}")
    check(chunks[-2].choices[0].finish_reason == "length", f"finish chunk: {chunks[-2]}")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12,
          f"usage chunk: {chunks[-1]}")
    check(all(c.object == "chat.completion.chunk" for c in chunks), "chunk objects")

    # The raw stream ends with data: [DONE].
    status, headers, body = raw(port, "POST", "/v1/chat/completions", {
        "model": "tiny_llm", "messages": messages, "max_tokens": 3, "stream": True})
    check(status == 200 and headers.get("Content-Type") == "text/event-stream", f"{status} {headers}")
    check(body.decode().rstrip().endswith("data: [DONE]"), f"stream end: {body[-80:]!r}")

    completion = client.completions.create(model="tiny_llm", prompt="the quick brown fox",
                                           max_tokens=8, temperature=0, stop=["zzzz"])
    check(completion.object == "text_completion" and completion.usage.completion_tokens <= 8,
          f"completion: {completion}")

    # /tokenize and /detokenize (vLLM's routes): the counts the completions report, and back.
    status, _, body = raw(port, "POST", "/tokenize", {"model": "tiny_llm", "messages": messages})
    tokenized = json.loads(body)
    check(status == 200 and tokenized["count"] == len(tokenized["tokens"]) ==
          chat.usage.prompt_tokens and tokenized["max_model_len"] == 256, f"tokenize chat: {body}")
    status, _, body = raw(port, "POST", "/tokenize", {"prompt": "the quick brown fox"})
    check(status == 200 and json.loads(body)["count"] == completion.usage.prompt_tokens,
          f"tokenize prompt: {body} against {completion.usage}")
    status, _, body = raw(port, "POST", "/tokenize", {"prompt": "the quick brown fox",
                                                      "add_special_tokens": False})
    ids = json.loads(body)["tokens"]
    status, _, body = raw(port, "POST", "/detokenize", {"model": "tiny_llm", "tokens": ids})
    check(status == 200 and json.loads(body) == {"prompt": "the quick brown fox"},
          f"detokenize: {status} {body}")
    for path, bad, param in [("/tokenize", {"prompt": "x", "return_token_strs": True},
                              "return_token_strs"),
                             ("/tokenize", {"prompt": "x", "messages": messages}, "prompt"),
                             ("/tokenize", {"prompt": 7}, "prompt"),
                             ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"},
                              "add_special_tokens"),
                             ("/detokenize", {"tokens": [1, 100000]}, "tokens"),
                             ("/detokenize", {"tokens": "1 2"}, "tokens"),
                             ("/detokenize", {"model": "no_such_model", "tokens": [1]}, "model")]:
        status, _, body = raw(port, "POST", path, bad)
        error = json.loads(body)["error"]
        check(status in (400, 404) and error["param"] == param and error["message"],
              f"{path} {bad}: {status} {error}")

    render(client, port, messages, chat, reply, tokenized["tokens"], completion)

    seeded = [client.completions.create(model="tiny_llm", prompt="hello", max_tokens=10,
                                        temperature=1.0, seed=42,
                                        extra_body={"ignore_eos": True}).choices[0].text
              for _ in range(2)]
    check(seeded[0] == seeded[1], f"seeded sampling differs: {seeded}")

    choices_and_logprobs(client, messages)
    structured_outputs(client, port, messages)

    # A repeated prompt finds its full 16-token blocks cached (all but the one holding its last
    # token, which runs again for the logits).
    hits = metric(port, "sluice_llm_prefix_cache_hits_total")
    again = [client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=4,
                                            temperature=0, extra_body={"ignore_eos": True})
             for _ in range(2)]
    check(again[0].choices[0].message.content == again[1].choices[0].message.content,
          f"cached prefix, other text: {again}")
    check(metric(port, "sluice_llm_prefix_cache_hits_total") - hits >=
          (again[0].usage.prompt_tokens - 1) // 16 * 16 > 0,
          "the repeated prompt's prefix was not reused")
    # The request's own hits, as OpenAI reports them; and the backend's fingerprint, the same
    # for every request to one model.
    check(again[1].usage.prompt_tokens_details.cached_tokens ==
          (again[1].usage.prompt_tokens - 1) // 16 * 16, f"cached_tokens: {again[1].usage}")
    check(again[0].system_fingerprint.startswith("fp_") and
          again[0].system_fingerprint == again[1].system_fingerprint,
          f"system_fingerprint: {again[0].system_fingerprint} {again[1].system_fingerprint}")
    check(metric(port, "sluice_llm_kv_cache_blocks") == 8 * 256 // 16 and
          metric(port, "sluice_llm_kv_cache_blocks_used") == 0, "KV-cache blocks")

    # Errors in OpenAI's shape.
    try:
        client.chat.completions.create(model="no_such_model", messages=messages)
        check(False, "unknown model accepted")
    except openai.NotFoundError as e:
        check(e.body["code"] == "not_found" and e.body["param"] == "model", f"404: {e.body}")
    long_prompt = "hello world " * 400
    status, _, body = raw(port, "POST", "/v1/completions", {"model": "tiny_llm", "prompt": long_prompt})
    error = json.loads(body)["error"]
    check(status == 400 and "256" in error["message"] and error["type"] == "invalid_request_error",
          f"too long: {status} {error}")
    prompt_tokens = re.search(r"prompt has (\d+) tokens", error["message"])
    check(prompt_tokens and int(prompt_tokens.group(1)) > 256, f"names the prompt length: {error}")
    for bad, param in [({"messages": []}, "messages"), ({"messages": messages, "temperature": 5}, "temperature"),
                       ({"messages": messages, "n": 0}, "n"), ({"messages": messages, "stop": [1]}, "stop"),
                       ({"messages": messages, "response_format": {"type": "regex"}},
                        "response_format"),
                       ({"messages": messages, "response_format": {"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
                        "response_format"),
                       ({"messages": messages, "top_logprobs": 2}, "top_logprobs"),
                       ({"messages": messages, "logprobs": True, "top_logprobs": 21},
                        "top_logprobs"),
                       ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
                       ({"messages": messages, "stream": "yes"}, "stream"),
                       ({"messages": messages, "stream_options": {"include_usage": True}},
                        "stream_options"),
                       ({"messages": [{"role": "user", "content": "2+2?"},
                                      {"role": "assistant", "content": None, "tool_calls": [
                                          {"id": "c1", "type": "function", "function": {
                                              "name": "add", "arguments": "{}"}}]},
                                      {"role": "tool", "content": "4"}]},
                        "messages"),
                       ({"messages": messages, "model": 7}, "model")]:
        status, _, body = raw(port, "POST", "/v1/chat/completions", {"model": "tiny_llm", **bad})
        error = json.loads(body)["error"]
        check(status == 400 and error["param"] == param and error["message"], f"{bad}: {status} {error}")
    # The tiny model's template renders no tools: they are given in the conversation, and a
    # history of calls and results is rendered as text, not refused. (Its 256 positions cannot
    # hold them: the prompt, tools and all, is measured against them.)
    status, _, body = raw(port, "POST", "/v1/chat/completions", {
        "model": "tiny_llm", "max_tokens": 4, "tools": [{"type": "function", "function": {
            "name": "add", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "2+2?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {
                             "name": "add", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "4"}]})
    error = json.loads(body)["error"]
    check(status == 400 and error["param"] == "messages" and
          "maximum context length" in error["message"],
          f"tools on a template without them: {status} {error}")
    status, _, body = raw(port, "POST", "/v1/chat/completions", b"not json".decode())
    check(status == 400, f"bad json: {status}")
    status, _, _ = raw(port, "GET", "/v1/models", key=None)
    check(status == 401, f"no key: {status}")

    # A client that leaves mid-stream frees its slot: no tokens are generated for nobody.
    before = metric(port, "sluice_llm_generated_tokens_total")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": "tiny_llm", "prompt": "hello", "max_tokens": 240, "stream": True,
        "ignore_eos": True}), {"Content-Type": "application/json", "X-API-Key": API_KEY})
    response = conn.getresponse()
    response.fp.readline()  # The first event.
    # The gateway's metrics (the Inference Extension's model-server protocol, vLLM's names) while
    # the stream runs: one request running, none waiting, some of the cache in use.
    # One scrape, while the stream (240 tokens) is still being written.
    vllm = 'model_name="tiny_llm"'
    _, _, scrape = raw(port, "GET", "/metrics")
    values = dict(re.findall(r'^(vllm:\w+)\{model_name="tiny_llm"\} (\S+)$', scrape.decode(), re.M))
    running, waiting, usage = (float(values[n]) if n in values else None for n in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"))
    check(running == 1 and waiting == 0 and usage is not None and 0 < usage <= 1,
          f"gateway metrics mid-stream: running {running}, waiting {waiting}, usage {usage}")
    conn.sock.close()
    conn.close()
    # The compile is not interrupted (it is cached for later requests): the client is counted
    # once it ends, which on a loaded machine (ctest -j) takes seconds.
    deadline = time.time() + 60
    while metric(port, "sluice_llm_slots_busy") != 0 and time.time() < deadline:
        time.sleep(0.05)
    check(metric(port, "sluice_llm_slots_busy") == 0, "the slot stayed busy after the disconnect")
    generated = metric(port, "sluice_llm_generated_tokens_total") - before
    check(generated < 240, f"{generated} tokens generated for a client that left")
    check(metric(port, "vllm:num_requests_running", vllm) == 0 and
          metric(port, "vllm:kv_cache_usage_perc", vllm) == 0, "gateway metrics after the stream")
    config = metric(port, "vllm:cache_config_info",
                    f'{vllm},block_size="16",num_gpu_blocks="{8 * 256 // 16}"')
    check(config == 1, f"vllm:cache_config_info: {config}")

    # The other routes still serve beside the language model.
    status, _, _ = raw(port, "GET", "/v2/models/identity/ready")
    check(status == 200, f"identity ready: {status}")


def render(client, port, messages, chat, reply, chat_ids, completion):
    """vLLM's render routes: the prompt's token ids a router would hash, the same as /tokenize's and
    as the generating routes' usage counts, and what generates the same text given back as ids."""
    status, _, body = raw(port, "POST", "/v1/chat/completions/render", {
        "model": "tiny_llm", "messages": messages, "max_tokens": 12, "temperature": 0,
        "seed": 7, "stop": ["zz"]})
    rendered = json.loads(body)
    check(status == 200 and rendered["token_ids"] == chat_ids and
          len(chat_ids) == chat.usage.prompt_tokens, f"chat render: {status} {body}")
    params = rendered["sampling_params"]
    check(rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == "tiny_llm" and
          rendered["stream"] is False and params["max_tokens"] == 12 and
          params["temperature"] == 0 and params["seed"] == 7 and params["stop"] == ["zz"],
          f"chat render: {rendered}")
    # The rendered ids, given back as a prompt, generate the chat's greedy reply.
    again = client.completions.create(model="tiny_llm", prompt=rendered["token_ids"], max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    check(again.choices[0].text == reply, f"{again.choices[0].text!r} != {reply!r}")
    status, _, body = raw(port, "POST", "/v1/completions/render",
                          {"model": "tiny_llm", "prompt": "the quick brown fox"})
    rendered = json.loads(body)
    check(status == 200 and isinstance(rendered, list) and len(rendered) == 1 and
          len(rendered[0]["token_ids"]) == completion.usage.prompt_tokens and
          rendered[0]["request_id"].startswith("cmpl-"), f"completion render: {status} {body}")
    # No max_tokens: what the request would run with (the rest of the 256-token context, or
    # the model's default where that is less).
    check(0 < rendered[0]["sampling_params"]["max_tokens"] <= 256 - completion.usage.prompt_tokens,
          f"completion render max_tokens: {rendered}")
    # Refused as the generating routes refuse.
    for path, bad, param, code in [
            ("/v1/chat/completions/render", {"messages": messages, "max_tokens": 1000}, "messages",
             400),
            ("/v1/chat/completions/render", {"messages": messages, "best_of": 2}, "best_of", 400),
            ("/v1/completions/render", {"model": "no_such_model", "prompt": "x"}, "model", 404),
            ("/v1/completions/render", {"prompt": [1, 100000]}, "prompt", 400)]:
        status, _, body = raw(port, "POST", path, bad)
        error = json.loads(body)["error"]
        check(status == code and error["param"] == param and error["message"],
              f"{path} {bad}: {status} {error}")


def choices_and_logprobs(client, messages):
    """n choices (seeded: the same n texts again), and log-probabilities in both routes' shapes."""
    sampled = [client.chat.completions.create(
        model="tiny_llm", messages=messages, max_tokens=10, temperature=1.0, seed=7, n=3,
        extra_body={"ignore_eos": True}) for _ in range(2)]
    texts = [[c.message.content for c in r.choices] for r in sampled]
    check([c.index for c in sampled[0].choices] == [0, 1, 2], f"indices: {sampled[0].choices}")
    check(texts[0] == texts[1] and len(set(texts[0])) > 1, f"seeded n=3: {texts}")
    check(sampled[0].usage.completion_tokens == 30, f"usage of 3 choices: {sampled[0].usage}")
    streamed = {}
    for chunk in client.chat.completions.create(
            model="tiny_llm", messages=messages, max_tokens=10, temperature=1.0, seed=7, n=3,
            stream=True, extra_body={"ignore_eos": True}):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    check([streamed[i] for i in range(3)] == texts[0], f"streamed n=3: {streamed} vs {texts[0]}")

    # Greedy: the chosen token is the most likely one; the top list is sorted; probabilities <= 1.
    chat = client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    check(len(content) == 6, f"one entry per token: {content}")
    check("".join(t.token for t in content) == chat.choices[0].message.content,
          f"tokens spell the reply: {content}")
    for t in content:
        tops = [a.logprob for a in t.top_logprobs]
        check(len(tops) == 3 and tops == sorted(tops, reverse=True), f"top_logprobs: {t}")
        check(t.top_logprobs[0].token == t.token and abs(tops[0] - t.logprob) < 1e-6,
              f"greedy takes the top token: {t}")
        check(sum(math.exp(x) for x in tops) <= 1 + 1e-5 and bytes(t.bytes) == t.token.encode(),
              f"probabilities and bytes: {t}")
    plain = client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=6,
                                           temperature=0, extra_body={"ignore_eos": True})
    check(plain.choices[0].logprobs is None and
          plain.choices[0].message.content == chat.choices[0].message.content,
          f"logprobs change nothing else: {plain}")
    completion = client.completions.create(model="tiny_llm", prompt="the quick brown fox",
                                           max_tokens=5, temperature=0, logprobs=2,
                                           extra_body={"ignore_eos": True})
    lp = completion.choices[0].logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5 and
          "".join(lp.tokens) == completion.choices[0].text, f"completion logprobs: {lp}")
    check(lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(5)],
          f"text_offset: {lp.text_offset}")
    check(all(len(top) == 2 and abs(max(top.values()) - token_lp) < 1e-6
              for top, token_lp in zip(lp.top_logprobs, lp.token_logprobs)), f"top: {lp}")


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    age: int = pydantic.Field(ge=0, le=99)
    colour: typing.Literal["red", "green", "blue"]


def structured_outputs(client, port, messages):
    """response_format through the SDK: its parse() helper with a pydantic model (a strict JSON
    schema), 100 sampled choices at temperature 1 that all parse and validate, streamed too; JSON
    mode; the (untrained) tiny model would write neither on its own."""
    parsed = client.chat.completions.parse(model="tiny_llm", messages=messages, max_tokens=150,
                                           temperature=1.0, seed=3, n=100, response_format=Person)
    check(len(parsed.choices) == 100, f"n=100: {len(parsed.choices)}")
    schema = Person.model_json_schema()
    for choice in parsed.choices:
        check(choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person),
              f"a choice that is not a Person: {choice}")
        jsonschema.validate(json.loads(choice.message.content), schema)
    check(len({c.message.content for c in parsed.choices}) > 50, "100 samples, few distinct")

    response_format = {"type": "json_schema",
                       "json_schema": {"name": "person", "schema": schema, "strict": True}}
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny_llm", messages=messages, max_tokens=150, temperature=1.0, seed=5, stream=True,
        response_format=response_format) if c.choices)
    jsonschema.validate(json.loads(text), schema)

    # A client that leaves while its schema compiles (off the I/O threads) frees everything. Its
    # slot may be taken only after the first look (the compile ends later), so the check waits
    # for the server to have counted the client gone, then for the slot to be free.
    gone = clients_gone(port)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    fresh = dict(schema, properties={**schema["properties"], "extra": {"type": "boolean"}})
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "model": "tiny_llm", "messages": messages, "max_tokens": 150, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": fresh}}}),
        {"Content-Type": "application/json", "X-API-Key": API_KEY})
    conn.sock.close()
    conn.close()
    deadline = time.time() + 10
    while clients_gone(port) == gone and time.time() < deadline:
        time.sleep(0.05)
    check(clients_gone(port) == gone + 1, "the client that left was not counted as gone (499)")
    while metric(port, "sluice_llm_slots_busy") != 0 and time.time() < deadline:
        time.sleep(0.05)
    check(metric(port, "sluice_llm_slots_busy") == 0, "a slot stayed busy after the disconnect")

    completion = client.completions.create(model="tiny_llm", prompt="a JSON object:", n=20,
                                           max_tokens=200, temperature=1.0, seed=9,
                                           extra_body={"response_format": {"type": "json_object"}})
    stopped = [c.text for c in completion.choices if c.finish_reason == "stop"]
    check(len(stopped) >= 5, f"JSON mode: {len(stopped)} of 20 ended within 200 tokens")
    for text in stopped:
        check(isinstance(json.loads(text), dict), f"JSON mode gave {text!r}")
    check(all(c.text.lstrip().startswith("{") for c in completion.choices),
          f"JSON mode: {completion.choices}")


def bench(sluice, port):
    """`sluice bench --llm` against this server: every request streamed to the end, token counts
    from the usage chunks, prompts sized by the server's own count, result files written."""
    with tempfile.TemporaryDirectory() as results:
        out = subprocess.run(
            [sluice, "bench", "--llm", "--url", f"http://127.0.0.1:{port}", "--api-key", API_KEY,
             "--concurrency", "1,3", "--rate", "20", "--requests", "4", "--prompt-tokens", "40",
             "--shared-prefix-tokens", "20", "--output-tokens", "6", "--results-dir", results],
            capture_output=True, text=True, timeout=300)
        check(out.returncode == 0, f"bench failed: {out.stdout} {out.stderr}")
        runs = os.listdir(results)
        check(len(runs) == 1, f"result directories: {runs}")
        run_dir = os.path.join(results, runs[0])
        for name in ["run.json", "summary.json", "summary.csv", "requests-c1.csv",
                     "requests-c3.csv", "requests-r20.csv", "output_tokens.svg", "ttft.svg",
                     "tpot.svg"]:
            check(os.path.exists(os.path.join(run_dir, name)), f"{name} missing")
        with open(os.path.join(run_dir, "summary.json")) as f:
            levels = json.load(f)["levels"]
        check([(l["concurrency"], l["rate"]) for l in levels] == [(1, 0), (3, 0), (0, 20)],
              f"levels: {levels}")
        for level in levels:
            check(level["ok"] == 4 == level["requests"], f"level {level}")
            check(level["completion_tokens"] == 4 * 6, f"completion tokens: {level}")
            # Sized on one probe prompt; the others' random words tokenise a little longer or
            # shorter in the tiny model's 384-token vocabulary.
            check(abs(level["prompt_tokens"] / 4 - 40) <= 5, f"prompt tokens: {level}")
            check(0 < level["ttft"]["median_ms"] <= level["e2el"]["median_ms"], f"times: {level}")
            check(level["tpot"]["median_ms"] > 0 and level["output_tokens_per_second"] > 0,
                  f"rates: {level}")
            # A ~20-token preamble of 40-token prompts (and "Request" after it) found cached in
            # all but the first request of a level; each request's own words are not.
            check(0.3 <= level["prefix_hit_rate"] <= 0.9, f"prefix hit rate: {level}")
        check("TTFT p50" in out.stdout and "prefix hit" in out.stdout, out.stdout)

        # Conversations of 3 turns: each later turn resends the history, which it finds cached.
        out = subprocess.run(
            [sluice, "bench", "--llm", "--url", f"http://127.0.0.1:{port}", "--api-key", API_KEY,
             "--concurrency", "2", "--requests", "6", "--turns", "3", "--prompt-tokens", "30",
             "--output-tokens", "5", "--results-dir", results],
            capture_output=True, text=True, timeout=300)
        check(out.returncode == 0, f"multi-turn bench failed: {out.stdout} {out.stderr}")
        runs = sorted(os.listdir(results))
        with open(os.path.join(results, runs[-1], "summary.json")) as f:
            level = json.load(f)["levels"][0]
        # 2 conversations x 3 turns; later turns' prompts grow by an answer and a message and
        # find the full 16-token blocks of the turn before cached.
        check(level["ok"] == 6 and level["completion_tokens"] == 30, f"multi-turn: {level}")
        check(level["prompt_tokens"] > 6 * 30 and level["prefix_hit_rate"] > 0.15,
              f"multi-turn prompts and hits: {level}")


if __name__ == "__main__":
    main()
