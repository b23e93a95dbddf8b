#!/usr/bin/env python3
"""Sluice's language-model engine against transformers' generate on the same model, in one run.

The LitServe seed's method for a small language model: transformers `generate` with a static KV
cache and `torch.compile`, and without (dynamic cache, eager). Both sides get the same model
directory (models/smollm2_hf, bf16 weights), the same number of threads, prompts of the same length
(--prompt-tokens, counted by the model's tokenizer) and the same number of greedy output tokens
(EOS ignored), at each batch size / concurrency.

  transformers  one `generate` call on a batch of B prompts (left-padded), timed after a warm-up
                call (the compile happens there); tokens/s = B x output tokens / seconds.
  Sluice        `sluice bench --llm --in-process` at concurrency B: B requests submitted at once
                to the engine; tokens/s = output tokens / (last token - submit).

Rounds alternate the order (A B, B A, ...); the table reports medians and Sluice's ratio.

Usage: benchmarks/llm_transformers_compare.py [--sluice build/sluice] [--model-dir models/smollm2_hf]
           [--batch 1,16] [--prompt-tokens 128] [--output-tokens 128] [--rounds 2]
           [--modes eager,static-compile]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import transformers

WORDS = ("the river carried light across a valley where old farmers planted wheat and barley "
         "every spring while children counted clouds over quiet stone bridges near the market "
         "town history of printing press began with metal type ink paper mills").split()


def prompts(tokenizer, count, tokens):
    """`count` distinct prompts of exactly `tokens` tokens."""
    out = []
    for i in range(count):
        words = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(tokens * 2)]
        ids = tokenizer(f"Request {i + 1}: " + " ".join(words), add_special_tokens=False)
        out.append(tokenizer.decode(ids["input_ids"][:tokens]))
    return out


def run_transformers(model, tokenizer, mode, batch, prompt_tokens, output_tokens, threads):
    torch.set_num_threads(threads)
    texts = prompts(tokenizer, batch, prompt_tokens)
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=output_tokens, min_new_tokens=output_tokens, do_sample=False,
                  pad_token_id=tokenizer.pad_token_id)
    eager_forward = model.forward
    if mode == "static-compile":
        # The seed's recipe: a static cache, and the forward pass through torch.compile
        # (compiled explicitly: generate's automatic compile is for GPUs).
        kwargs["cache_implementation"] = "static"
        model.forward = COMPILED.setdefault("forward", torch.compile(eager_forward))
    try:
        return timed_generate(model, inputs, kwargs, batch)
    finally:
        model.forward = eager_forward


COMPILED = {}


def timed_generate(model, inputs, kwargs, batch):
    with torch.inference_mode():
        started = time.perf_counter()
        model.generate(**inputs, **kwargs)  # Warm-up (compiles in static-compile mode).
        warmup = time.perf_counter() - started
        started = time.perf_counter()
        out = model.generate(**inputs, **kwargs)
        seconds = time.perf_counter() - started
    generated = (out.shape[1] - inputs["input_ids"].shape[1]) * batch
    return generated / seconds, warmup


def run_sluice(sluice, model_dir, batch, prompt_tokens, output_tokens, threads, precision="bf16"):
    """Sluice's output tokens/s; `precision` None serves a GGUF file's quantised weights as they
    are (its float tensors in bf16)."""
    repository, name = os.path.split(os.path.abspath(model_dir))
    cmd = [sluice, "bench", "--llm", "--in-process", "--model-repository", repository,
           "--model", name, "--threads", str(threads), "--concurrency", str(batch),
           "--prompt-tokens", str(prompt_tokens), "--output-tokens", str(output_tokens)]
    if precision:
        cmd += ["--precision", precision]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([\d.]+) output tokens/s overall", out).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2_hf")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="eager,static-compile")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                              dtype=torch.bfloat16)
    model.eval()
    model.generation_config.eos_token_id = None  # Fixed output lengths, as ignore_eos.
    modes = args.modes.split(",")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} threads, {args.prompt_tokens}-token prompts, "
          f"{args.output_tokens} output tokens, greedy, bf16 weights", flush=True)
    results = {}
    for batch in [int(b) for b in args.batch.split(",")]:
        for r in range(args.rounds):
            order = ["sluice"] + modes if r % 2 == 0 else modes[::-1] + ["sluice"]
            for variant in order:
                if variant == "sluice":
                    value = run_sluice(args.sluice, args.model_dir, batch, args.prompt_tokens,
                                       args.output_tokens, args.threads)
                    note = ""
                else:
                    value, warmup = run_transformers(model, tokenizer, variant, batch,
                                                     args.prompt_tokens, args.output_tokens,
                                                     args.threads)
                    note = f" (warm-up call {warmup:.1f} s)"
                results.setdefault((batch, variant), []).append(value)
                print(f"batch {batch} round {r + 1}: {variant} {value:.1f} tokens/s{note}",
                      flush=True)
    print("\n| batch | " + " | ".join(["sluice"] + modes) + " | sluice / best transformers |")
    print("|---" * (len(modes) + 3) + "|")
    for batch in sorted({b for b, _ in results}):
        medians = {v: statistics.median(results[(batch, v)]) for v in ["sluice"] + modes}
        best = max(medians[m] for m in modes)
        cells = " | ".join(f"{medians[v]:.1f}" for v in ["sluice"] + modes)
        print(f"| {batch} | {cells} | {medians['sluice'] / best:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
