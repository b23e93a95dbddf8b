#!/usr/bin/env python3
"""Encoder models through the real `sluice serve`: BERT, RoBERTa, DistilBERT, XLM-RoBERTa and
nomic-bert embedding models as sentence-transformers saves them and as llama.cpp's converter writes
them, at /v1/embeddings through the OpenAI Python SDK, checked against sentence-transformers' own
vectors (tools/encoder_models.py); cross-encoders (BERT's, RoBERTa's, DistilBERT's, and
XLM-RoBERTa's as bge-reranker is) at
/v1/rerank (and /rerank, /v2/rerank: the Jina/Cohere shape llama.cpp and vLLM serve), its
relevance scores checked against sentence-transformers' CrossEncoder.predict; batching; the
refusals, each naming its parameter.

Usage: tests/encoder_serving_test.py SLUICE TEST_MODELS
"""
import json
import os
import re
import sys
import tempfile

import numpy
import openai

from openai_api_test import check, raw
from sluice_server import serving


def cosine(a, b):
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    return float(a @ b / (numpy.linalg.norm(a) * numpy.linalg.norm(b)))


def served_copy(source, repository, name, config):
    """`source` under `name` in the repository (its files linked), with `config` as config.yaml."""
    folder = os.path.join(repository, name)
    os.makedirs(folder)
    for entry in os.listdir(source):
        os.symlink(os.path.join(source, entry), os.path.join(folder, entry))
    with open(os.path.join(folder, "config.yaml"), "w") as f:
        f.write(config)


def steps(port, model):
    _, _, body = raw(port, "GET", "/metrics", key=None)
    match = re.search(rf'^sluice_llm_steps_total{{model="{model}"}} (\S+)$', body.decode(), re.M)
    return float(match.group(1)) if match else 0.0


def embeddings(port, client, encoders):
    for name, normalized in [("minilm", True), ("bge_gguf", True), ("cls_fp32", False),
                             ("e5", True), ("e5_gguf", True), ("nomic", True),
                             ("nomic_gguf", True), ("distilroberta", True),
                             ("distilroberta_gguf", True), ("msmarco_distilbert", True)]:
        source = {"minilm": "hf_bert_mean", "bge_gguf": "gguf_bert_cls_f32",
                  "cls_fp32": "hf_bert_cls", "e5": "hf_xlmr_mean",
                  "e5_gguf": "gguf_xlmr_mean_f32", "nomic": "hf_nomic_hub",
                  "nomic_gguf": "gguf_nomic_mean_f32", "distilroberta": "hf_roberta_mean",
                  "distilroberta_gguf": "gguf_roberta_mean_f32",
                  "msmarco_distilbert": "hf_distilbert_mean"}[name]
        reference = json.load(open(os.path.join(encoders, source, "reference.json")))
        reply = client.embeddings.create(model=name, input=reference["texts"])
        check(len(reply.data) == len(reference["texts"]), f"{name}: {len(reply.data)} vectors")
        lowest = 1.0
        for d, expected in zip(reply.data, reference["embeddings"]):
            similarity = cosine(d.embedding, expected)
            lowest = min(lowest, similarity)
            check(similarity >= 0.9999, f"{name}: cosine {similarity} against sentence-transformers")
            if normalized:
                check(abs(numpy.linalg.norm(d.embedding) - 1) < 1e-4, f"{name}: not unit length")
        print(f"{name}: lowest cosine against sentence-transformers {lowest:.7f}")
    # 48 inputs are batched into a few steps, not one each.
    before = steps(port, "minilm")
    many = client.embeddings.create(model="minilm", input=[f"text number {i}" for i in range(48)])
    check(len(many.data) == 48, f"{len(many.data)} of 48")
    taken = steps(port, "minilm") - before
    check(taken <= 12, f"{taken} steps for 48 inputs")
    print(f"minilm: 48 inputs in {taken:.0f} steps")


def rerank_matches(port, model, reference):
    """/v1/rerank's scores for `model` equal CrossEncoder.predict's, highest first."""
    body = {"model": model, "query": reference["query"], "documents": reference["documents"]}
    status, _, data = raw(port, "POST", "/v1/rerank", body, key=None)
    check(status == 200, f"{model}: {status} {data[:300]}")
    results = json.loads(data)["results"]
    scores = [r["relevance_score"] for r in results]
    check(scores == sorted(scores, reverse=True), f"{model}: not highest first: {scores}")
    for r in results:
        expected = reference["scores"][r["index"]]
        check(abs(r["relevance_score"] - expected) < 1e-5,
              f"{model}: document {r['index']}: {r['relevance_score']} against {expected}")
    print(f"{model}: scores {[round(s, 6) for s in scores]} as CrossEncoder.predict's")


def rerank(port, encoders):
    # XLM-RoBERTa's cross-encoder (bge-reranker-v2-m3's class), from its folder and its GGUF file.
    xlmr = json.load(open(os.path.join(encoders, "hf_xlmr_rerank", "reference.json")))
    rerank_matches(port, "bge_reranker", xlmr)
    rerank_matches(port, "bge_reranker_gguf", xlmr)
    # RoBERTa's (stsb-roberta's class) from its folder and GGUF file; DistilBERT's from its folder.
    roberta = json.load(open(os.path.join(encoders, "hf_roberta_rerank", "reference.json")))
    rerank_matches(port, "roberta_reranker", roberta)
    rerank_matches(port, "roberta_reranker_gguf", roberta)
    rerank_matches(port, "distilbert_reranker",
                   json.load(open(os.path.join(encoders, "hf_distilbert_rerank",
                                               "reference.json"))))
    reference = json.load(open(os.path.join(encoders, "hf_bert_rerank", "reference.json")))
    body = {"model": "reranker", "query": reference["query"], "documents": reference["documents"]}
    status, _, data = raw(port, "POST", "/v1/rerank", body, key=None)
    check(status == 200, f"rerank: {status} {data[:300]}")
    reply = json.loads(data)
    results = reply["results"]
    check(len(results) == len(reference["documents"]), f"rerank: {results}")
    scores = [r["relevance_score"] for r in results]
    check(scores == sorted(scores, reverse=True), f"rerank: not highest first: {scores}")
    for r in results:
        expected = reference["scores"][r["index"]]
        check(abs(r["relevance_score"] - expected) < 1e-5,
              f"rerank: document {r['index']}: {r['relevance_score']} against {expected}")
    check(reply["usage"]["total_tokens"] > 0, f"rerank: usage {reply.get('usage')}")
    print(f"reranker: scores {[round(s, 6) for s in scores]} as CrossEncoder.predict's")
    # top_n, documents as objects and returned, the other paths.
    for path in ("/rerank", "/v2/rerank"):
        status, _, data = raw(port, "POST", path, {
            "model": "reranker", "query": reference["query"], "top_n": 2, "return_documents": True,
            "documents": [{"text": d} for d in reference["documents"]]}, key=None)
        check(status == 200, f"{path}: {status} {data[:300]}")
        top = json.loads(data)["results"]
        check([r["index"] for r in top] == [r["index"] for r in results[:2]], f"{path}: {top}")
        check(all(r["document"]["text"] == reference["documents"][r["index"]] for r in top),
              f"{path}: documents {top}")
    # The GGUF reranker answers too (llama.cpp's converter dropped its pooler: other scores).
    status, _, data = raw(port, "POST", "/v1/rerank", {**body, "model": "reranker_gguf"}, key=None)
    check(status == 200 and len(json.loads(data)["results"]) == 4, f"gguf: {status} {data[:200]}")
    # Refusals, each naming its parameter.
    for request, path, param in [
            ({"model": "minilm", "query": "q", "documents": ["d"]}, "/v1/rerank", "model"),
            ({"model": "reranker", "input": "x"}, "/v1/embeddings", "model"),
            ({"model": "reranker", "documents": ["d"]}, "/v1/rerank", "query"),
            ({"model": "reranker", "query": "q", "documents": []}, "/v1/rerank", "documents"),
            ({"model": "reranker", "query": "q", "documents": [3]}, "/v1/rerank", "documents"),
            ({"model": "reranker", "query": "q", "documents": ["d"], "max_chunks_per_doc": 2},
             "/v1/rerank", "max_chunks_per_doc"),
            ({"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0}, "/v1/rerank",
             "top_n"),
            ({"model": "reranker", "query": "q", "documents": ["word " * 200]}, "/v1/rerank",
             "documents")]:
        status, _, data = raw(port, "POST", path, request, key=None)
        error = json.loads(data).get("error", {})
        check(status == 400 and error.get("param") == param,
              f"{path} {list(request)}: {status} {data[:300]}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    encoders = os.path.join(test_models, "encoders")
    fp32 = "llm:\n  precision: fp32\n"
    with tempfile.TemporaryDirectory() as repository:
        served_copy(os.path.join(encoders, "hf_bert_mean"), repository, "minilm",
                    fp32 + "  slots: 16\n")
        served_copy(os.path.join(encoders, "gguf_bert_cls_f32"), repository, "bge_gguf", fp32)
        served_copy(os.path.join(encoders, "hf_bert_cls"), repository, "cls_fp32", fp32)
        served_copy(os.path.join(encoders, "hf_bert_rerank"), repository, "reranker", fp32)
        served_copy(os.path.join(encoders, "gguf_bert_rerank_f32"), repository, "reranker_gguf",
                    fp32)
        served_copy(os.path.join(encoders, "hf_nomic_hub"), repository, "nomic", fp32)
        served_copy(os.path.join(encoders, "gguf_nomic_mean_f32"), repository, "nomic_gguf", fp32)
        served_copy(os.path.join(encoders, "hf_xlmr_mean"), repository, "e5", fp32)
        served_copy(os.path.join(encoders, "gguf_xlmr_mean_f32"), repository, "e5_gguf", fp32)
        served_copy(os.path.join(encoders, "hf_xlmr_rerank"), repository, "bge_reranker", fp32)
        served_copy(os.path.join(encoders, "gguf_xlmr_rerank_f32"), repository,
                    "bge_reranker_gguf", fp32)
        for source, name in [("hf_roberta_mean", "distilroberta"),
                             ("gguf_roberta_mean_f32", "distilroberta_gguf"),
                             ("hf_distilbert_mean", "msmarco_distilbert"),
                             ("hf_roberta_rerank", "roberta_reranker"),
                             ("gguf_roberta_rerank_f32", "roberta_reranker_gguf"),
                             ("hf_distilbert_rerank", "distilbert_reranker")]:
            served_copy(os.path.join(encoders, source), repository, name, fp32)
        with serving(sluice, ["--model-repository", repository, "--llm-threads", "1"]) as port:
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused") as client:
                embeddings(port, client, encoders)
            rerank(port, encoders)
    print("encoder_serving_test: all checks passed")


if __name__ == "__main__":
    main()
