#!/usr/bin/env python3
"""POST /v1/embeddings of the real `sluice serve`, through the OpenAI Python SDK (which asks for
base64) and raw HTTP (floats): the tiny test model served as an embedding model with last, mean
and cls pooling, each checked against transformers' LlamaModel on the same weights and token ids
(cosine >= 0.999); inputs as strings, token ids and lists of either; usage; the refusals
(dimensions, a generating model, generation on an embedding model, an encoder-only model of a
type not served).

Usage: tests/openai_embeddings_test.py SLUICE TEST_MODELS
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy
import openai
import torch
import transformers

from openai_api_test import check, raw
from sluice_server import serving, templated_model

CONFIG = """llm:
  precision: fp32
  context_length: 256
  embedding: {{pooling: {pooling}, normalize: {normalize}}}
"""
# The last is longer than the test model's prefill chunk (16 tokens): pooled over several steps.
TEXTS = ["hello world", "the quick brown fox jumps", "a",
         "serving models, batch by batch and token by token, with one engine for every request"]


def reference(model, ids, pooling, normalize):
    """transformers' final hidden states (after the last norm), pooled as Sluice pools them."""
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0].double()
    vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling]
    if normalize:
        vector = vector / vector.norm()
    return vector.numpy()


def cosine(a, b):
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    return float(a @ b / (numpy.linalg.norm(a) * numpy.linalg.norm(b)))


def metric(port, name, model):
    _, _, body = raw(port, "GET", "/metrics", key=None)
    match = re.search(rf'^{name}{{model="{model}"}} (\S+)$', body.decode(), re.M)
    return float(match.group(1)) if match else 0.0


def checks(port, client, test_models):
    model = transformers.AutoModel.from_pretrained(os.path.join(test_models, "tiny_llm"),
                                                   dtype=torch.float32).eval()
    for name, pooling, normalize in [("e_last", "last", True), ("e_mean", "mean", True),
                                     ("e_cls", "cls", False)]:
        ids = [json.loads(raw(port, "POST", "/tokenize", {"model": name, "prompt": t},
                              key=None)[2])["tokens"] for t in TEXTS]
        # The SDK asks for base64 and decodes it.
        reply = client.embeddings.create(model=name, input=TEXTS)
        check([d.index for d in reply.data] == list(range(len(TEXTS))), f"{name}: {reply.data}")
        check(reply.usage.prompt_tokens == sum(map(len, ids)) == reply.usage.total_tokens,
              f"{name}: usage {reply.usage}")
        check(max(map(len, ids)) > 16, f"no input spans several steps: {list(map(len, ids))}")
        lowest = 1.0
        for d, token_ids in zip(reply.data, ids):
            expected = reference(model, token_ids, pooling, normalize)
            check(len(d.embedding) == 64, f"{name}: {len(d.embedding)} dimensions")
            similarity = cosine(d.embedding, expected)
            check(similarity >= 0.999, f"{name}: cosine {similarity} against transformers")
            lowest = min(lowest, similarity)
            if normalize:
                check(abs(numpy.linalg.norm(d.embedding) - 1) < 1e-4, f"{name}: not unit length")
        print(f"{name}: lowest cosine against transformers {lowest:.7f}")
        # Inputs are batched into the engine's steps, not run one at a time: 16 short ones
        # (a few tokens each, 16 prompt tokens a step) take a few steps.
        steps = metric(port, "sluice_llm_steps_total", name)
        many = client.embeddings.create(model=name, input=[f"w{i}" for i in range(16)])
        check(len(many.data) == 16, f"{name}: {len(many.data)} of 16")
        taken = metric(port, "sluice_llm_steps_total", name) - steps
        check(taken < 16, f"{name}: {taken} steps for 16 inputs")
        # Floats, and token ids as input, give the same vectors.
        status, _, body = raw(port, "POST", "/v1/embeddings",
                              {"model": name, "input": ids, "encoding_format": "float"}, key=None)
        check(status == 200, f"{name}: {status} {body[:200]}")
        floats = json.loads(body)["data"]
        for d, f in zip(reply.data, floats):
            check(cosine(d.embedding, f["embedding"]) > 0.99999, f"{name}: float against base64")
        single = client.embeddings.create(model=name, input=ids[1], encoding_format="float")
        check(cosine(single.data[0].embedding, reply.data[1].embedding) > 0.99999,
              f"{name}: one token list")

    # Refusals, each naming its parameter.
    for body, param in [
            ({"model": "e_last", "input": "x", "dimensions": 32}, "dimensions"),
            ({"model": "e_last", "input": []}, "input"),
            ({"model": "e_last", "input": [1, "a"]}, "input"),
            ({"model": "e_last", "input": [[1, 2], [99999]]}, "input"),
            ({"model": "e_last", "input": "x", "encoding_format": "int8"}, "encoding_format"),
            ({"model": "e_last", "input": "x", "truncate": True}, "truncate"),
            ({"model": "tiny_llm", "input": "x"}, "model")]:
        status, _, data = raw(port, "POST", "/v1/embeddings", body, key=None)
        error = json.loads(data).get("error", {})
        check(status == 400 and error.get("param") == param, f"{body}: {status} {data[:300]}")
    status, _, data = raw(port, "POST", "/v1/embeddings",
                          {"model": "e_last", "input": "x", "dimensions": 64}, key=None)
    check(status == 200, f"dimensions equal to the model's: {status}")
    status, _, data = raw(port, "POST", "/v1/chat/completions",
                          {"model": "e_last", "messages": [{"role": "user", "content": "x"}]},
                          key=None)
    check(status == 400 and json.loads(data)["error"]["param"] == "model",
          f"chat on an embedding model: {status} {data[:200]}")


def encoder_only(sluice):
    """An encoder-only model of a type not served (BERT's, RoBERTa's, DistilBERT's are:
    encoder_serving_test.py) is refused at load, by name."""
    with tempfile.TemporaryDirectory() as modernbert:
        with open(os.path.join(modernbert, "config.json"), "w") as f:
            json.dump({"architectures": ["ModernBertModel"], "model_type": "modernbert",
                       "hidden_size": 8}, f)
        open(os.path.join(modernbert, "model.safetensors"), "wb").close()
        result = subprocess.run([sluice, "serve", "--port", "0", "--model-dir", modernbert],
                                capture_output=True, text=True, timeout=60)
        output = result.stdout + result.stderr
        check(result.returncode != 0 and "encoder-only" in output and "'modernbert'" in output,
              f"modernbert: {output}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    template = open(os.path.join(test_models, "tiny_llm", "chat_template.jinja")).read()
    with tempfile.TemporaryDirectory() as repository:
        os.symlink(os.path.join(test_models, "tiny_llm"), os.path.join(repository, "tiny_llm"))
        with templated_model(test_models, template, CONFIG.format(pooling="last", normalize="true")) as a, \
                templated_model(test_models, template, CONFIG.format(pooling="mean", normalize="true")) as b, \
                templated_model(test_models, template, CONFIG.format(pooling="cls", normalize="false")) as c:
            for name, path in [("e_last", a), ("e_mean", b), ("e_cls", c)]:
                os.symlink(path, os.path.join(repository, name))
            with serving(sluice, ["--model-repository", repository, "--llm-threads", "1"]) as port:
                with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused") as client:
                    checks(port, client, test_models)
    encoder_only(sluice)
    print("openai_embeddings_test: all checks passed")


if __name__ == "__main__":
    main()
