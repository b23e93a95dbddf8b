#!/usr/bin/env python3
"""Embedding models: Sluice against llama.cpp's llama-server and sentence-transformers, on the same
model, the same texts, in interleaved rounds.

The model: all-MiniLM-L6-v2's shape (BERT, 6 layers, 384 wide, 12 heads, 1,536 in the
feed-forward, 512 positions; mean pooling and Normalize, sentence-transformers' modules), random
weights, a WordPiece vocabulary trained here (tools/encoder_models.py's trainer), saved by
sentence-transformers and converted to GGUF F16 by llama.cpp's converter: what users run for RAG.

Servers on 127.0.0.1, each given every core:
  sluice   `sluice serve` on the GGUF F16 file (bf16 weights) and on the folder (bf16)
  llama    `llama-server --embedding --pooling mean -np 4` on the GGUF F16 file, batches of 8,192
  st       sentence-transformers' encode in this process (PyTorch fp32, batch 32): no HTTP at all
Each round sends the same texts as /v1/embeddings requests of --batch inputs from --clients
clients at once; throughput is texts per second over the round, the medians of the rounds
printed. The vectors each server returns are checked against sentence-transformers' (cosine).
Every process started is stopped by its PID.

Usage: benchmarks/embedding_peers.py [--sluice build/sluice] [--llama-server PATH]
           [--texts 512] [--batch 32] [--clients 1,4] [--rounds 3] [--words 60]
"""
import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
from llm_side_by_side import Server, free_port, post_json, rss_mib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the server answers every request quickly while the batch grows and the model reads "
         "documents about retrieval search ranking vectors memory bandwidth latency throughput "
         "queries passages chunks tokens caches engines clients benchmarks").split()


def write_model(folder, strings):
    from encoder_models import convert, train_wordpiece
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import BertConfig, BertModel
    tokenizer = train_wordpiece(strings, True, folder)
    torch.manual_seed(7)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=384, num_hidden_layers=6,
                        num_attention_heads=12, intermediate_size=1536,
                        max_position_embeddings=512, type_vocab_size=2)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformer = Transformer(folder, max_seq_length=512)
    SentenceTransformer(modules=[transformer, Pooling(384, pooling_mode="mean"), Normalize()],
                        device="cpu").save(folder)
    gguf_dir = folder + "_gguf"
    convert(folder, os.path.join(gguf_dir, "model.gguf"), outtype="f16")
    return gguf_dir


def run_round(port, texts, batch, clients, model):
    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(
            lambda chunk: post_json(port, "/v1/embeddings", {"model": model, "input": chunk}),
            chunks))
    seconds = time.perf_counter() - start
    vectors = [d["embedding"] for reply in replies for d in reply["data"]]
    return len(texts) / seconds, vectors


def cosine_floor(vectors, reference):
    a = numpy.asarray(vectors, dtype=numpy.float64)
    b = numpy.asarray(reference, dtype=numpy.float64)
    cos = (a * b).sum(1) / (numpy.linalg.norm(a, axis=1) * numpy.linalg.norm(b, axis=1))
    return float(cos.min())


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    parser.add_argument("--llama-server", default=os.path.join(
        ROOT, "build", "peers", "llama.cpp", "build", "bin", "llama-server"))
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--clients", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=60, help="words per text (about 1.3 tokens each)")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    rng = random.Random(3)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(args.words // 2, args.words)))
             for _ in range(args.texts)]
    strings = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(3000)]
    processes = []
    with tempfile.TemporaryDirectory() as work:
        folder = os.path.join(work, "minilm")
        gguf_dir = write_model(folder, strings)
        st = SentenceTransformer(folder, device="cpu")
        reference = st.encode(texts, batch_size=args.batch, convert_to_numpy=True)
        tokens = sum(len(st.tokenizer(t).input_ids) for t in texts)
        log = open(os.path.join(work, "servers.log"), "w")
        servers = {}
        try:
            for name, source in (("sluice_gguf", os.path.join(gguf_dir, "model.gguf")),
                                 ("sluice_folder", folder)):
                port = free_port()
                servers[name] = Server(name, [args.sluice, "serve", source, "--port", str(port),
                                              "--llm-slots", "64"],
                                       "/v1/models", port, log)
                processes.append(servers[name])
            port = free_port()
            servers["llama"] = Server("llama", [
                args.llama_server, "-m", os.path.join(gguf_dir, "model.gguf"), "--embedding",
                "--pooling", "mean", "-np", "4", "-c", "8192", "-b", "8192", "-ub", "8192",
                "-t", str(threads), "--port", str(port), "--host", "127.0.0.1"], "/health",
                port, log)
            processes.append(servers["llama"])
            results = {}
            floors = {}
            order = list(servers) + ["st"]
            for clients in [int(c) for c in args.clients.split(",")]:
                for r in range(args.rounds):
                    for name in (order if r % 2 == 0 else order[::-1]):
                        if name == "st":
                            if clients != 1:
                                continue
                            start = time.perf_counter()
                            st.encode(texts, batch_size=args.batch, convert_to_numpy=True)
                            rate = len(texts) / (time.perf_counter() - start)
                        else:
                            server = servers[name]
                            model = "model" if name != "sluice_folder" else "minilm"
                            rate, vectors = run_round(server.port, texts, args.batch, clients,
                                                      model)
                            floors[name] = cosine_floor(vectors, reference)
                        results.setdefault((name, clients), []).append(rate)
            print(f"{len(texts)} texts, {tokens} tokens ({tokens / len(texts):.0f} a text), "
                  f"requests of {args.batch}, {threads} threads; texts/s, median of "
                  f"{args.rounds} interleaved rounds")
            for (name, clients), rates in results.items():
                print(f"  {name:14s} clients {clients}: {statistics.median(rates):8.1f} texts/s "
                      f"({', '.join(f'{x:.1f}' for x in rates)})")
            for name, server in servers.items():
                print(f"  {name:14s} RSS {rss_mib(server.process.pid):.0f} MiB, lowest cosine "
                      f"against sentence-transformers {floors.get(name, float('nan')):.6f}")
        finally:
            for server in processes:
                server.stop()
            log.close()


if __name__ == "__main__":
    main()
