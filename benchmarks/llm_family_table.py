#!/usr/bin/env python3
"""Every model family Sluice serves, in each form people bring it, against transformers: the
Hugging Face folder saved by save_pretrained, the same saved sharded, and a GGUF Q4_K_M file
quantised by llama.cpp's own quantiser, all served by `sluice serve` on 127.0.0.1.

The models are the test models (make models): converted/hf_<family>[_sharded] (random weights
from transformers' own class; their reference.safetensors holds transformers' fp32 logits and
greedy continuations) and gguf_<family>_q4_k_m (tools/gguf_models.py: another random model of
the family, written as F32 GGUF and quantised by llama.cpp; transformers' side is that model made
again from its seed). For each prompt, Sluice's greedy continuation through /v1/completions
(prompt as token ids, temperature 0, logprobs 5): the largest difference of the first step's
top-5 logprobs from transformers' (log-softmax of its logits), and how many leading greedy tokens
agree (compared by their text). The folders are served at --llm-precision fp32; the Q4_K_M file as
it is (its products quantise activations to 8 bits, as llama.cpp's do), so its column carries the
quantisation's own error: the last column is llama.cpp's own distance from transformers on the
same file (its logits and greedy tokens in the file's reference.safetensors), measured the same
way.

Usage: benchmarks/llm_family_table.py [--models build/test-models] [--sluice build/sluice]
           [--tokens 16] [--out results/llm-family-table.md]
"""
import argparse
import json
import os
import sys
import time
import urllib.request

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from llm_side_by_side import Server, free_port, post_json  # noqa: E402


def serve(args, path, precision, log):
    port = free_port()
    command = [args.sluice, "serve", path, "--port", str(port), "--llm-prefix-caching", "off"]
    if precision:
        command += ["--llm-precision", precision]
    server = Server(f"sluice {path}", command, "/v2/health/ready", port, log)
    server.model = json.loads(urllib.request.urlopen(
        f"http://127.0.0.1:{port}/v1/models").read())["data"][0]["id"]
    return server


def sluice_runs(server, prompts, tokens):
    """Per prompt: the greedy tokens' texts and the first step's top-5 logprobs (sorted)."""
    out = []
    for ids in prompts:
        reply = post_json(server.port, "/v1/completions",
                          {"model": server.model, "prompt": ids, "max_tokens": tokens,
                           "temperature": 0, "logprobs": 5, "ignore_eos": True})
        logprobs = reply["choices"][0]["logprobs"]
        out.append((logprobs["tokens"], sorted(logprobs["top_logprobs"][0].values(),
                                               reverse=True)))
    return out


def reference_runs(tokenizer, prompts, first_logits, greedy):
    """transformers' side in the same form: its greedy tokens' texts and the first step's
    top-5 logprobs."""
    out = []
    for ids, logits, continuation in zip(prompts, first_logits, greedy):
        top = torch.log_softmax(logits.float(), dim=-1).topk(5).values.tolist()
        out.append(([tokenizer.decode([t]) for t in continuation], top))
    return out


def comparable(token):
    """A token's text as both sides can name it: a piece of a character (Sluice names its bytes,
    "bytes:\\xc3", as OpenAI's logprobs do; transformers' decode gives U+FFFD) as one mark."""
    return "<bytes>" if token.startswith("bytes:") or "\ufffd" in token else token


def agreement(ours, theirs):
    """(largest |top-5 logprob difference| at the first step, leading greedy tokens equal,
    tokens compared), over the prompts."""
    delta, agree, total = 0.0, 0, 0
    for (tokens, top), (their_tokens, their_top) in zip(ours, theirs):
        delta = max(delta, max(abs(a - b) for a, b in zip(top, their_top)))
        n = 0
        while n < min(len(tokens), len(their_tokens)) and \
                comparable(tokens[n]) == comparable(their_tokens[n]):
            n += 1
        agree += n
        total += min(len(tokens), len(their_tokens))
    return delta, agree, total


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="build/test-models")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", default="results/llm-family-table.md")
    args = parser.parse_args()
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    import gguf_models
    transformers.utils.logging.set_verbosity_error()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    log = open(os.path.splitext(args.out)[0] + ".log", "w")
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.join(args.models, gguf_models.TINY_TOKENIZER_DIR))
    rows = []
    start = time.time()
    for i, arch in enumerate(gguf_models.ARCHITECTURES):
        family = arch
        row = [family]
        # The folders: transformers' logits and greedy tokens from reference.safetensors.
        for name in (f"hf_{family}", f"hf_{family}_sharded"):
            folder = os.path.join(args.models, "converted", name)
            reference = load_file(os.path.join(folder, "reference.safetensors"))
            prompts, firsts, greedy = [], [], []
            for p in range(100):
                if f"input_ids_{p}" not in reference:
                    break
                prompts.append(reference[f"input_ids_{p}"].tolist())
                firsts.append(reference[f"logits_{p}"][-1])
                greedy.append(reference[f"greedy_{p}"].tolist()[:args.tokens])
            server = serve(args, folder, "fp32", log)
            try:
                ours = sluice_runs(server, prompts, len(greedy[0]))
            finally:
                server.stop()
            row.append(agreement(ours, reference_runs(tokenizer, prompts, firsts, greedy)))
        # The Q4_K_M file: transformers' model made again from the file's seed.
        path = os.path.join(args.models, f"gguf_{arch}_q4_k_m", "model.gguf")
        vocab = 1 + max(tokenizer.get_vocab().values())  # As tools/gguf_models.py counts it.
        model = gguf_models.hf_model(arch, vocab, seed=101 + i).eval()
        llama = load_file(os.path.join(args.models, f"gguf_{arch}_q4_k_m",
                                       "reference.safetensors"))
        prompts, firsts, greedy, llama_delta, llama_agree = [], [], [], 0.0, 0
        with torch.no_grad():
            for p in range(100):
                if f"input_ids_{p}" not in llama:
                    break
                ids = llama[f"input_ids_{p}"].tolist()
                prompts.append(ids)
                out = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens,
                                     min_new_tokens=args.tokens, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True,
                                     pad_token_id=0)
                firsts.append(out.logits[0][0])
                greedy.append(out.sequences[0][len(ids):].tolist())
                theirs = torch.log_softmax(llama[f"logits_{p}"][-1].float(), -1).topk(5).values
                mine = torch.log_softmax(out.logits[0][0].float(), -1).topk(5).values
                llama_delta = max(llama_delta, float((theirs - mine).abs().max()))
                for a, b in zip(llama[f"greedy_{p}"].tolist(), greedy[-1]):
                    if a != b:
                        break
                    llama_agree += 1
        server = serve(args, path, None, log)
        try:
            ours = sluice_runs(server, prompts, args.tokens)
        finally:
            server.stop()
        row.append(agreement(ours, reference_runs(tokenizer, prompts, firsts, greedy)))
        row.append((llama_delta, llama_agree,
                    sum(min(len(llama[f"greedy_{p}"]), len(g)) for p, g in enumerate(greedy))))
        rows.append(row)
        print(row, flush=True)
    lines = ["| family | HF folder: max \\|Δ\\| top-5 logprob, greedy agree | HF sharded | "
             "GGUF Q4_K_M (llama.cpp's quantiser) | llama.cpp on that file |",
             "|---|---|---|---|---|"]
    for family, whole, sharded, q4, llama_delta in rows:
        cell = lambda a: f"{a[0]:.1e}, {a[1]}/{a[2]}"  # noqa: E731
        lines.append(f"| {family} | {cell(whole)} | {cell(sharded)} | {cell(q4)} | "
                     f"{cell(llama_delta)} |")
    table = "\n".join(lines)
    print(table)
    print(f"({time.time() - start:.0f} s)")
    with open(args.out, "w") as f:
        f.write(table + "\n")
    log.close()


if __name__ == "__main__":
    main()
